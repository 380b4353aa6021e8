package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
)

// minimalModule is the smallest task module: a WASI command whose _start
// does nothing, importing nothing.
var minimalModule = wasmtest.Module(
	wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0})),                    // type: () -> ()
	wasmtest.Section(3, wasmtest.Vec([]byte{0})),                             // one function of type 0
	wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("_start"), 0, 0))), // export _start
	wasmtest.Section(10, wasmtest.Vec(wasmtest.Body(nil))),                   // an empty body
)

// paddedModule returns minimalModule with a custom section that brings it
// to exactly size bytes, filled with fill: a valid module of any size.
func paddedModule(t *testing.T, size int, fill byte) []byte {
	t.Helper()
	const name = "pad"
	for lebLen := 1; lebLen <= 5; lebLen++ {
		content := size - len(minimalModule) - 1 - lebLen // section id, size, content
		if content < 1+len(name) || len(wasmtest.ULEB(content)) != lebLen {
			continue
		}
		m := append([]byte(nil), minimalModule...)
		m = append(m, 0x00) // custom section
		m = append(m, wasmtest.ULEB(content)...)
		m = append(m, byte(len(name)))
		m = append(m, name...)
		m = append(m, bytes.Repeat([]byte{fill}, content-1-len(name))...)
		if len(m) != size {
			t.Fatalf("padded module of %d bytes, want %d", len(m), size)
		}
		return m
	}
	t.Fatalf("cannot pad a module to %d bytes", size)
	return nil
}

// getModuleHeaders asks for module id over c, by hand, and reads the
// answer's headers, which must say 200; the body is left unread, as a
// client that reads slowly or not at all leaves it. who names the client
// in failures.
func getModuleHeaders(t *testing.T, c net.Conn, id, who string) *bufio.Reader {
	t.Helper()
	fmt.Fprintf(c, "GET /modules/%s HTTP/1.1\r\nHost: x\r\n\r\n", id)
	r := bufio.NewReaderSize(c, 4096)
	for n := 0; ; n++ {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if n == 0 && !strings.HasPrefix(line, "HTTP/1.1 200 ") {
			t.Fatalf("%s: %q", who, line)
		}
		if line == "\r\n" {
			return r
		}
	}
}

// moduleServer is a Server on a fresh database, served over HTTP, with an
// owner's token and a direct connection to the database.
type moduleServer struct {
	s     *Server
	url   string
	token string
	db    *pgx.Conn
}

func newModuleServer(t *testing.T, cfg Config) *moduleServer {
	t.Helper()
	ctx := context.Background()
	st, url, tok := openStore(t)
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	cfg.Logger = slog.New(slog.DiscardHandler)
	s := New(st, cfg)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Close() })
	t.Cleanup(ts.Close)
	return &moduleServer{s: s, url: ts.URL, token: tok, db: db}
}

// push uploads body as a module and returns the status and the decoded
// JSON answer.
func (m *moduleServer) push(t *testing.T, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", m.url+"/api/v1/modules", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+m.token)
	req.Header.Set("Content-Type", "application/wasm")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("push a module of %d bytes: %v", len(body), err)
	}
	defer resp.Body.Close()
	var answer map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &answer); err != nil {
		t.Fatalf("push: %s, answer %q is not JSON: %v", resp.Status, raw, err)
	}
	return resp.StatusCode, answer
}

