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
	"embed"
	"io/fs"
	"net/http"
	"strings"

	"github.com/cyclepool/cyclepool/internal/assets"
)

//go:embed static
var staticFS embed.FS

// loadAssets reads the embedded files; they are compiled in, so a failure
// is a broken build.
func loadAssets() *assets.Set {
	sub, err := fs.Sub(staticFS, "static")
	if err == nil {
		var a *assets.Set
		if a, err = assets.Load(sub, "/static/"); err == nil {
			return a
		}
	}
	panic(err)
}

// Handler serves the volunteer page at / and the assets under /static/.
//
// frameAncestors is the CSP frame-ancestors source list of the page: which
// sites may embed it in a frame ("'self'" when empty: only the server's own
// pages). Embedding lets a site run a volunteer page, started or not, under
// its own content: only an operator may allow it, for the project's own
// site.
func Handler(frameAncestors string) http.Handler {
	if frameAncestors == "" {
		frameAncestors = "'self'"
	}
	a := loadAssets()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		isolate(w)
		w.Header().Set("Content-Security-Policy", "frame-ancestors "+frameAncestors)
		switch frameAncestors { // for browsers without CSP level 2
		case "'none'":
			w.Header().Set("X-Frame-Options", "DENY")
		case "'self'":
			w.Header().Set("X-Frame-Options", "SAMEORIGIN")
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_ = Page(pageData(a)).Render(r.Context(), w)
	})
	mux.HandleFunc("GET /static/{name}", func(w http.ResponseWriter, r *http.Request) {
		isolate(w)
		a.Serve(w, r, r.PathValue("name"))
	})
	return mux
}

// CheckFrameAncestors reports what is wrong with a frame-ancestors source
// list for Handler ("" when nothing): space-separated sources such as
// 'self', 'none' or https://project.example, without the characters that
// would end the header's directive.
func CheckFrameAncestors(s string) string {
	if strings.ContainsAny(s, ";,\r\n\"") {
		return "frame-ancestors: sources are separated by spaces and hold no ; , quote or line break"
	}
	if strings.TrimSpace(s) == "" {
		return "frame-ancestors: empty: give 'none' to forbid embedding"
	}
	return ""
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

func pageData(a *assets.Set) PageData {
	d := PageData{CSS: a.URL("page.css"), PageJS: a.URL("page.js"), WorkerJS: a.URL("worker.js"),
		WasmExecJS: a.URL("wasm_exec.js"), WorkerWasm: a.URL("worker.wasm"), TaskJS: a.URL("task.js")}
	d.WorkerBuilt = d.WasmExecJS != "" && d.WorkerWasm != ""
	return d
}
