// Package app is the owners' dashboard under /app/: sign in with an owner
// token, upload modules, check and submit workflows, watch them live (a
// table and the DAG, fed by the API's event stream), the history, and the
// connected volunteers.
//
// Pages are rendered on the server with templ and work as plain forms;
// app.js adds the live parts. The dashboard has no rules of its own: it
// submits, uploads, cancels, downloads and streams through the REST API's
// handlers (Backend.API), with the owner taken from the session instead of
// a bearer token; the API is also reachable by the page's script under
// /app/api/v1/ with the session cookie (and the CSRF token for writes).
//
// Security: the session is an HMAC-signed, HTTP-only, SameSite=Strict
// cookie, Secure unless the page is served over plain HTTP to another host
// than the machine itself (the sign-in page then says so); every form carries a CSRF token bound to the
// session; every response sets a Content-Security-Policy without inline
// scripts or styles.
package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/internal/assets"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/throttle"
	"github.com/cyclepool/cyclepool/internal/workflow"
)

// Backend is what the dashboard needs of the server.
type Backend interface {
	// OwnerByToken resolves an owner token, as the API's bearer auth does.
	OwnerByToken(ctx context.Context, token string) (store.Owner, error)
	// SessionGeneration is the owner's session generation: a session
	// signed under another one has ended. EndSessions moves it on, ending
	// every session of the owner (sign-out), on every replica.
	SessionGeneration(ctx context.Context, owner int64) (int64, error)
	EndSessions(ctx context.Context, owner int64) error
	// API serves the REST API (paths /api/v1/...) for the owner that
	// WithOwner put in the request's context.
	API() http.Handler
	// SubmissionTurn waits for the turn of a workflow file of size bytes
	// (negative: not known) of owner's, as the API's submissions do, and
	// returns ctx marked so that the API call made with it (callAPI) takes
	// no second turn, and the function that gives the turn back.
	SubmissionTurn(ctx context.Context, owner store.Owner, size int64) (context.Context, func(), error)
	// CheckWorkflow runs the submission's checks without submitting.
	CheckWorkflow(ctx context.Context, owner store.Owner, body []byte) (*workflow.Spec, *workflow.Error, error)
	Status(ctx context.Context, owner store.Owner, id string) (*api.Status, error)
	Edges(ctx context.Context, owner store.Owner, id string) ([][2]string, error)
	List(ctx context.Context, owner store.Owner, o store.ListOptions) ([]api.Status, int, error)
	Modules(ctx context.Context, owner store.Owner) ([]api.Module, error)
	ModuleUse(ctx context.Context, owner store.Owner) (map[string][]string, error)
	// Blobs is the owner's data blobs, as GET /api/v1/blobs lists them.
	Blobs(ctx context.Context, owner store.Owner) ([]api.Blob, error)
	// Volunteers is the connected workers as GET /api/v1/workers shows
	// them, and the last hour's activity.
	Volunteers(ctx context.Context, owner store.Owner) (Volunteers, error)
}

// Volunteers is what the volunteers page shows.
type Volunteers struct {
	Workers []Worker
	// FairnessStrategy and Variance are GET /api/v1/workers' fairness: the
	// strategy in force and the variance of tasks done per worker (since
	// each connected, over the workers of this replica).
	FairnessStrategy string
	Variance         float64
	// Activity is the last hour, minute by minute, oldest first.
	Activity []api.ActivityMinute
}

// Worker is a connected worker as the volunteers page shows it.
type Worker struct {
	ID          string
	Kind        string
	Slots       int
	Device      protocol.Device
	ConnectedAt time.Time
	LastSeen    time.Time
	Done        int64    // successful attempts over its life
	Lost        int64    // attempts lost to lapsed leases
	Running     []string // "workflow / task", or "(another project)"
	// DoneHere is the tasks done since it connected, the count the
	// fairness is measured on; nil when it is connected to another replica.
	DoneHere *int
	// Stability is the dispatcher's class of the worker (very_stable,
	// stable, unstable, too_unstable) and Reasons what lowered it; ""
	// when it is connected to another replica.
	Stability string
	Reasons   []string
}

// Options configures the dashboard.
type Options struct {
	Key    []byte // signs sessions and CSRF tokens (at least 32 bytes)
	Logger *slog.Logger
	// SessionTTL is how long a sign-in lasts (default 12h).
	SessionTTL time.Duration
	// Failures counts wrong tokens per address; sign-in is refused (429)
	// to an address past them. The server shares its own with the API's
	// bearer auth, so that guessing through both is no faster. Nil: the
	// dashboard counts its own (throttle.New's defaults: 10 a minute).
	Failures *throttle.Failures
}