// storedModules counts the modules in the database, and the owner's.
func (m *moduleServer) storedModules(t *testing.T) (modules, owned int) {
	t.Helper()
	if err := m.db.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM modules), (SELECT count(*) FROM owner_modules)`).Scan(&modules, &owned); err != nil {
		t.Fatal(err)
	}
	return modules, owned
}

func moduleID(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// An upload larger than MaxModuleBytes, by one byte or by many, is refused
// with 413 and an error naming the limit, and stores nothing (no module, no
// ownership, nothing to download); a valid module of exactly the limit is
// accepted and stored byte for byte.
func TestModuleUploadSizeLimit(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	m := newModuleServer(t, Config{MaxModuleBytes: limit})
	ctx := context.Background()

	for _, size := range []int{limit + 1, 3 * limit} {
		body := paddedModule(t, size, 'x') // valid but for its size
		status, answer := m.push(t, body)
		if status != http.StatusRequestEntityTooLarge {
			t.Fatalf("a module of %d bytes (limit %d): %d %v, want 413", size, limit, status, answer)
		}
		if msg, _ := answer["error"].(string); msg != "module is larger than the 1 MiB limit" {
			t.Errorf("a module of %d bytes: error %q, want it to name the 1 MiB limit", size, msg)
		}
		if mods, owned := m.storedModules(t); mods != 0 || owned != 0 {
			t.Fatalf("after refusing a module of %d bytes: %d modules and %d owned stored, want none", size, mods, owned)
		}
		resp, err := http.Get(m.url + "/modules/" + moduleID(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("download of the refused module: %s, want 404", resp.Status)
		}
	}

	body := paddedModule(t, limit, 'y')
	status, answer := m.push(t, body)
	if status != http.StatusCreated || answer["id"] != moduleID(body) {
		t.Fatalf("a module of exactly the limit: %d %v, want 201 with id %s", status, answer, moduleID(body))
	}
	if mods, owned := m.storedModules(t); mods != 1 || owned != 1 {
		t.Errorf("after accepting one module: %d modules and %d owned stored, want 1 and 1", mods, owned)
	}
	var stored []byte
	var size int
	if err := m.db.QueryRow(ctx, `SELECT body, size FROM modules WHERE id = $1`, moduleID(body)).Scan(&stored, &size); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, body) || size != limit {
		t.Errorf("stored module of %d bytes (size column %d), want the %d bytes uploaded", len(stored), size, limit)
	}
}

// GET /modules/{id} serves a module's exact bytes, without a token, as
// application/wasm, cacheable forever (Cache-Control immutable, a year's
// max-age) with its id as ETag, both when read from the database and when
// served again from the server's file of it; a range of it answers 206 with
// those bytes, a request naming its ETag 304, HEAD its length alone; an
// unknown id is a 404.
func TestModuleDownload(t *testing.T) {
	t.Parallel()
	m := newModuleServer(t, Config{})
	body := paddedModule(t, 4096, 'z')
	id := moduleID(body)
	if status, answer := m.push(t, body); status != http.StatusCreated || answer["id"] != id {
		t.Fatalf("push: %d %v, want 201 with id %s", status, answer, id)
	}
	// Pushing the same bytes again creates nothing.
	if status, answer := m.push(t, body); status != http.StatusOK || answer["id"] != id {
		t.Fatalf("second push: %d %v, want 200 with id %s", status, answer, id)
	}

	get := func(method string, header ...string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, m.url+"/modules/"+id, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return resp, got
	}
	for _, from := range []string{"the database", "the cache"} {
		resp, got := get("GET")
		if resp.StatusCode != http.StatusOK || !bytes.Equal(got, body) {
			t.Fatalf("module from %s: %s, %d bytes, want 200 and the %d bytes pushed", from, resp.Status, len(got), len(body))
		}
		h := resp.Header
		if cc := h.Get("Cache-Control"); cc != "public, max-age=31536000, immutable" {
			t.Errorf("module from %s: Cache-Control %q, want public, a year's max-age, immutable", from, cc)
		}
		if ct := h.Get("Content-Type"); ct != "application/wasm" {
			t.Errorf("module from %s: Content-Type %q, want application/wasm", from, ct)
		}
		if et := h.Get("ETag"); et != `"`+id+`"` {
			t.Errorf("module from %s: ETag %q, want the quoted id", from, et)
		}
	}

	resp, got := get("GET", "Range", "bytes=100-1123")
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, body[100:1124]) ||
		resp.Header.Get("Content-Range") != "bytes 100-1123/4096" || resp.Header.Get("ETag") != `"`+id+`"` {
		t.Errorf("a range of the module: %s, %d bytes, Content-Range %q; want 206 and bytes 100 to 1123",
			resp.Status, len(got), resp.Header.Get("Content-Range"))
	}
	resp, got = get("GET", "If-None-Match", `"`+id+`"`)
	if resp.StatusCode != http.StatusNotModified || len(got) != 0 {
		t.Errorf("the module asked for with its ETag: %s, %d bytes; want 304", resp.Status, len(got))
	}
	resp, got = get("HEAD")
	if resp.StatusCode != http.StatusOK || len(got) != 0 || resp.ContentLength != int64(len(body)) ||
		resp.Header.Get("Content-Type") != "application/wasm" {
		t.Errorf("HEAD of the module: %s, Content-Length %d, Content-Type %q; want 200 and the module's length",
			resp.Status, resp.ContentLength, resp.Header.Get("Content-Type"))
	}

	unknown := moduleID([]byte("no such module"))
	resp, err := http.Get(m.url + "/modules/" + unknown)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(msg), "no module "+unknown) {
		t.Errorf("unknown module: %s %q, want 404 naming it", resp.Status, msg)
	}
	if cc := resp.Header.Get("Cache-Control"); strings.Contains(cc, "immutable") {
		t.Errorf("a 404 is marked immutable (Cache-Control %q): the module may be pushed later", cc)
	}
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{64 << 20, "64 MiB"},
		{1 << 20, "1 MiB"},
		{3 << 19, "1572864 bytes"},
		{1000, "1000 bytes"},
	} {
		if got := byteSize(tc.n); got != tc.want {
			t.Errorf("byteSize(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// moduleSpool reads a body once for every request that wants it at once,
// reads no more bytes from the database at once than its bound for loads
// (a request that needs room waits for a load to end, or for its own end;
// not for the requests that are served to end), and keeps no file whose
// read failed.
func TestModuleSpool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sizeOf := func(n int64) func(context.Context) (int64, error) {
		return func(context.Context) (int64, error) { return n, nil }
	}
	body := func(n int, fill byte) func(context.Context) ([]byte, error) {
		return func(context.Context) ([]byte, error) { return bytes.Repeat([]byte{fill}, n), nil }
	}
	t.Run("one read for many at once", func(t *testing.T) {
		m := newModuleSpool(t.TempDir(), 1000, 100)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		names := make([]string, 20)
		for i := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f, release, err := m.acquire(ctx, "a", sizeOf(60), func(ctx context.Context) ([]byte, error) {
					<-gate
					return body(60, 'a')(ctx)
				})
				if err != nil {
					t.Error(err)
					return
				}
				defer release()
				got, err := io.ReadAll(f)
				if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{'a'}, 60)) {
					t.Errorf("request %d read %q, %v", i, got, err)
				}
				names[i] = f.Name()
			}()
		}
		close(gate)
		wg.Wait()
		for i := range names {
			if names[i] != names[0] {
				t.Fatalf("request %d got a file of its own: %s, not %s", i, names[i], names[0])
			}
		}
		if m.loads != 1 || m.size != 60 {
			t.Errorf("%d reads, %d bytes spooled; want 1 and 60", m.loads, m.size)
		}
	})
	t.Run("loads at once", func(t *testing.T) {
		m := newModuleSpool(t.TempDir(), 1000, 100)
		gate := make(chan struct{})
		loaded := make(chan error)
		go func() {
			_, release, err := m.acquire(ctx, "a", sizeOf(60), func(ctx context.Context) ([]byte, error) {
				<-gate
				return body(60, 'a')(ctx)
			})
			if err == nil {
				release()
			}
			loaded <- err
		}()
		for m.loadingNow() == 0 {
			time.Sleep(time.Millisecond)
		}
		// b does not fit while a is read: it waits, and gives up with
		// its request.
		cctx, cancel := context.WithCancel(ctx)
		waiting, asked := make(chan error), make(chan struct{})
		go func() {
			_, _, err := m.acquire(cctx, "b", func(context.Context) (int64, error) {
				close(asked)
				return 60, nil
			}, body(60, 'b'))
			waiting <- err
		}()
		<-asked
		cancel()
		if err := <-waiting; !errors.Is(err, context.Canceled) {
			t.Fatalf("b's wait for room ended with %v", err)
		}
		close(gate)
		if err := <-loaded; err != nil {
			t.Fatal(err)
		}
		// Once a was read, b is read while a is served.
		_, releaseA, err := m.acquire(ctx, "a", sizeOf(60), body(60, 'a'))
		if err != nil {
			t.Fatal(err)
		}
		defer releaseA()
		_, releaseB, err := m.acquire(ctx, "b", sizeOf(60), body(60, 'b'))
		if err != nil {
			t.Fatal(err)
		}
		releaseB()
		if m.loads != 2 || m.size != 120 {
			t.Errorf("%d reads, %d bytes spooled; want 2 and 120", m.loads, m.size)
		}
	})
	t.Run("a failed read is not kept", func(t *testing.T) {
		m := newModuleSpool(t.TempDir(), 1000, 100)
		fail := errors.New("database gone")
		if _, _, err := m.acquire(ctx, "a", sizeOf(10), func(context.Context) ([]byte, error) { return nil, fail }); !errors.Is(err, fail) {
			t.Fatalf("first read: %v", err)
		}
		f, release, err := m.acquire(ctx, "a", sizeOf(10), func(context.Context) ([]byte, error) { return []byte("0123456789"), nil })
		if err != nil {
			t.Fatalf("second read: %v", err)
		}
		got, _ := io.ReadAll(f)
		release()
		if string(got) != "0123456789" || m.loads != 2 || m.size != 10 {
			t.Errorf("read %q; %d reads, %d bytes spooled; want 2 and 10", got, m.loads, m.size)
		}
	})
}

// loadingNow is how many bytes are being read from the database.
func (m *moduleSpool) loadingNow() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loading
}

// spooledFiles lists the module files in m's directory.
func spooledFiles(t *testing.T, m *moduleSpool) []string {
	t.Helper()
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// The spool keeps its files within its bound: filling it past it removes
// the least recently used files, never one a request is serving (the
// files in use may take more than the bound: one per module). A module
// found deleted loses its file, at once when nobody reads it, else once
// its last reader is done. Close removes the directory the spool made.
func TestModuleSpoolIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newModuleSpool("", 100, 1000)
	t.Cleanup(func() { m.close() })
	exists := func(n int64) func(context.Context) (int64, error) {
		return func(context.Context) (int64, error) { return n, nil }
	}
	get := func(id string) func() {
		t.Helper()
		f, release, err := m.acquire(ctx, id, exists(40), func(context.Context) ([]byte, error) { return bytes.Repeat([]byte(id), 40), nil })
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte(id), 40)) {
			t.Fatalf("module %s: read %q, %v", id, got, err)
		}
		return release
	}
	kept := func() []string {
		m.mu.Lock()
		defer m.mu.Unlock()
		var ids []string
		for id := range m.files {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return ids
	}
	get("a")()
	get("b")()
	get("a")() // a is now more recent than b
	get("c")() // 120 bytes: b goes
	if ids := kept(); !slices.Equal(ids, []string{"a", "c"}) || m.size != 80 || len(spooledFiles(t, m)) != 2 {
		t.Fatalf("kept %v (%d bytes, files %v), want a and c", ids, m.size, spooledFiles(t, m))
	}
	if m.loads != 3 {
		t.Errorf("%d reads from the database, want 3 (a served again from its file)", m.loads)
	}
	// Held, a is not removed however many others are spooled; the others
	// go, the least recently used first.
	releaseA := get("a")
	get("d")()
	get("e")()
	if ids := kept(); !slices.Equal(ids, []string{"a", "e"}) || len(spooledFiles(t, m)) != 2 {
		t.Fatalf("kept %v (files %v) while a is held, want a and e", ids, spooledFiles(t, m))
	}
	releaseD, releaseE := get("d"), get("e") // a, d, e held: 120 bytes
	if ids := kept(); !slices.Equal(ids, []string{"a", "d", "e"}) || m.size != 120 {
		t.Fatalf("kept %v (%d bytes) while a, d and e are held, want all three", ids, m.size)
	}
	releaseA()
	if ids := kept(); !slices.Equal(ids, []string{"d", "e"}) || m.size != 80 {
		t.Fatalf("kept %v (%d bytes) once a is no longer held, want d and e", ids, m.size)
	}
	// d is found deleted while a request reads it: its file goes once
	// that reader is done, and it is not served meanwhile.
	gone := func(context.Context) (int64, error) { return 0, store.ErrNotFound }
	for range 2 {
		if _, _, err := m.acquire(ctx, "d", gone, nil); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a deleted module: %v", err)
		}
	}
	if ids := kept(); !slices.Equal(ids, []string{"e"}) || len(spooledFiles(t, m)) != 2 {
		t.Fatalf("kept %v (files %v) while the deleted d is read, want e and d's file", ids, spooledFiles(t, m))
	}
	// d is pushed again while its old file is read: it gets a new one,
	// which the old one's removal leaves alone.
	loads := m.loads
	releaseD2 := get("d")
	if m.loads != loads+1 || len(spooledFiles(t, m)) != 3 {
		t.Fatalf("%d reads, files %v once d is back, want a new read and file", m.loads-loads, spooledFiles(t, m))
	}
	releaseD()
	releaseD2()
	get("d")()
	releaseE()
	if files := spooledFiles(t, m); len(files) != 2 || m.size != 80 || m.loads != loads+1 {
		t.Fatalf("files %v (%d bytes) once d's old reader is done, want d's new file and e's", files, m.size)
	}
	// Kept and found deleted, d and e go at once.
	for _, id := range []string{"d", "e"} {
		if _, _, err := m.acquire(ctx, id, gone, nil); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a deleted module: %v", err)
		}
	}
	if files := spooledFiles(t, m); len(files) != 0 || m.size != 0 || len(kept()) != 0 {
		t.Fatalf("files %v (%d bytes) once d and e are found deleted, want none", files, m.size)
	}
	dir := m.dir
	if err := m.close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the spool's directory is left after close: %v", err)
	}
	if _, _, err := m.acquire(ctx, "f", exists(40), nil); !errors.Is(err, errSpoolClosed) {
		t.Errorf("a module asked for after close: %v, want errSpoolClosed", err)
	}
}

// Clients that ask for modules and read them slowly (here not at all) hold
// no copy of a body each: every body is read from the database once,
// written to its file and served from there to all of them, so that the
// server's heap holds no body while they read. Two modules larger than
// half of the memory bound of the time, asked for in turn, made the server
// read each anew for every request while the earlier copies were still
// being written: 12 requests held 480 MiB. (Not parallel: it measures the
// heap.)
func TestModuleMemoryIsBounded(t *testing.T) {
	ctx := context.Background()
	st, _, tok := openStore(t)
	owner, err := st.OwnerByToken(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	const size = 40 << 20
	var ids []string
	for _, fill := range []byte{'a', 'b'} {
		body := bytes.Repeat([]byte{fill}, size)
		id := moduleID(body)
		if _, _, err := st.PutModule(ctx, owner.ID, 1<<30, id, body, []string{}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	s := New(st, Config{Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Close() })
	t.Cleanup(ts.Close)
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	for i := range 12 {
		c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// The headers, then nothing more: the server is left writing
		// the body.
		getModuleHeaders(t, c, ids[i%2], fmt.Sprintf("request %d", i))
	}
	var now runtime.MemStats
	runtime.GC()
	runtime.GC() // and the buffer pools' victims
	runtime.ReadMemStats(&now)
	grown := int64(now.HeapAlloc) - int64(base.HeapAlloc)
	t.Logf("heap grown by %d MiB while 12 requests for 2 modules of %d MiB are being written", grown>>20, size>>20)
	// No body: what the database driver keeps of its largest reads (a
	// buffer on each connection that read one, until its next query).
	if limit := int64(2*size + 16<<20); grown > limit {
		t.Errorf("the heap grew by %d MiB, more than %d MiB", grown>>20, limit>>20)
	}
}

// Module uploads are read a few at a time, each owner's two at a time: an
// upload waiting for its turn has not been read, so that uploads at once
// hold at most a few module bodies in memory (each is held whole while it
// is checked). Before, every upload was read at once, and then waited for
// one of the two checks. (Not parallel: it measures the heap.)
func TestModuleUploadsAreBounded(t *testing.T) {
	ctx := context.Background()
	st, _, tok := openStore(t)
	s := New(st, Config{Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	const n, size = 8, 32 << 20
	body := bytes.Repeat([]byte{'m'}, size) // not a module: refused once read
	waitUnread(t, s.moduleUploads, n, size, http.StatusBadRequest, func() *http.Request {
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/modules", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		return req
	})
	u := s.moduleUploads
	// One owner's third upload waits while another owner's goes ahead.
	a1, _ := u.acquire(ctx, 1, 1)
	a2, _ := u.acquire(ctx, 1, 1)
	short, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := u.acquire(short, 1, 1); err == nil {
		t.Errorf("an owner's third upload at once went ahead, want it to wait")
	}
	b1, err := u.acquire(short, 2, 1)
	if err != nil {
		t.Errorf("another owner's upload waited: %v", err)
	} else {
		b1()
	}
	a1()
	a2()
}

// waitUnread takes every turn of u (as other owners), sends n requests
// that newRequest makes (each with a body of about size bytes), and checks
// that while they wait for a turn the heap holds none of them. Then it
// gives the turns back and checks that each request was read and answered
// want.
func waitUnread(t *testing.T, u *turns, n, size, want int, newRequest func() *http.Request) {
	t.Helper()
	var releases []func()
	for i := int64(0); i*u.perOwner < u.limit; i++ {
		release, err := u.acquire(context.Background(), -1-i, u.perOwner)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	statuses := make(chan int, n)
	for range n {
		go func() {
			resp, err := http.DefaultClient.Do(newRequest())
			if err != nil {
				statuses <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	for deadline := time.Now().Add(time.Minute); u.waiting.Load() < int64(n); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests wait for a turn, the others did not", u.waiting.Load(), n)
		}
	}
	var now runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&now)
	grown := int64(now.HeapAlloc) - int64(base.HeapAlloc)
	t.Logf("heap grown by %d MiB while %d requests of %d MiB wait", grown>>20, n, size>>20)
	if grown > 2*int64(size) {
		t.Errorf("the heap grew by %d MiB while the requests waited for their turn", grown>>20)
	}
	for _, release := range releases {
		release()
	}
	for range n {
		if code := <-statuses; code != want {
			t.Errorf("a request ended %d, want %d once read", code, want)
		}
	}
}

// Modules count in the owner's data quota: a push past it answers 413 as
// data past it does, saying how to free room, and stores nothing. DELETE
// /api/v1/modules/{id} takes a module off its owner's list (204; another
// owner's or an unknown module answers 404); a workflow naming it is then
// refused as unknown on this replica, though it was found before; and once
// nothing holds it, its body is not served any more, though it was served
// (and kept in memory) before.
func TestModuleQuotaAndRemoval(t *testing.T) {
	t.Parallel()
	const quota = 8192
	b := newBlobServer(t, Config{DataQuota: quota})
	push := func(token string, body []byte) (int, string) {
		t.Helper()
		st, answer, _ := b.do(t, "POST", "/api/v1/modules", token, bytes.NewReader(body), "Content-Type", "application/wasm")
		return st, string(answer)
	}
	submit := func(module string) (int, string) {
		t.Helper()
		st, answer, _ := b.do(t, "POST", "/api/v1/workflows", b.alice,
			strings.NewReader(`{"name": "w", "tasks": [{"name": "t", "module": "`+module+`"}]}`))
		return st, string(answer)
	}
	download := func(id string) int {
		t.Helper()
		resp, err := http.Get(b.url + "/modules/" + id)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	big := paddedModule(t, 6000, 'a')
	used := paddedModule(t, 1000, 'u')
	past := paddedModule(t, 2000, 'p') // 6000 + 1000 + 2000 > 8192
	for _, m := range [][]byte{big, used} {
		if st, answer := push(b.alice, m); st != http.StatusCreated {
			t.Fatalf("push %d bytes: %d %s", len(m), st, answer)
		}
	}
	if st, answer := push(b.alice, big); st != http.StatusOK {
		t.Fatalf("push a module the owner has, at its quota: %d %s, want 200", st, answer)
	}
	if st, answer := push(b.alice, past); st != http.StatusRequestEntityTooLarge ||
		!strings.Contains(answer, "quota of 8192 bytes") || !strings.Contains(answer, "cyclepool module rm") || !strings.Contains(answer, "nothing stored") {
		t.Fatalf("push past the quota: %d %s, want 413 naming the quota and how to free room", st, answer)
	}
	var stored bool
	if err := b.db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM modules WHERE id = $1)`, moduleID(past)).Scan(&stored); err != nil || stored {
		t.Fatalf("the module refused past the quota was stored (%v)", err)
	}
	if st, answer := submit(moduleID(used)); st != http.StatusCreated {
		t.Fatalf("submit: %d %s", st, answer)
	}
	if st := download(moduleID(big)); st != http.StatusOK {
		t.Fatalf("download: %d", st)
	}

	for _, tc := range []struct {
		name, token, id string
		want            int
	}{
		{"another owner's", b.bob, moduleID(big), http.StatusNotFound},
		{"unknown", b.alice, moduleID([]byte("nobody's")), http.StatusNotFound},
		{"the owner's", b.alice, moduleID(big), http.StatusNoContent},
		{"removed already", b.alice, moduleID(big), http.StatusNotFound},
		{"used by a workflow", b.alice, moduleID(used), http.StatusNoContent},
	} {
		if st, answer, _ := b.do(t, "DELETE", "/api/v1/modules/"+tc.id, tc.token, nil); st != tc.want {
			t.Errorf("remove %s module: %d %s, want %d", tc.name, st, answer, tc.want)
		}
	}
	if st := download(moduleID(big)); st != http.StatusNotFound {
		t.Errorf("download of a module deleted after it was served: %d, want 404", st)
	}
	if st := download(moduleID(used)); st != http.StatusOK {
		t.Errorf("download of a removed module a workflow uses: %d, want 200", st)
	}
	if st, answer := submit(moduleID(used)); st != http.StatusBadRequest || !strings.Contains(answer, "unknown module "+moduleID(used)+": push it first") {
		t.Errorf("submit naming a removed module: %d %s, want 400 saying to push it first", st, answer)
	}
	if st, answer := push(b.alice, past); st != http.StatusCreated {
		t.Errorf("push once room was freed: %d %s, want 201", st, answer)
	}
}

