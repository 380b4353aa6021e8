package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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

// moduleServer is a Server on a fresh database, served over HTTP, with an
// owner's token and a direct connection to the database.
type moduleServer struct {
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
	ts := httptest.NewServer(New(st, cfg).Handler())
	t.Cleanup(ts.Close)
	return &moduleServer{url: ts.URL, token: tok, db: db}
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
// served again from the server's memory; an unknown id is a 404.
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

	for _, from := range []string{"the database", "the cache"} {
		resp, err := http.Get(m.url + "/modules/" + id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
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