type ownerKey struct{}

// WithOwner returns ctx carrying the signed-in owner.
func WithOwner(ctx context.Context, o store.Owner) context.Context {
	return context.WithValue(ctx, ownerKey{}, o)
}

// OwnerFrom returns the owner WithOwner stored.
func OwnerFrom(ctx context.Context) (store.Owner, bool) {
	o, ok := ctx.Value(ownerKey{}).(store.Owner)
	return o, ok
}

type handler struct {
	b      Backend
	api    http.Handler
	opt    Options
	log    *slog.Logger
	assets *assets.Set
	mux    *http.ServeMux
	// failures slows down token guessing (Options.Failures).
	failures *throttle.Failures
}

// csp allows nothing inline: scripts and styles come from /app/static/.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// New returns the dashboard's handler; mount it at /app/.
func New(b Backend, opt Options) http.Handler {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Failures == nil {
		opt.Failures = throttle.New(throttle.Config{})
	}
	if opt.SessionTTL <= 0 {
		opt.SessionTTL = 12 * time.Hour
	}
	h := &handler{b: b, api: b.API(), opt: opt, log: opt.Logger, assets: loadAssets(), mux: http.NewServeMux(), failures: opt.Failures}
	m := h.mux
	m.HandleFunc("GET /app/static/{name}", func(w http.ResponseWriter, r *http.Request) { h.assets.Serve(w, r, r.PathValue("name")) })
	m.HandleFunc("GET /app/login", h.loginPage)
	m.HandleFunc("POST /app/login", h.login)
	m.HandleFunc("POST /app/logout", h.page(h.logout))
	m.HandleFunc("GET /app/{$}", h.page(h.home))
	m.HandleFunc("GET /app/workflows/{id}", h.page(h.workflowPage))
	m.HandleFunc("POST /app/workflows/{id}/cancel", h.page(h.cancel))
	m.HandleFunc("POST /app/workflows/{id}/delete", h.page(h.delete))
	m.HandleFunc("POST /app/workflows/{id}/tasks/{task}/cancel", h.page(h.cancelTask))
	m.HandleFunc("GET /app/submit", h.page(h.submitPage))
	m.HandleFunc("POST /app/submit", h.formPage(h.submit))
	m.HandleFunc("GET /app/modules", h.page(h.modulesPage))
	m.HandleFunc("POST /app/modules", h.formPage(h.upload))
	m.HandleFunc("GET /app/workflows/{id}/tasks/{task}/preview/{output...}", h.page(h.previewPage))
	m.HandleFunc("GET /app/workflows/{id}/tasks/{task}/image/{output...}", h.page(h.previewImage))
	m.HandleFunc("GET /app/data", h.page(h.dataPage))
	m.HandleFunc("POST /app/data", h.formPage(h.dataUpload))
	m.HandleFunc("GET /app/history", h.page(h.history))
	m.HandleFunc("GET /app/volunteers", h.page(h.volunteers))
	m.HandleFunc("GET /app/volunteers.json", h.page(h.volunteersJSON))
	m.HandleFunc("/app/api/", h.proxyAPI)
	m.HandleFunc("/app/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such page", http.StatusNotFound)
	})
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	h.mux.ServeHTTP(w, r)
}

// pageCtx is a signed-in request.
type pageCtx struct {
	w     http.ResponseWriter
	r     *http.Request
	owner store.Owner
	sess  session
}

// page requires a session (else sends to the sign-in page) and, for
// anything but GET, a valid CSRF token in the form.
func (h *handler) page(fn func(*pageCtx)) http.HandlerFunc { return h.pageFor(fn, false) }

// formPage is page for the two upload forms, whose handlers read a
// multipart body as a stream with readForm and check its CSRF token
// themselves; any other body is checked here as in page.
func (h *handler) formPage(fn func(*pageCtx)) http.HandlerFunc { return h.pageFor(fn, true) }