// A reader that stops reading a module is cut off once it has taken no
// chunk for the stall limit, rather than holding its connection and the
// module's file for the whole write's ten minutes; the module is then
// served to others as before.
func TestStalledModuleReadersLetTheBodyGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _, tok := openStore(t)
	owner, err := st.OwnerByToken(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte{'s'}, 32<<20) // more than the sockets' buffers hold
	id := moduleID(body)
	if _, _, err := st.PutModule(ctx, owner.ID, 1<<30, id, body, []string{}); err != nil {
		t.Fatal(err)
	}
	s := New(st, Config{Logger: slog.New(slog.DiscardHandler)})
	s.moduleStall = 200 * time.Millisecond
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Close() })
	t.Cleanup(ts.Close)
	c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /modules/%s HTTP/1.1\r\nHost: x\r\n\r\n", id)
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil { // the status line, then nothing more
		t.Fatal(err)
	}
	held := func() int {
		s.modules.mu.Lock()
		defer s.modules.mu.Unlock()
		if e := s.modules.files[id]; e != nil {
			return e.refs
		}
		return 0
	}
	for deadline := time.Now().Add(30 * time.Second); held() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) { // bounds the test; the limit is 200 ms
			t.Fatal("the stalled reader still holds the module's body")
		}
	}
	resp, err := http.Get(ts.URL + "/modules/" + id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(got, body) {
		t.Errorf("a reader that reads got %d bytes (err %v), want the module's %d", len(got), err, len(body))
	}
}

