package server

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/internal/store"
)

// blobServer is a Server on a fresh database with two owners.
type blobServer struct {
	srv        *Server
	url        string
	alice, bob string // owner tokens
	db         *pgx.Conn
}

func newBlobServer(t *testing.T, cfg Config) *blobServer {
	t.Helper()
	ctx := context.Background()
	st, url, alice := openStore(t)
	bob, err := st.CreateOwner(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv := New(st, cfg)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { srv.Close() })
	t.Cleanup(ts.Close)
	return &blobServer{srv: srv, url: ts.URL, alice: alice, bob: bob, db: db}
}

func blobID(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// do sends a request with an owner's token and returns the status and body.
func (b *blobServer) do(t *testing.T, method, path, token string, body io.Reader, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, got, resp.Header
}

// stored counts what the database holds of blobs: blobs, chunks, uploads
// in progress and ownerships.
func (b *blobServer) stored(t *testing.T) [4]int {
	t.Helper()
	var n [4]int
	if err := b.db.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM blobs), (SELECT count(*) FROM blob_chunks),
		(SELECT count(*) FROM blob_uploads), (SELECT count(*) FROM owner_blobs)`).Scan(&n[0], &n[1], &n[2], &n[3]); err != nil {
		t.Fatal(err)
	}
	return n
}

// pcgReader is an endless stream of pseudo-random bytes.
type pcgReader struct{ r *rand.PCG }

func newPCGReader(seed uint64) io.Reader { return pcgReader{rand.NewPCG(seed, 2)} }

func (p pcgReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(p.r.Uint64())
	}
	return len(b), nil
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// A blob is pushed once and read back whole and by ranges by its owner;
// another owner cannot tell it exists; the same bytes pushed by another
// owner are stored once.
func TestBlobPushAndRead(t *testing.T) {
	t.Parallel()
	b := newBlobServer(t, Config{})
	data := randomBytes(2*1<<20+12345, 1) // three chunks, the last one short
	id := blobID(data)

	if st, body, _ := b.do(t, "HEAD", "/api/v1/blobs/"+id, b.alice, nil); st != 404 {
		t.Fatalf("HEAD before the push: %d %s, want 404", st, body)
	}
	st, body, _ := b.do(t, "PUT", "/api/v1/blobs/"+id+"?name=genome.fa", b.alice, bytes.NewReader(data))
	if st != http.StatusCreated {
		t.Fatalf("push: %d %s, want 201", st, body)
	}
	var got struct {
		ID   string `json:"id"`
		Name string `json:"name"`
		Size int64  `json:"size"`
	}
	if err := json.Unmarshal(body, &got); err != nil || got.ID != id || got.Name != "genome.fa" || got.Size != int64(len(data)) {
		t.Fatalf("push answered %s (%v), want id %s, name genome.fa, size %d", body, err, id, len(data))
	}
	if n := b.stored(t); n != [4]int{1, 3, 0, 1} {
		t.Fatalf("stored blobs, chunks, uploads, ownerships = %v, want [1 3 0 1]", n)
	}
	if st, _, _ := b.do(t, "PUT", "/api/v1/blobs/"+id+"?name=again", b.alice, bytes.NewReader(data)); st != http.StatusOK {
		t.Fatalf("second push of the same bytes: %d, want 200", st)
	}
	if st, _, h := b.do(t, "HEAD", "/api/v1/blobs/"+id, b.alice, nil); st != 200 || h.Get("Content-Length") != fmt.Sprint(len(data)) {
		t.Fatalf("HEAD: %d, length %s, want 200 and %d", st, h.Get("Content-Length"), len(data))
	}
	st, whole, _ := b.do(t, "GET", "/api/v1/blobs/"+id, b.alice, nil)
	if st != 200 || !bytes.Equal(whole, data) {
		t.Fatalf("GET: %d, %d bytes, want 200 and the %d pushed", st, len(whole), len(data))
	}
	// A range across a chunk boundary.
	from, to := (1<<20)-10, (1<<20)+20
	st, part, _ := b.do(t, "GET", "/api/v1/blobs/"+id, b.alice, nil, "Range", fmt.Sprintf("bytes=%d-%d", from, to))
	if st != http.StatusPartialContent || !bytes.Equal(part, data[from:to+1]) {
		t.Fatalf("GET a range: %d, %d bytes, want 206 and bytes %d-%d", st, len(part), from, to)
	}
	_, list, _ := b.do(t, "GET", "/api/v1/blobs", b.alice, nil)
	if !strings.Contains(string(list), `"name":"again"`) {
		t.Errorf("list %s: want the blob under its latest name", list)
	}

	// Bob: the same answers as for a blob that does not exist.
	absent := blobID([]byte("nothing"))
	for _, method := range []string{"HEAD", "GET", "DELETE"} {
		st1, b1, _ := b.do(t, method, "/api/v1/blobs/"+id, b.bob, nil)
		st2, b2, _ := b.do(t, method, "/api/v1/blobs/"+absent, b.bob, nil)
		if st1 != 404 || st2 != 404 || strings.ReplaceAll(string(b1), id, "X") != strings.ReplaceAll(string(b2), absent, "X") {
			t.Errorf("%s of alice's blob by bob: %d %q; of an absent one: %d %q; want the same 404", method, st1, b1, st2, b2)
		}
	}
	if st, _, _ := b.do(t, "PUT", "/api/v1/blobs/"+id+"?name=mine", b.bob, bytes.NewReader(data)); st != http.StatusCreated {
		t.Fatalf("bob pushes the same bytes: %d, want 201", st)
	}
	if n := b.stored(t); n != [4]int{1, 3, 0, 2} {
		t.Fatalf("after bob's push: blobs, chunks, uploads, ownerships = %v, want [1 3 0 2]: the bytes once", n)
	}

	// Workers read it with the capability only.
	tok, err := b.srv.blobToken(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st, got, _ := b.do(t, "GET", "/blobs/"+id+"?k="+tok, "", nil); st != 200 || !bytes.Equal(got, data) {
		t.Fatalf("worker download: %d, %d bytes", st, len(got))
	}
	for _, k := range []string{"", strings.Repeat("0", len(tok)), tok[:10]} {
		if st, _, _ := b.do(t, "GET", "/blobs/"+id+"?k="+k, "", nil); st != 404 {
			t.Errorf("worker download with capability %q: %d, want 404", k, st)
		}
	}

	// Removed by both, it is garbage.
	for _, tok := range []string{b.alice, b.bob} {
		if st, body, _ := b.do(t, "DELETE", "/api/v1/blobs/"+id, tok, nil); st != http.StatusNoContent {
			t.Fatalf("DELETE: %d %s", st, body)
		}
	}
	if n, err := b.srv.store.CollectBlobGarbage(context.Background()); err != nil || n != 1 {
		t.Fatalf("CollectBlobGarbage = %d, %v, want 1 removed", n, err)
	}
	if n := b.stored(t); n != [4]int{} {
		t.Fatalf("after collection: %v, want nothing stored", n)
	}
}

// Refused uploads store nothing: a body whose hash is not the id, one
// past the quota (declared or streamed), a hostile archive, a bad id.
func TestBlobUploadRefusals(t *testing.T) {
	t.Parallel()
	const quota = 3 << 20
	b := newBlobServer(t, Config{DataQuota: quota})
	keep := randomBytes(2<<20, 2)
	if st, body, _ := b.do(t, "PUT", "/api/v1/blobs/"+blobID(keep), b.alice, bytes.NewReader(keep)); st != 201 {
		t.Fatalf("push 2 MiB of a 3 MiB quota: %d %s", st, body)
	}
	base := b.stored(t)

	var hostile bytes.Buffer
	tw := tar.NewWriter(&hostile)
	tw.WriteHeader(&tar.Header{Name: "ok.txt", Typeflag: tar.TypeReg, Size: 2, Mode: 0o644})
	tw.Write([]byte("ok"))
	tw.WriteHeader(&tar.Header{Name: "../../etc/cron.d/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.Close()

	big := randomBytes(2<<20, 3)
	tests := []struct {
		name   string
		path   string
		body   io.Reader
		status int
		want   string
	}{
		{"hash mismatch", "/api/v1/blobs/" + blobID([]byte("other")), bytes.NewReader(big[:1000]), 400, "nothing stored"},
		{"past the quota, declared", "/api/v1/blobs/" + blobID(big), bytes.NewReader(big), 413, "quota of 3145728 bytes"},
		{"past the quota, streamed", "/api/v1/blobs/" + blobID(big), io.MultiReader(bytes.NewReader(big)), 413, "quota of 3145728 bytes"},
		{"hostile archive", "/api/v1/blobs/" + blobID(hostile.Bytes()) + "?archive=1", bytes.NewReader(hostile.Bytes()), 400, `../../etc/cron.d/x`},
		{"garbage archive", "/api/v1/blobs/" + blobID(big[:5000]) + "?archive=1", bytes.NewReader(big[:5000]), 400, "archive refused"},
		{"bad id", "/api/v1/blobs/sha256:XYZ", strings.NewReader("x"), 400, "64 lower-case hex"},
		{"too long a name", "/api/v1/blobs/" + blobID([]byte("x")) + "?name=" + strings.Repeat("n", 300), strings.NewReader("x"), 400, "longer than 255"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, body, _ := b.do(t, "PUT", tc.path, b.alice, tc.body)
			if st != tc.status || !strings.Contains(string(body), tc.want) {
				t.Fatalf("%d %s, want %d with %q", st, body, tc.status, tc.want)
			}
			if n := b.stored(t); n != base {
				t.Fatalf("stored %v after the refusal, want %v as before", n, base)
			}
		})
	}
	// Without a token: 401 and nothing stored.
	if st, _, _ := b.do(t, "PUT", "/api/v1/blobs/"+blobID(big), "", bytes.NewReader(big)); st != 401 {
		t.Fatalf("push without a token: %d, want 401", st)
	}
}

// An upload cut off by its client leaves nothing visible, and what it
// wrote is removed.
func TestBlobUploadCutOff(t *testing.T) {
	t.Parallel()
	b := newBlobServer(t, Config{})
	data := randomBytes(3<<20, 4)
	id := blobID(data)
	conn, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /api/v1/blobs/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", id, b.alice, len(data))
	conn.Write(data[:2<<20+100]) // two chunks written, then the client is gone
	// Wait until the server has written a chunk, then cut.
	for i := 0; b.stored(t)[1] == 0; i++ {
		if i > 1000 {
			t.Fatal("the server wrote no chunk of the upload")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn.Close()
	for i := 0; b.stored(t) != [4]int{}; i++ {
		if i > 3000 {
			t.Fatalf("after the cut: %v stored, want nothing", b.stored(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, _, _ := b.do(t, "HEAD", "/api/v1/blobs/"+id, b.alice, nil); st != 404 {
		t.Fatalf("HEAD after the cut: %d, want 404", st)
	}
}

// The server holds no blob whole: pushing and reading 192 MiB moves its heap
// by a few chunks, not by the blob.
//
// Not in parallel: it measures the whole process's heap.
func TestBlobTransferMemoryIsBounded(t *testing.T) {
	b := newBlobServer(t, Config{})
	const size = 192 << 20
	// The data is made as it is sent, so that the test holds none of it.
	h0 := sha256.New()
	io.Copy(h0, io.LimitReader(newPCGReader(5), size))
	id := "sha256:" + hex.EncodeToString(h0.Sum(nil))
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()
	if st, body, _ := b.do(t, "PUT", "/api/v1/blobs/"+id, b.alice, io.LimitReader(newPCGReader(5), size)); st != 201 {
		t.Fatalf("push: %d %s", st, body)
	}
	req, _ := http.NewRequest("GET", b.url+"/api/v1/blobs/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+b.alice)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	close(done)
	if err != nil || n != size || "sha256:"+hex.EncodeToString(h.Sum(nil)) != id {
		t.Fatalf("read back %d bytes (%v), want the %d pushed", n, err, size)
	}
	// 64 MiB, a third of the blob, is room for the chunks in flight (4
	// written at once, 4 read ahead), the connections' buffers, and what
	// the collector has not reclaimed yet on a busy machine (49 MiB seen).
	if grew := int64(peak.Load()) - int64(base.HeapInuse); grew > 64<<20 {
		t.Fatalf("the heap grew by %d MiB while moving a %d MiB blob, want at most 64", grew>>20, size>>20)
	}
}

// A workflow may mount only the owner's own data, archives only as
// archives; the data a workflow mounts stays while the workflow does.
func TestSubmitChecksData(t *testing.T) {
	t.Parallel()
	b := newBlobServer(t, Config{})
	st, body, _ := b.do(t, "POST", "/api/v1/modules", b.alice, bytes.NewReader(minimalModule))
	if st != 201 {
		t.Fatalf("push module: %d %s", st, body)
	}
	var m struct{ ID string }
	json.Unmarshal(body, &m)
	file := []byte("some data")
	fileID := blobID(file)
	for _, tok := range []string{b.alice, b.bob} {
		if st, body, _ := b.do(t, "PUT", "/api/v1/blobs/"+fileID, tok, bytes.NewReader(file)); st != 201 {
			t.Fatalf("push data: %d %s", st, body)
		}
	}
	bobOnly := []byte("bob's")
	if st, _, _ := b.do(t, "PUT", "/api/v1/blobs/"+blobID(bobOnly), b.bob, bytes.NewReader(bobOnly)); st != 201 {
		t.Fatal("push bob's data")
	}
	wf := func(files string) string {
		return `{"name": "w", "tasks": [{"name": "t", "module": "` + m.ID + `", "files": {` + files + `}}]}`
	}
	tests := []struct {
		files, field, msg string
	}{
		{`"/d": {"blob": "` + blobID(bobOnly) + `"}`, "files./d.blob", "unknown data"},
		{`"/d": {"blob": "` + blobID([]byte("nobody's")) + `"}`, "files./d.blob", "unknown data"},
		{`"/d": {"blob": "` + fileID + `", "archive": true}`, "files./d.blob", "not pushed as an archive"},
		{`"/d": {"blob": "./local/file"}`, "files./d.blob", "is a path"},
		{`"/in/x": {"data": "x"}`, "files./in/x", "under /in"},
	}
	for _, tc := range tests {
		st, body, _ := b.do(t, "POST", "/api/v1/workflows", b.alice, strings.NewReader(wf(tc.files)))
		var e struct{ Error, Task, Field string }
		json.Unmarshal(body, &e)
		if st != 400 || e.Task != "t" || e.Field != tc.field || !strings.Contains(e.Error, tc.msg) {
			t.Errorf("files {%s}: %d %s, want 400 naming task t, field %s, with %q", tc.files, st, body, tc.field, tc.msg)
		}
	}
	var workflows int
	b.db.QueryRow(context.Background(), `SELECT count(*) FROM workflows`).Scan(&workflows)
	if workflows != 0 {
		t.Fatalf("%d workflows written by refused submissions", workflows)
	}
	st, body, _ = b.do(t, "POST", "/api/v1/workflows", b.alice, strings.NewReader(wf(`"/d": {"blob": "`+fileID+`"}`)))
	if st != 201 {
		t.Fatalf("submit: %d %s", st, body)
	}
	var setup string
	if err := b.db.QueryRow(context.Background(), `SELECT setup::text FROM tasks`).Scan(&setup); err != nil || !strings.Contains(setup, `"size": 9`) || !strings.Contains(setup, "/blobs/"+fileID+"?k=") {
		t.Fatalf("the task's setup %s (%v), want the blob with its size and address", setup, err)
	}
	// Removed by both owners, the data stays while the workflow reads it.
	for _, tok := range []string{b.alice, b.bob} {
		b.do(t, "DELETE", "/api/v1/blobs/"+fileID, tok, nil)
	}
	if _, err := b.srv.store.CollectBlobGarbage(context.Background()); err != nil {
		t.Fatal(err)
	}
	var kept int
	b.db.QueryRow(context.Background(), `SELECT count(*) FROM blobs WHERE id = $1`, fileID).Scan(&kept)
	if kept != 1 {
		t.Fatal("the data a workflow reads was collected")
	}
}