func (h *handler) pageFor(fn func(*pageCtx), streamsMultipart bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess, ok := h.session(r)
		if !ok {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/app/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "not signed in", http.StatusUnauthorized)
			return
		}
		p := &pageCtx{w: w, r: r, owner: store.Owner{ID: sess.OwnerID, Name: sess.Owner}, sess: sess}
		p.r = r.WithContext(WithOwner(r.Context(), p.owner))
		multipart := strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/")
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !(streamsMultipart && multipart) {
			// Forms other than the uploads are small: read whole,
			// multipart or not.
			if !streamsMultipart {
				r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
			}
			if !h.csrfOK(sess, r.PostFormValue("csrf")) {
				http.Error(w, formExpired, http.StatusForbidden)
				return
			}
		}
		w.Header().Set("Cache-Control", "no-store")
		fn(p)
	}
}

// proxyAPI serves /app/api/v1/... with the session's owner: reads need the
// session, writes also the CSRF token in X-CSRF-Token.
func (h *handler) proxyAPI(w http.ResponseWriter, r *http.Request) {
	sess, ok := h.session(r)
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":"not signed in"}`+"\n")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !h.csrfOK(sess, r.Header.Get("X-CSRF-Token")) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"error":"missing or wrong X-CSRF-Token"}`+"\n")
		return
	}
	r = r.WithContext(WithOwner(r.Context(), store.Owner{ID: sess.OwnerID, Name: sess.Owner}))
	http.StripPrefix("/app", h.api).ServeHTTP(w, r)
}

// apiResult is the answer of an API call made on the owner's behalf.
type apiResult struct {
	status int
	body   []byte
	header http.Header
	err    apiError
}

type apiError struct {
	Error string `json:"error"`
	Task  string `json:"task"`
	Field string `json:"field"`
}

// callAPI runs one REST API request for the page's owner through the API's
// own handler.
func (h *handler) callAPI(p *pageCtx, method, path string, body []byte) apiResult {
	return h.callAPIStream(p, method, path, bytes.NewReader(body))
}

// callAPIStream is callAPI with a body read as the API handler reads it:
// an upload streams through without being held here.
func (h *handler) callAPIStream(p *pageCtx, method, path string, body io.Reader) apiResult {
	return h.callAPIHeader(p, method, path, body, nil)
}

// callAPIHeader is callAPIStream with request headers (a Range, say).
func (h *handler) callAPIHeader(p *pageCtx, method, path string, body io.Reader, hdr http.Header) apiResult {
	req, _ := http.NewRequestWithContext(p.r.Context(), method, path, body)
	req = req.WithContext(WithOwner(req.Context(), p.owner))
	for k, v := range hdr {
		req.Header[k] = v
	}
	rec := &recorder{header: http.Header{}, status: http.StatusOK}
	h.api.ServeHTTP(rec, req)
	res := apiResult{status: rec.status, body: rec.buf.Bytes(), header: rec.header}
	if rec.status >= 400 {
		if json.Unmarshal(res.body, &res.err) != nil || res.err.Error == "" {
			res.err.Error = strings.TrimSpace(string(res.body))
		}
	}
	return res
}

// recorder is a ResponseWriter that keeps the answer.
type recorder struct {
	header http.Header
	status int
	wrote  bool
	buf    bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.buf.Write(b)
}
func (r *recorder) WriteHeader(s int) {
	if !r.wrote {
		r.status, r.wrote = s, true
	}
}

// render writes a page.
func (h *handler) render(p *pageCtx, status int, c interface {
	Render(context.Context, io.Writer) error
}) {
	p.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	var b bytes.Buffer
	if err := c.Render(p.r.Context(), &b); err != nil {
		h.log.Error("render page", "path", p.r.URL.Path, "err", err)
		http.Error(p.w, "server error while rendering the page", http.StatusInternalServerError)
		return
	}
	p.w.WriteHeader(status)
	_, _ = p.w.Write(b.Bytes())
}

func (h *handler) serverError(p *pageCtx, what string, err error) {
	h.log.Error("dashboard", "what", what, "err", err)
	http.Error(p.w, "server error while trying to "+what, http.StatusInternalServerError)
}

func (h *handler) notFound(p *pageCtx, what string, err error) {
	if errors.Is(err, store.ErrNotFound) {
		p.w.Header().Set("Content-Type", "text/html; charset=utf-8")
		h.render(p, http.StatusNotFound, NotFoundPage(h.layout(p, ""), what))
		return
	}
	h.serverError(p, "read "+what, err)
}

// layout is what every signed-in page shares.
func (h *handler) layout(p *pageCtx, nav string) Layout {
	return Layout{Owner: p.owner.Name, CSRF: h.csrf(p.sess), Nav: nav, CSS: h.assets.URL("app.css"), JS: h.assets.URL("app.js")}
}