// A module removed on another replica while this one still trusts that the
// owner has it (knownModuleFor) and deleted, as nothing else holds it: a
// workflow naming it is refused as naming an unknown module (400), not
// answered with a server error.
func TestSubmitModuleRemovedElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBlobServer(t, Config{})
	m := paddedModule(t, 1000, 'r')
	if st, answer, _ := b.do(t, "POST", "/api/v1/modules", b.alice, bytes.NewReader(m), "Content-Type", "application/wasm"); st != http.StatusCreated {
		t.Fatalf("push: %d %s", st, answer)
	}
	id := moduleID(m)
	submit := func(modules ...string) (int, string) {
		t.Helper()
		var tasks []string
		for i, mod := range modules {
			tasks = append(tasks, fmt.Sprintf(`{"name": "t%d", "module": %q}`, i, mod))
		}
		st, answer, _ := b.do(t, "POST", "/api/v1/workflows", b.alice,
			strings.NewReader(`{"name": "w", "tasks": [`+strings.Join(tasks, ",")+`]}`))
		return st, string(answer)
	}
	// Refused for the other module, but this replica now knows the owner
	// has id.
	if st, answer := submit(id, moduleID([]byte("nobody's"))); st != http.StatusBadRequest {
		t.Fatalf("submit naming an unknown module: %d %s, want 400", st, answer)
	}
	var owner int64
	if err := b.db.QueryRow(ctx, `SELECT owner_id FROM owner_modules WHERE module_id = $1`, id).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if err := b.srv.store.RemoveModule(ctx, owner, id); err != nil { // as another replica would
		t.Fatal(err)
	}
	if st, answer := submit(id); st != http.StatusBadRequest || !strings.Contains(answer, "unknown module "+id) {
		t.Errorf("submit naming a module removed elsewhere: %d %s, want 400 naming the unknown module", st, answer)
	}
}

