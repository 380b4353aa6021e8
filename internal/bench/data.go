package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// dataBytes is the size of the blob the data part moves.
const dataBytes = 1 << 30

// data pushes a 1 GiB blob to the server and reads it back as a worker
// does, and reports both rates and the server's resident memory above
// idle meanwhile (docs/DATA.md: a blob is never held whole).
func (b *bench) data(ctx context.Context) error {
	pid := b.server.cmd.Process.Pid
	idle, err := rssKiB(pid)
	if err != nil {
		return err
	}
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if kib, err := rssKiB(pid); err == nil && kib > peak.Load() {
				peak.Store(kib)
			}
		}
	}()
	defer func() { close(stop); <-sampled }()

	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(newStream(7), dataBytes)); err != nil {
		return err
	}
	id := "sha256:" + hex.EncodeToString(h.Sum(nil))
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, b.url+"/api/v1/blobs/"+id+"?name=bench.bin", io.LimitReader(newStream(7), dataBytes))
	if err != nil {
		return err
	}
	req.ContentLength = dataBytes
	req.Header.Set("Authorization", "Bearer "+b.ownerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("push: %s %s", resp.Status, body)
	}
	up := time.Since(start)

	start = time.Now()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/api/v1/blobs/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+b.ownerToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	h.Reset()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	down := time.Since(start)
	if err != nil || n != dataBytes || "sha256:"+hex.EncodeToString(h.Sum(nil)) != id {
		return fmt.Errorf("read back %d bytes (%v), not the blob", n, err)
	}
	mib := float64(dataBytes) / (1 << 20)
	b.printf("blob_upload_mib_per_s: %.0f (1 GiB into the database, chunked)", mib/up.Seconds())
	b.printf("blob_download_mib_per_s: %.0f (1 GiB out of the database over loopback, as a worker reads it)", mib/down.Seconds())
	b.printf("transfer_server_peak_mib: %.1f above idle (%.1f MiB)", float64(peak.Load()-idle)/1024, float64(idle)/1024)
	// The output part's peak counts from when its module is pushed (the
	// server compiles it to check it) and its worker connected.
	var outIdle int64
	err = b.outputUpload(ctx, func() {
		outIdle, _ = rssKiB(pid)
		peak.Store(outIdle)
	})
	if err != nil {
		b.printf("output_upload_mib_per_s: error: %v", err)
		return nil
	}
	b.printf("output_server_peak_mib: %.1f above the part's start (%.1f MiB)", float64(peak.Load()-outIdle)/1024, float64(outIdle)/1024)
	return nil
}

// outputUpload runs a task that writes a 1 GiB output, which its worker
// uploads over HTTP, and reports the rate the server received uploads at
// (its metrics: bytes stored over the time spent receiving them). It
// calls started once the task's module is pushed and its worker is
// connected.
func (b *bench) outputUpload(ctx context.Context, started func()) error {
	mod, err := b.pushTask(ctx, "outfill")
	if err != nil {
		return err
	}
	var connected int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM workers WHERE connected`).Scan(&connected); err != nil {
		return err
	}
	w, err := b.startWorkerArgs("output-worker", "--slots", "1")
	if err != nil {
		return err
	}
	defer w.stop()
	if err := b.waitWorkers(ctx, connected+1); err != nil {
		return err
	}
	wf, _ := json.Marshal(map[string]any{"name": "output", "tasks": []map[string]any{{"name": "big", "module": mod.ID,
		"args": []string{"bytes", strconv.Itoa(dataBytes)}, "limits": map[string]any{"output_mib": dataBytes >> 20}}}})
	started()
	bytes0, secs0, err := b.uploadMetrics(ctx)
	if err != nil {
		return err
	}
	s, err := b.client.Submit(ctx, wf)
	if err != nil {
		return err
	}
	var st *client.Status
	for deadline := time.Now().Add(10 * time.Minute); ; {
		if st, err = b.client.StatusWhenFinished(ctx, s.ID, time.Minute); err != nil {
			return err
		}
		if st.State != "running" || time.Now().After(deadline) {
			break
		}
	}
	if st.State != "done" {
		return fmt.Errorf("the 1 GiB output task ended %s", st.State)
	}
	bytes1, secs1, err := b.uploadMetrics(ctx)
	if err != nil {
		return err
	}
	if bytes1-bytes0 < dataBytes || secs1 <= secs0 {
		return fmt.Errorf("the server stored %.0f bytes of uploaded outputs, not the 1 GiB output", bytes1-bytes0)
	}
	b.printf("output_upload_mib_per_s: %.0f (a task's 1 GiB output, uploaded by its headless worker into the database)",
		(bytes1-bytes0)/(1<<20)/(secs1-secs0))
	return nil
}

// uploadMetrics reads the server's output upload counters.
func (b *bench) uploadMetrics(ctx context.Context) (bytes, seconds float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch name {
		case "cyclepool_output_upload_bytes_total":
			bytes, err = strconv.ParseFloat(v, 64)
		case "cyclepool_output_upload_seconds_total":
			seconds, err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return bytes, seconds, sc.Err()
}

// stream is an endless stream of pseudo-random bytes (data that does not
// compress, as most data files).
type stream struct{ r *rand.PCG }

func newStream(seed uint64) io.Reader { return stream{rand.NewPCG(seed, 3)} }

func (s stream) Read(p []byte) (int, error) {
	i := 0
	for ; i+8 <= len(p); i += 8 {
		v := s.r.Uint64()
		p[i], p[i+1], p[i+2], p[i+3], p[i+4], p[i+5], p[i+6], p[i+7] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(p); i++ {
		p[i] = byte(s.r.Uint64())
	}
	return len(p), nil
}
