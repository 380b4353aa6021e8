package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
)

// A worker uploads an output of an attempt it holds over HTTP, and its
// result names the blob: the task is done with that output, streamed back
// to the owner. Every other upload is refused with nothing stored: no key
// or another worker's key, an attempt the worker does not hold, a name a
// workflow could not name, a replicated task, past the task's output
// limit (announced or streamed). A result naming a blob its attempt did
// not upload (a lying worker that read an id somewhere) is refused, and
// its task runs again.
func TestOutputUploads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	db, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	other, err := f.st.RegisterWorker(ctx, store.WorkerHello{Kind: "headless", Slots: 1}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 8 << 20
	task := func(name string) store.NewTask {
		return store.NewTask{Name: name, Module: f.module, MaxAttempts: 3, TimeoutMS: 60000, MemoryPages: 16, OutputBytes: limit, LogBytes: 1 << 10}
	}
	if _, err := f.st.CreateWorkflow(ctx, f.owner.ID, &store.NewWorkflow{Name: "up", Priority: "batch",
		Tasks: []store.NewTask{task("a"), task("b")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.CreateWorkflow(ctx, f.owner.ID, &store.NewWorkflow{Name: "rep", Priority: "batch", Replicas: 2, Quorum: 2, MaxReplicas: 3,
		Tasks: []store.NewTask{task("r")}}); err != nil {
		t.Fatal(err)
	}
	cands, _, err := f.st.Candidates(ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	var picks []store.Pick
	for _, c := range cands {
		picks = append(picks, store.Pick{TaskID: c.TaskID, Worker: f.worker.ID})
	}
	claimed, err := f.st.ClaimPicks(ctx, picks, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	attempts := map[string]store.Claimed{}
	for _, c := range claimed {
		attempts[c.Name] = c
	}
	if len(attempts) != 3 {
		t.Fatalf("claimed %+v, want a, b and r", claimed)
	}
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	key, err := s.uploadKey(ctx, f.worker.ID)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := s.uploadKey(ctx, other.ID)
	if err != nil {
		t.Fatal(err)
	}
	put := func(t *testing.T, attempt int64, name, worker, k string, body io.Reader, size int64) (int, string) {
		t.Helper()
		path := fmt.Sprintf("/outputs/%d?name=%s&w=%s&k=%s", attempt, url.QueryEscape(name), url.QueryEscape(worker), url.QueryEscape(k))
		if body == nil {
			// Only the headers, announcing size bytes: the server answers
			// before any arrive.
			conn, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", path, size)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		return putURL(t, ts.URL+path, body, size)
	}
	counts := func() string {
		t.Helper()
		var blobs, chunks, uploads, outs int
		if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM blobs), (SELECT count(*) FROM blob_chunks),
			(SELECT count(*) FROM blob_uploads), (SELECT count(*) FROM output_uploads)`).Scan(&blobs, &chunks, &uploads, &outs); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("blobs %d, chunks %d, uploads %d, output uploads %d", blobs, chunks, uploads, outs)
	}
	// waitNothing waits until nothing of the uploads is stored.
	waitNothing := func(t *testing.T, when string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			got := counts()
			if got == "blobs 0, chunks 0, uploads 0, output uploads 0" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: stored %s, want nothing", when, got)
			}
		}
	}
	a, b, r := attempts["a"].Attempt, attempts["b"].Attempt, attempts["r"].Attempt
	data := randomBytes(3<<20+17, 7)
	for _, tc := range []struct {
		name    string
		attempt int64
		output  string
		worker  string
		key     string
		body    io.Reader
		size    int64
		status  int
		says    string
	}{
		{"no key", a, "big", f.worker.ID, "", bytes.NewReader(data), int64(len(data)), http.StatusForbidden, "no upload key"},
		{"another worker's key", a, "big", f.worker.ID, otherKey, bytes.NewReader(data), int64(len(data)), http.StatusForbidden, "no upload key"},
		{"attempt not held", a, "big", other.ID, otherKey, bytes.NewReader(data), int64(len(data)), http.StatusConflict, "not running on this worker"},
		{"bad name", a, "../x", f.worker.ID, key, bytes.NewReader(data), int64(len(data)), http.StatusBadRequest, "clean relative path"},
		{"replicated", r, "big", f.worker.ID, key, bytes.NewReader(data), int64(len(data)), http.StatusConflict, "replicated"},
		{"announced over the limit", a, "big", f.worker.ID, key, nil, limit + 1, http.StatusRequestEntityTooLarge, "output limit of 8388608 bytes"},
		{"streamed over the limit", a, "big", f.worker.ID, key, io.LimitReader(newPCGReader(1), limit+1), -1, http.StatusRequestEntityTooLarge, "output limit of 8388608 bytes"},
		{"cut short", a, "big", f.worker.ID, key, bytes.NewReader(data[:100]), int64(len(data)), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.status == 0 {
				// The client lies about its length: the transport refuses.
				req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/outputs/%d?name=big&w=%s&k=%s", ts.URL, tc.attempt, tc.worker, tc.key), tc.body)
				req.ContentLength = tc.size
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						t.Fatalf("a cut-off upload was stored")
					}
				}
			} else if status, body := put(t, tc.attempt, tc.output, tc.worker, tc.key, tc.body, tc.size); status != tc.status || !strings.Contains(body, tc.says) {
				t.Fatalf("answered %d %s, want %d saying %q", status, body, tc.status, tc.says)
			}
			// An upload cut off is cleaned up as the server notices.
			waitNothing(t, "after the refusal")
		})
	}

	// A flood: past MaxWorkerUploads at once, the worker is told to wait,
	// and the uploads cut off leave nothing.
	var pipes []*io.PipeWriter
	done := make(chan int, MaxWorkerUploads)
	for i := range MaxWorkerUploads {
		pr, pw := io.Pipe()
		pipes = append(pipes, pw)
		go func() {
			req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/outputs/%d?name=f%d&w=%s&k=%s", ts.URL, a, i, f.worker.ID, key), pr)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				done <- resp.StatusCode
				return
			}
			done <- 0
		}()
		if _, err := pw.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	// Uploads of outputs are not the owner's own: the owner may still push.
	own, err := f.st.BeginBlobUpload(ctx, f.owner.ID, 1<<30, 1)
	if err != nil {
		t.Fatalf("the owner's push while workers upload outputs: %v", err)
	}
	own.Abort(ctx)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if status, body := put(t, a, "one-more", f.worker.ID, key, strings.NewReader("x"), 1); status == http.StatusTooManyRequests {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("upload past %d at once answered %d %s, want 429", MaxWorkerUploads, status, body)
		}
		// Stored meanwhile (the flood had not all begun): out of the way.
		if _, err := db.Exec(ctx, `DELETE FROM output_uploads WHERE name = 'one-more'`); err != nil {
			t.Fatal(err)
		}
	}
	for _, pw := range pipes {
		pw.CloseWithError(io.ErrUnexpectedEOF)
	}
	for range MaxWorkerUploads {
		if code := <-done; code == http.StatusOK {
			t.Fatal("an upload cut off was stored")
		}
	}
	if _, err := f.st.CollectBlobGarbage(ctx); err != nil {
		t.Fatal(err)
	}
	waitNothing(t, "after the flood")

	// An output uploaded again replaces the first: its bytes go at once.
	// The flood's clients gave up as soon as their bodies broke, before the
	// server's handlers noticed and let go of their places: until they
	// have, the upload is told to try again (429), as a worker would.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		status, body := put(t, a, "big", f.worker.ID, key, bytes.NewReader(data[:2<<20]), 2<<20)
		if status == http.StatusOK {
			break
		}
		if status != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("upload answered %d %s", status, body)
		}
	}
	status, body := put(t, a, "big", f.worker.ID, key, bytes.NewReader(data), int64(len(data)))
	if status != http.StatusOK {
		t.Fatalf("upload answered %d %s", status, body)
	}
	if got := counts(); got != "blobs 1, chunks 4, uploads 0, output uploads 1" {
		t.Fatalf("after uploading an output again: %s, want only the second", got)
	}
	// b uploads too, then fails: its upload goes with the next collection.
	if status, body := put(t, b, "gone", f.worker.ID, key, bytes.NewReader(data[:1<<20]), 1<<20); status != http.StatusOK {
		t.Fatalf("upload answered %d %s", status, body)
	}
	var up protocol.Uploaded
	if err := json.Unmarshal([]byte(body), &up); err != nil || up.Blob != blobID(data) || up.Size != int64(len(data)) {
		t.Fatalf("upload answered %s (%v), want blob %s of %d bytes", body, err, blobID(data), len(data))
	}

	// A checkpoint uploaded over HTTP: within the task's memory (1 MiB
	// here), and saved only when the frame names what its attempt
	// uploaded as its checkpoint.
	ckptURL := fmt.Sprintf("%s/checkpoints/%d?w=%s&k=%s", ts.URL, a, f.worker.ID, key)
	putRaw := func(u string, body []byte) (int, string) {
		return putURL(t, u, bytes.NewReader(body), int64(len(body)))
	}
	if status, body := putRaw(ckptURL, data[:2<<20]); status != http.StatusRequestEntityTooLarge || !strings.Contains(body, "memory limit") {
		t.Fatalf("a checkpoint over the task's memory: %d %s", status, body)
	}
	status, body = putRaw(ckptURL, data[:512<<10])
	var ck protocol.Uploaded
	if status != http.StatusOK || json.Unmarshal([]byte(body), &ck) != nil {
		t.Fatalf("a checkpoint upload answered %d %s", status, body)
	}
	var refused *store.RefusedError
	if _, err := f.st.SaveCheckpointBlob(ctx, a, f.worker.ID, up.Blob, time.Minute); !errors.As(err, &refused) {
		t.Fatalf("a checkpoint naming an output's blob: %v, want refused", err)
	}
	if ok, err := f.st.SaveCheckpointBlob(ctx, a, f.worker.ID, ck.Blob, time.Minute); !ok || err != nil {
		t.Fatalf("the checkpoint the attempt uploaded: saved %v, %v", ok, err)
	}

	c := socketless(s, f.worker.ID, 3)
	if _, ok := s.hub.started(c, []protocol.Assign{{Attempt: a, Module: f.module}, {Attempt: b, Module: f.module}}, []int64{0, 0}); !ok {
		t.Fatal("started refused")
	}
	result := func(attempt int64, uploaded ...protocol.Uploaded) {
		t.Helper()
		if err := s.handleFrame(ctx, c, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{Attempt: attempt,
			Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("small\n")}}, Uploaded: uploaded}}}); err != nil {
			t.Fatal(err)
		}
		s.flushCompletions(ctx, <-s.completions.in)
	}
	result(a, protocol.Uploaded{Name: "big", Blob: up.Blob, Size: up.Size})
	// b names the blob a uploaded: refused.
	result(b, protocol.Uploaded{Name: "big", Blob: up.Blob, Size: up.Size})

	wst, err := f.st.Status(ctx, f.owner.ID, attempts["a"].WorkflowID)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, ts := range wst.Tasks {
		states[ts.Name] = ts.State
		if ts.Name == "a" {
			sizes := map[string]int{}
			for _, o := range ts.Outputs {
				sizes[o.Name] = o.Size
			}
			if sizes["big"] != len(data) || sizes["stdout"] != 6 {
				t.Errorf("a's outputs %+v, want big of %d bytes and stdout of 6", ts.Outputs, len(data))
			}
		}
	}
	if states["a"] != "done" || states["b"] != "ready" {
		t.Fatalf("states %v, want a done and b ready again (its result refused)", states)
	}
	as, err := f.st.Attempts(ctx, f.owner.ID, attempts["b"].WorkflowID, "b")
	if err != nil || len(as) != 1 || !strings.Contains(as[0].Reason, "did not upload") {
		t.Fatalf("b's attempts %+v (%v), want one refused for naming a blob it did not upload", as, err)
	}

	// The owner reads the output back, whole and by range, and is told to
	// ask again each time: a re-check may replace a task's outputs.
	get := func(rng string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/api/v1/workflows/"+attempts["a"].WorkflowID+"/tasks/a/outputs/big", nil)
		req.Header.Set("Authorization", "Bearer "+f.token)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if cc := resp.Header.Get("Cache-Control"); cc != outputCache {
			t.Errorf("output read back with Cache-Control %q, want %q", cc, outputCache)
		}
		return resp.StatusCode, got
	}
	if code, got := get(""); code != http.StatusOK || !bytes.Equal(got, data) {
		t.Errorf("output read back: %d, %d bytes, equal %v", code, len(got), bytes.Equal(got, data))
	}
	if code, got := get("bytes=1048570-1048579"); code != http.StatusPartialContent || !bytes.Equal(got, data[1048570:1048580]) {
		t.Errorf("range of the output: %d %q", code, got)
	}

	// Once the attempts are over, collection keeps the output's blob (a
	// task output) and drops the upload records, and b's blob.
	if n, err := f.st.CollectOutputUploads(ctx); err != nil || n != 3 {
		t.Fatalf("collected %d uploads (%v), want a's output and checkpoint and b's output", n, err)
	}
	if _, err := f.st.CollectBlobGarbage(ctx); err != nil {
		t.Fatal(err)
	}
	if got := counts(); got != "blobs 1, chunks 4, uploads 0, output uploads 0" { // the output (a done task keeps no checkpoint)
		t.Errorf("after garbage collection: %s, want the output's blob kept and no upload records", got)
	}
}

// putURL PUTs size bytes of body to u and returns the answer's status and
// body.
func putURL(t *testing.T, u string, body io.Reader, size int64) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// An output kept in the database (sent in its result's frame, not
// uploaded) answers ranges as an uploaded one does: 206 with its
// Content-Range, 416 past its end, and the id its bytes would have as a
// blob as its ETag, which If-Range and If-None-Match compare. Before, it
// came whole with 200 whatever the Range. The dashboard, which previews an
// output by a range of its first bytes, shows both, the empty one too.
func TestOutputsInDatabaseAnswerRanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	wf := f.oneTask()
	wf.Tasks = append(wf.Tasks, store.NewTask{Name: "empty", Module: f.module, MaxAttempts: 1, TimeoutMS: 1000, MemoryPages: 16, OutputBytes: 1 << 20, LogBytes: 1 << 10})
	id, err := f.st.CreateWorkflow(ctx, f.owner.ID, wf)
	if err != nil {
		t.Fatal(err)
	}
	cands, _, err := f.st.Candidates(ctx, 10, nil)
	if err != nil || len(cands) != 2 {
		t.Fatalf("candidates %+v (%v), want t and empty", cands, err)
	}
	picks := []store.Pick{{TaskID: cands[0].TaskID, Worker: f.worker.ID}, {TaskID: cands[1].TaskID, Worker: f.worker.ID}}
	claimed, err := f.st.ClaimPicks(ctx, picks, time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claimed %+v (%v), want both", claimed, err)
	}
	data := make([]byte, 1000)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	var cs []store.Completion
	for _, c := range claimed {
		out := data
		if c.Name == "empty" {
			out = nil
		}
		cs = append(cs, store.Completion{Attempt: c.Attempt, Worker: f.worker.ID, OK: true, Duration: time.Millisecond,
			Outputs: []store.Output{{Name: "stdout", Data: out}}})
	}
	if acc, err := f.st.Complete(ctx, cs); err != nil || !acc[0] || !acc[1] {
		t.Fatalf("complete: %v, %v", acc, err)
	}
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	etag := `"` + blobID(data) + `"`
	get := func(t *testing.T, task string, hdr ...string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/api/v1/workflows/"+id+"/tasks/"+task+"/outputs/stdout", nil)
		req.Header.Set("Authorization", "Bearer "+f.token)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp, got
	}
	for _, tc := range []struct {
		name      string
		hdr       []string
		status    int
		body      []byte
		contRange string
	}{
		{"whole", nil, http.StatusOK, data, ""},
		{"range", []string{"Range", "bytes=10-19"}, http.StatusPartialContent, data[10:20], "bytes 10-19/1000"},
		{"open range", []string{"Range", "bytes=990-"}, http.StatusPartialContent, data[990:], "bytes 990-999/1000"},
		{"suffix", []string{"Range", "bytes=-5"}, http.StatusPartialContent, data[995:], "bytes 995-999/1000"},
		{"past the end", []string{"Range", "bytes=1000-"}, http.StatusRequestedRangeNotSatisfiable, nil, "bytes */1000"},
		{"if-range matching", []string{"Range", "bytes=0-3", "If-Range", etag}, http.StatusPartialContent, data[:4], "bytes 0-3/1000"},
		{"if-range changed", []string{"Range", "bytes=0-3", "If-Range", `"sha256:other"`}, http.StatusOK, data, ""},
		{"if-none-match", []string{"If-None-Match", etag}, http.StatusNotModified, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, got := get(t, "t", tc.hdr...)
			if resp.StatusCode != tc.status || tc.body != nil && !bytes.Equal(got, tc.body) || resp.Header.Get("Content-Range") != tc.contRange {
				t.Errorf("answered %d, Content-Range %q, %d bytes %.20q; want %d, %q, %.20q",
					resp.StatusCode, resp.Header.Get("Content-Range"), len(got), got, tc.status, tc.contRange, tc.body)
			}
			if resp.StatusCode < 300 && (resp.Header.Get("ETag") != etag || resp.Header.Get("Accept-Ranges") != "bytes" ||
				resp.Header.Get("Cache-Control") != outputCache) {
				t.Errorf("ETag %q, Accept-Ranges %q, Cache-Control %q; want %s, bytes and %q", resp.Header.Get("ETag"),
					resp.Header.Get("Accept-Ranges"), resp.Header.Get("Cache-Control"), etag, outputCache)
			}
		})
	}
	if resp, got := get(t, "empty"); resp.StatusCode != http.StatusOK || len(got) != 0 {
		t.Errorf("the empty output: %d, %d bytes; want 200 and nothing", resp.StatusCode, len(got))
	}

	// The dashboard's preview reads the first bytes of an output.
	cookie, _ := dashSignIn(t, ts.URL, f.token, "/app/")
	for task, want := range map[string]string{"t": string(data[:26]), "empty": "stdout"} {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/app/workflows/"+id+"/tasks/"+task+"/preview/stdout", nil)
		req.AddCookie(cookie)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), want) {
			t.Errorf("preview of %s's stdout: %d, want 200 showing %q:\n%.2000s", task, resp.StatusCode, want, page)
		}
	}
}