// An owner flooding the server with uploads gets MaxBlobUploads at once;
// the next is refused with 429 and Retry-After, and none of them keeps
// anything once cut off.
func TestBlobUploadFlood(t *testing.T) {
	t.Parallel()
	b := newBlobServer(t, Config{})
	var writers []*io.PipeWriter
	done := make(chan int, store.MaxBlobUploads)
	for i := range store.MaxBlobUploads {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		id := blobID([]byte(fmt.Sprint("never sent ", i)))
		go func() {
			req, _ := http.NewRequest("PUT", b.url+"/api/v1/blobs/"+id, pr)
			req.Header.Set("Authorization", "Bearer "+b.alice)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				done <- resp.StatusCode
				return
			}
			done <- 0
		}()
		// A MiB each, so that every upload is in progress in the database.
		if _, err := pw.Write(bytes.Repeat([]byte{'x'}, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; b.stored(t)[2] < store.MaxBlobUploads; i++ {
		if i > 1000 {
			t.Fatalf("uploads in progress: %v, want %d", b.stored(t), store.MaxBlobUploads)
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, body, h := b.do(t, "PUT", "/api/v1/blobs/"+blobID([]byte("one more")), b.alice, strings.NewReader("one more"))
	if st != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(string(body), "in progress") {
		t.Fatalf("upload %d: %d %s (Retry-After %q), want 429 with Retry-After", store.MaxBlobUploads+1, st, body, h.Get("Retry-After"))
	}
	// Bob is not held up by Alice's flood.
	if st, body, _ := b.do(t, "PUT", "/api/v1/blobs/"+blobID([]byte("bob's")), b.bob, strings.NewReader("bob's")); st != http.StatusCreated {
		t.Fatalf("another owner's upload during the flood: %d %s", st, body)
	}
	for _, pw := range writers {
		pw.CloseWithError(errors.New("the client gave up"))
	}
	for range writers {
		<-done
	}
	for i := 0; ; i++ {
		n := b.stored(t)
		if n[2] == 0 && n[0] == 1 { // bob's blob alone
			break
		}
		if i > 3000 {
			t.Fatalf("after the flood: %v stored, want bob's blob alone", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