// What the replica found of an owner's modules is forgotten once it would
// be looked up again: modules an owner no longer names do not stay in
// memory for good.
func TestKnownModulesAreForgotten(t *testing.T) {
	t.Parallel()
	st, _, _ := openStore(t)
	s := New(st, Config{Logger: slog.New(slog.DiscardHandler)})
	now := time.Now()
	s.knownModules.Store(ownedModule{1, "old"}, now.Add(-2*knownModuleFor))
	s.knownModules.Store(ownedModule{1, "new"}, now)
	s.forgetKnownModules(now)
	var left []string
	s.knownModules.Range(func(k, _ any) bool {
		left = append(left, k.(ownedModule).module)
		return true
	})
	if !slices.Equal(left, []string{"new"}) {
		t.Errorf("known modules left %v, want [new]", left)
	}
}

// The replica's maintenance loop is what forgets stale known modules, on
// every replica, leading or not: its first round drops what is older than
// knownModuleFor and keeps the rest. The test waits for the loop's second
// election (two writes of the leader row's expiry) rather than for a time:
// the first round, election and sweep, had ended by then.
func TestMaintenanceForgetsKnownModules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newModuleServer(t, Config{Replica: "test", Lease: time.Minute, Heartbeat: 20 * time.Millisecond})
	s, db := m.s, m.db
	now := time.Now()
	s.knownModules.Store(ownedModule{1, "old"}, now.Add(-2*knownModuleFor))
	s.knownModules.Store(ownedModule{1, "new"}, now)
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.maintain(mctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	var seen []time.Time
	for giveUp := time.Now().Add(time.Minute); len(seen) < 2; {
		if time.Now().After(giveUp) {
			t.Fatalf("the maintenance loop wrote the leader row's expiry %d times in a minute, want 2", len(seen))
		}
		var at time.Time
		err := db.QueryRow(ctx, `SELECT expires_at FROM leaders WHERE name = 'maintenance'`).Scan(&at)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if err == nil && !slices.ContainsFunc(seen, at.Equal) {
			seen = append(seen, at)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var left []string
	s.knownModules.Range(func(k, _ any) bool {
		left = append(left, k.(ownedModule).module)
		return true
	})
	if !slices.Equal(left, []string{"new"}) {
		t.Errorf("known modules left after a round of maintenance: %v, want [new]", left)
	}
}
