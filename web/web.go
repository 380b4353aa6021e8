// Package web serves the volunteer page: a server-rendered templ page at /
// and its static assets (page script and style, the browser worker's
// bootstrap, the Go worker compiled to WebAssembly, the task Web Worker with
// its WASI shim) under /static/, embedded in the binary.
//
// Every asset is served under a content-hashed name (page.3fa2c1d0.js) with
// a one-year immutable cache lifetime, so a new build never meets a stale
// copy; the page names the hashed files. The unhashed name also works, with
// revalidation, for scripts that cannot know the hash.
//
// Every response carries COOP/COEP headers: the page is cross-origin
// isolated so that a task Web Worker can block on a SharedArrayBuffer while
// the server commits its checkpoint (cyclepool.checkpoint blocks by
// contract, docs/TASK_ABI.md).
package web

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

//go:embed static
var staticFS embed.FS

// asset is one embedded file.
type asset struct {
	name   string // file name under static/
	hashed string // name with the content hash, e.g. page.3fa2c1d0.js
	body   []byte
	ctype  string

	gzOnce sync.Once
	gz     []byte // body gzipped, made on first request; nil when not worth it
}

// gzipped returns the body compressed, once (worker.wasm shrinks from about
// 11 MB to 3 MB: it matters on a phone's connection).
func (f *asset) gzipped() []byte {
	f.gzOnce.Do(func() {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.DefaultCompression)
		_, _ = zw.Write(f.body)
		_ = zw.Close()
		if b.Len() < len(f.body)*9/10 {
			f.gz = b.Bytes()
		}
	})
	return f.gz
}

// assets is every embedded file, by plain and by hashed name.
type assets struct {
	byName   map[string]*asset
	byHashed map[string]*asset
}

func loadAssets() *assets {
	a := &assets{byName: map[string]*asset{}, byHashed: map[string]*asset{}}
	entries, err := fs.ReadDir(staticFS, "static")
	if err != nil {
		panic(err) // the directory is embedded: it always exists
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		body, err := staticFS.ReadFile("static/" + e.Name())
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(body)
		ext := path.Ext(e.Name())
		f := &asset{name: e.Name(), body: body,
			hashed: strings.TrimSuffix(e.Name(), ext) + "." + hex.EncodeToString(sum[:4]) + ext,
			ctype:  mime.TypeByExtension(ext)}
		switch ext {
		case ".wasm":
			f.ctype = "application/wasm"
		case ".js":
			f.ctype = "text/javascript; charset=utf-8"
		}
		if f.ctype == "" {
			f.ctype = "application/octet-stream"
		}
		a.byName[f.name], a.byHashed[f.hashed] = f, f
	}
	return a
}

// url returns the path of an asset under its hashed name, or "" when it is
// not embedded (the worker was not built: see the Makefile's web target).
func (a *assets) url(name string) string {
	if f := a.byName[name]; f != nil {
		return "/static/" + f.hashed
	}
	return ""
}

// Handler serves the volunteer page at / and the assets under /static/.
func Handler() http.Handler {
	a := loadAssets()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		isolate(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_ = Page(pageData(a)).Render(r.Context(), w)
	})
	mux.HandleFunc("GET /static/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		f, immutable := a.byHashed[name], true
		if f == nil {
			f, immutable = a.byName[name], false
		}
		if f == nil {
			http.NotFound(w, r)
			return
		}
		isolate(w)
		w.Header().Set("Content-Type", f.ctype)
		if immutable {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		w.Header().Set("Vary", "Accept-Encoding")
		body, etag := f.body, `"`+f.hashed+`"`
		if len(body) > 1024 && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			if gz := f.gzipped(); gz != nil {
				body, etag = gz, `"`+f.hashed+`.gz"`
				w.Header().Set("Content-Encoding", "gzip")
			}
		}
		w.Header().Set("ETag", etag)
		http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(body))
	})
	return mux
}

// isolate makes the page cross-origin isolated (SharedArrayBuffer).
func isolate(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Embedder-Policy", "require-corp")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("X-Content-Type-Options", "nosniff")
}

// PageData is what the volunteer page shows before its script runs.
type PageData struct {
	CSS, PageJS, WorkerJS, WasmExecJS, WorkerWasm, TaskJS string
	// WorkerBuilt is false when the Go worker was not built into the
	// binary (a `go build` without `make`): the page says so.
	WorkerBuilt bool
}

func pageData(a *assets) PageData {
	d := PageData{CSS: a.url("page.css"), PageJS: a.url("page.js"), WorkerJS: a.url("worker.js"),
		WasmExecJS: a.url("wasm_exec.js"), WorkerWasm: a.url("worker.wasm"), TaskJS: a.url("task.js")}
	d.WorkerBuilt = d.WasmExecJS != "" && d.WorkerWasm != ""
	return d
}
