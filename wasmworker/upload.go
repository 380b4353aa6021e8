package wasmworker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// uploadOutputs uploads the large outputs of a successful outcome over
// HTTP (docs/PROTOCOL.md, "Outputs over HTTP"): its files (Outcome.Files)
// and the outputs in memory of protocol.UploadMinBytes or more, or that
// would take those kept past protocol.InlineOutputBudget. Their
// names move to Uploaded; the rest stay in the result frame. A refusal
// for the output limit fails the attempt with limit_output; any other
// failure ends it as the worker's (it is run again, charged to no one).
// Files are removed in any case.
func (w *Worker) uploadOutputs(ctx context.Context, server string, attempt int64, out *Outcome) *Outcome {
	defer func() {
		for _, f := range out.Files {
			_ = os.Remove(f.Path)
		}
	}()
	if out.Reason != "" {
		return out
	}
	w.mu.Lock()
	key, worker := w.uploadKey, w.id
	if w.stats.Server != "" {
		// The replica connected to now: the one that assigned the
		// attempt may have gone since (every replica takes the key).
		server = w.stats.Server
	}
	w.mu.Unlock()
	type item struct {
		name string
		data []byte // or
		path string
		size int64
	}
	var items []item
	for _, f := range out.Files {
		items = append(items, item{name: f.Name, path: f.Path, size: f.Size})
	}
	kept := out.Outputs[:0:0]
	inline := 0
	for _, o := range out.Outputs {
		if key != "" && (len(o.Data) >= protocol.UploadMinBytes || inline+len(o.Data) > protocol.InlineOutputBudget) {
			items = append(items, item{name: o.Name, data: o.Data, size: int64(len(o.Data))})
		} else {
			kept = append(kept, o)
			inline += len(o.Data)
		}
	}
	if len(items) == 0 {
		return out
	}
	if key == "" {
		return &Outcome{Reason: protocol.ReasonWorker, Message: "outputs left to upload, but the server gave no upload key", Log: out.Log, Duration: out.Duration}
	}
	var uploaded []protocol.Uploaded
	for _, it := range items {
		open := func() (io.Reader, error) {
			if it.path == "" {
				return bytes.NewReader(it.data), nil
			}
			return os.Open(it.path)
		}
		u, err := w.uploadOutput(ctx, server, worker, key, attempt, it.name, it.size, open)
		if err != nil {
			reason := protocol.ReasonWorker
			var le *uploadLimitError
			if errors.As(err, &le) {
				reason = protocol.ReasonOutput
			}
			return &Outcome{Reason: reason, Message: fmt.Sprintf("uploading output %q: %v", it.name, err), Log: out.Log, Duration: out.Duration}
		}
		uploaded = append(uploaded, u)
	}
	slices.SortFunc(uploaded, func(a, b protocol.Uploaded) int { return strings.Compare(a.Name, b.Name) })
	res := *out
	res.Outputs, res.Uploaded, res.Files = kept, uploaded, nil
	return &res
}

// uploadLimitError is the server's refusal of an upload past the task's
// output limit.
type uploadLimitError struct{ msg string }

func (e *uploadLimitError) Error() string { return e.msg }

// uploadOutput uploads one output, trying again on errors that may pass
// (the connection, the server's 5xx and 429) for about a minute.
func (w *Worker) uploadOutput(ctx context.Context, server, worker, key string, attempt int64, name string, size int64,
	open func() (io.Reader, error)) (protocol.Uploaded, error) {
	u := strings.TrimSuffix(server, "/") + "/outputs/" + strconv.FormatInt(attempt, 10) +
		"?name=" + url.QueryEscape(name) + "&w=" + url.QueryEscape(worker) + "&k=" + url.QueryEscape(key)
	return w.upload(ctx, u, attempt, name, size, open)
}

// uploadCheckpoint uploads the state of a checkpoint of attempt.
func (w *Worker) uploadCheckpoint(ctx context.Context, attempt int64, state []byte) (protocol.Uploaded, error) {
	w.mu.Lock()
	key, worker, server := w.uploadKey, w.id, w.stats.Server
	w.mu.Unlock()
	if key == "" || server == "" {
		return protocol.Uploaded{}, errors.New("not connected to a server that takes uploads")
	}
	u := strings.TrimSuffix(server, "/") + "/checkpoints/" + strconv.FormatInt(attempt, 10) +
		"?w=" + url.QueryEscape(worker) + "&k=" + url.QueryEscape(key)
	return w.upload(ctx, u, attempt, "checkpoint", int64(len(state)), func() (io.Reader, error) { return bytes.NewReader(state), nil })
}

// fetchCheckpoint downloads the checkpoint an assignment restores from
// (Assign.RestoreFrom) and checks it against its hash.
func fetchCheckpoint(ctx context.Context, server string, f *protocol.File) ([]byte, error) {
	b, err := getBytes(ctx, strings.TrimSuffix(server, "/")+f.URL, f.Size)
	if err != nil {
		return nil, fmt.Errorf("fetch the checkpoint to restore: %w", err)
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != f.Blob {
		return nil, fmt.Errorf("the checkpoint to restore arrived as %s, not %s", got, f.Blob)
	}
	return b, nil
}

// upload PUTs size bytes from open to u, as uploadOutput says.
func (w *Worker) upload(ctx context.Context, u string, attempt int64, name string, size int64,
	open func() (io.Reader, error)) (protocol.Uploaded, error) {
	wait := 500 * time.Millisecond
	var last error
	for try := 0; try < 8; try++ {
		if try > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return protocol.Uploaded{}, ctx.Err()
			}
			wait = min(2*wait, 15*time.Second)
		}
		body, err := open()
		if err != nil {
			return protocol.Uploaded{}, err
		}
		got, retry, err := putOutput(ctx, u, body, size)
		if err == nil && (got.Blob == "" || got.Size != size) {
			err = fmt.Errorf("the server acknowledged %d bytes as %q, not the %d sent", got.Size, got.Blob, size)
		}
		if c, ok := body.(io.Closer); ok {
			c.Close()
		}
		if err == nil {
			got.Name = name
			return got, nil
		}
		if !retry || ctx.Err() != nil {
			return protocol.Uploaded{}, err
		}
		last = err
		w.log.Warn("output upload failed; trying again", "attempt", attempt, "output", name, "err", err)
	}
	return protocol.Uploaded{}, last
}

// uploadError is the error of an upload the server answered with status
// and body msg; it reports whether the failure may pass.
func uploadError(status int, statusText string, msg []byte) (retry bool, err error) {
	var e struct {
		Error string `json:"error"`
	}
	text := strings.TrimSpace(string(msg))
	if json.Unmarshal(msg, &e) == nil && e.Error != "" {
		text = e.Error
	}
	switch {
	case status == 413:
		return false, &uploadLimitError{text}
	case status == 429 || status >= 500:
		return true, fmt.Errorf("%s: %s", statusText, text)
	}
	return false, fmt.Errorf("%s: %s", statusText, text)
}
