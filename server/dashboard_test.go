package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/web/app"
)

// dashCSRF finds a form's CSRF token in a dashboard page.
var dashCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// dashSignIn signs in on the dashboard at base with an owner token and
// returns the session cookie and the CSRF token of the forms of page.
func dashSignIn(t *testing.T, base, token, page string) (*http.Cookie, string) {
	t.Helper()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := http.Get(base + "/app/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var login *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == "cp_login" {
			login = c
		}
	}
	m := dashCSRF.FindSubmatch(body)
	if login == nil || m == nil {
		t.Fatalf("the sign-in page has no CSRF cookie or field:\n%s", body)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/app/login", strings.NewReader(url.Values{"csrf": {string(m[1])}, "token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(login)
	if res, err = noRedirect.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	var cookie *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == "cp_session" {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatalf("sign-in answered %s without a session cookie", res.Status)
	}
	req, _ = http.NewRequest(http.MethodGet, base+page, nil)
	req.AddCookie(cookie)
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if m = dashCSRF.FindSubmatch(body); m == nil {
		t.Fatalf("no CSRF field on %s (%s)", page, res.Status)
	}
	return cookie, string(m[1])
}

// The dashboard's module upload is bounded as the API's is: an upload
// waiting for its turn (moduleUploads) has not been read, whichever door
// it came in by. Before, the dashboard read the whole form, module and
// all, before it handed the module to the API, where it waited for its
// turn: uploads at once held a module body each. (Not parallel: it
// measures the heap.)
func TestDashboardModuleUploadsAreBounded(t *testing.T) {
	st, _, tok := openStore(t)
	s := New(st, Config{Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	cookie, csrf := dashSignIn(t, ts.URL, tok, "/app/modules")
	const n, size = 8, 32 << 20
	module := bytes.Repeat([]byte{'m'}, size) // not a module: refused once read
	var head bytes.Buffer
	mw := multipart.NewWriter(&head)
	_ = mw.WriteField("csrf", csrf)
	if _, err := mw.CreateFormFile("module", "big.wasm"); err != nil {
		t.Fatal(err)
	}
	tail := fmt.Sprintf("\r\n--%s--\r\n", mw.Boundary())
	waitUnread(t, s.moduleUploads, n, size, http.StatusBadRequest, func() *http.Request {
		body := io.MultiReader(bytes.NewReader(head.Bytes()), bytes.NewReader(module), strings.NewReader(tail))
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/app/modules", body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		req.AddCookie(cookie)
		return req
	})
	// A module streams through all the same.
	var form bytes.Buffer
	mw = multipart.NewWriter(&form)
	_ = mw.WriteField("csrf", csrf)
	fw, _ := mw.CreateFormFile("module", "min.wasm")
	fw.Write(minimalModule)
	mw.Close()
	req, _ := http.NewRequest(http.MethodPost, ts.URL+"/app/modules", &form)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.AddCookie(cookie)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "Uploaded "+moduleID(minimalModule)) {
		t.Errorf("a module uploaded on the dashboard: %s\n%s", resp.Status, page)
	}
	// Without the form's CSRF token, nothing is uploaded.
	form.Reset()
	mw = multipart.NewWriter(&form)
	_ = mw.WriteField("csrf", "forged")
	fw, _ = mw.CreateFormFile("module", "min.wasm")
	fw.Write(paddedModule(t, 200, 'x'))
	mw.Close()
	req, _ = http.NewRequest(http.MethodPost, ts.URL+"/app/modules", &form)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.AddCookie(cookie)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a module uploaded with a forged CSRF token: %s, want 403", resp.Status)
	}
}

// Text PostgreSQL cannot hold (a NUL byte, invalid UTF-8) in a path or a
// query answers as what it is, in the API and on the dashboard: a task,
// output or data of such a name does not exist (404), no workflow's name
// holds such a search (none found), and such a name is refused before an
// upload is read (400). Before, each reached the database, which refused
// the statement, and the answer was a 500 (after a whole upload, for a
// name).
func TestMalformedTextIsNoServerError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id, err := f.st.CreateWorkflow(ctx, f.owner.ID, f.oneTask())
	if err != nil {
		t.Fatal(err)
	}
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	cookie, csrf := dashSignIn(t, ts.URL, f.token, "/app/")
	do := func(method, path string, body io.Reader, dash bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, body)
		if dash {
			req.AddCookie(cookie)
			req.Header.Set("X-CSRF-Token", csrf)
		} else {
			req.Header.Set("Authorization", "Bearer "+f.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	wf := "/api/v1/workflows/" + id
	for _, bad := range []string{"%00", "%ff", "a%00b", "%c3%28"} {
		for _, c := range []struct {
			method, path string
			want         int
		}{
			{"GET", wf + "/tasks/" + bad + "/attempts", 404},
			{"GET", wf + "/tasks/" + bad + "/log", 404},
			{"GET", wf + "/tasks/" + bad + "/outputs/stdout", 404},
			{"GET", wf + "/tasks/t/outputs/" + bad, 404},
			{"POST", wf + "/tasks/" + bad + "/cancel", 404},
			{"POST", "/api/v1/workflows/00000000-0000-0000-0000-000000000000/tasks/" + bad + "/cancel", 404},
			{"GET", "/api/v1/blobs/" + bad, 404},
			{"HEAD", "/api/v1/blobs/" + bad, 404},
			{"DELETE", "/api/v1/blobs/" + bad, 404},
			{"GET", "/api/v1/workflows?q=" + bad, 200},
			{"POST", "/api/v1/blobs?name=" + bad, 400},
			{"PUT", "/api/v1/blobs/" + moduleID([]byte("data")) + "?name=" + bad, 400},
			{"POST", "/api/v1/modules?name=" + bad, 400},
		} {
			for _, dash := range []bool{false, true} {
				path := c.path
				if dash {
					path = "/app" + path
				}
				var body io.Reader
				if c.method == "POST" || c.method == "PUT" {
					body = bytes.NewReader([]byte("data"))
					if strings.Contains(path, "modules") {
						body = bytes.NewReader(minimalModule)
					}
				}
				if code, answer := do(c.method, path, body, dash); code != c.want {
					t.Errorf("%s %s: %d %s, want %d", c.method, path, code, answer, c.want)
				}
			}
		}
		for _, page := range []string{"/app/history?q=" + bad, "/app/workflows/" + id + "/tasks/" + bad + "/preview/stdout",
			"/app/workflows/" + id + "/tasks/t/preview/" + bad} {
			if code, answer := do("GET", page, nil, true); code >= 500 {
				t.Errorf("GET %s: %d %s", page, code, answer)
			}
		}
	}
	// Nothing was stored.
	if bs, err := f.st.Blobs(ctx, f.owner.ID); err != nil || len(bs) != 0 {
		t.Errorf("data after the refused uploads: %v, %v", bs, err)
	}
	if ms, err := f.st.Modules(ctx, f.owner.ID); err != nil || len(ms) != 1 {
		t.Errorf("modules after the refused uploads: %v, %v (want the fixture's only)", ms, err)
	}
}

// An owner holds at most MaxOwnerStreams event streams open at once on a
// replica (each polls the database and keeps every task's state): the
// next is refused with 429 and Retry-After, another owner's are not held
// back, and a stream closed makes room. Before, every request held one,
// however many.
func TestEventStreamsPerOwnerAreBounded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFixture(t)
	id, err := f.st.CreateWorkflow(ctx, f.owner.ID, f.oneTask())
	if err != nil {
		t.Fatal(err)
	}
	otherTok, err := f.st.CreateOwner(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.st.OwnerByToken(ctx, otherTok)
	if err != nil {
		t.Fatal(err)
	}
	otherID, err := f.st.CreateWorkflow(ctx, other.ID, f.oneTask())
	if err != nil {
		t.Fatal(err)
	}
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	open := func(ctx context.Context, token, id string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/api/v1/workflows/"+id+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	stops := make([]context.CancelFunc, MaxOwnerStreams)
	for i := range MaxOwnerStreams {
		var sctx context.Context
		sctx, stops[i] = context.WithCancel(ctx)
		defer stops[i]()
		resp := open(sctx, f.token, id)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %s, want 200", i, resp.Status)
		}
		defer resp.Body.Close()
	}
	for range 3 {
		resp := open(ctx, f.token, id)
		resp.Body.Close() // a stream, if it was let open
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("a stream past %d of one owner: %s, want 429 with Retry-After", MaxOwnerStreams, resp.Status)
		}
	}
	resp := open(ctx, otherTok, otherID)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("another owner's stream: %s, want 200", resp.Status)
	}
	stops[0]()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		resp := open(ctx, f.token, id)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a stream closed did not make room: %s", resp.Status)
		}
	}
}

// A page number past the end answers an empty page, however large: the
// history's offset is its page times the page size, which overflowed to
// a negative offset the database refused (a 500).
func TestHistoryPageOutOfRange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	cookie, _ := dashSignIn(t, ts.URL, f.token, "/app/")
	for _, page := range []string{"2", "400000000000000000", "9223372036854775807", "-9223372036854775808"} {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/app/history?page="+page, nil)
		req.AddCookie(cookie)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("/app/history?page=%s: %s %s", page, resp.Status, body)
		}
	}
}

// The dashboard's workflow page waits for a submission's turn before it
// reads the file, as the API does, and its submission through the API
// takes no second turn (which, for a large file, would wait for the one
// it holds). (Not parallel: it measures the heap.)
func TestDashboardSubmissionsAreBounded(t *testing.T) {
	f := newFixture(t)
	s := New(f.st, Config{Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	cookie, csrf := dashSignIn(t, ts.URL, f.token, "/app/submit")
	// form is the form of a file, made once: the requests share its bytes,
	// so that the heap measures the server's, not the client's.
	form := func(file []byte, action string) func() *http.Request {
		var form bytes.Buffer
		mw := multipart.NewWriter(&form)
		_ = mw.WriteField("csrf", csrf)
		_ = mw.WriteField("action", action)
		fw, _ := mw.CreateFormFile("file", "wf.json")
		fw.Write(file)
		mw.Close()
		return func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, ts.URL+"/app/submit", bytes.NewReader(form.Bytes()))
			req.Header.Set("Content-Type", mw.FormDataContentType())
			req.AddCookie(cookie)
			return req
		}
	}
	large := refusedWorkflow(4 << 20)
	var b bytes.Buffer
	waitUnread(t, s.submissions.large, 4, len(large), http.StatusBadRequest, form(large, "check"))
	// A large file that passes is submitted through the API with the
	// page's turn.
	b.Reset()
	b.WriteString(`{"name":"large-ok","tasks":[`)
	for i := 0; b.Len() < 2*smallSubmission; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"t%06d","module":%q}`, i, f.module)
	}
	b.WriteString(`]}`)
	req := form(b.Bytes(), "submit")()
	// The owner's other submissions leave it room for this form alone.
	u := s.submissions.large
	others, err := u.acquire(context.Background(), f.owner.ID, u.perOwner-req.ContentLength)
	if err != nil {
		t.Fatal(err)
	}
	defer others()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/app/workflows/") {
		t.Fatalf("submitted from the dashboard: %s, %s", resp.Status, page)
	}
}

// The dashboard's image preview refuses what it would refuse before it
// reads the output: an output that is not an image by its name is refused
// without a byte of it fetched from the API, and an image over
// maxPreviewImage after a first read of at most 1 MiB (web/app's
// imageProbeBytes). Before,
// it read up to 32 MiB of the output, then looked at its name and size.
// The bytes are counted as the API's output handler answers them (for an
// output uploaded over HTTP, as they are read from its chunks).
func TestImagePreviewChecksBeforeReading(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	wf := f.oneTask()
	wf.Tasks[0].OutputBytes = 64 << 20
	id, err := f.st.CreateWorkflow(ctx, f.owner.ID, wf)
	if err != nil {
		t.Fatal(err)
	}
	cands, _, err := f.st.Candidates(ctx, 10, nil)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %+v (%v), want t", cands, err)
	}
	claimed, err := f.st.ClaimPicks(ctx, []store.Pick{{TaskID: cands[0].TaskID, Worker: f.worker.ID}}, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claimed %+v (%v), want t", claimed, err)
	}
	bytesOf := func(n int) []byte { return bytes.Repeat([]byte{0x89}, n) }
	outs := map[string][]byte{"stdout": []byte("hi\n"), "big.bin": bytesOf(2 << 20), "pic.png": bytesOf(100),
		"mid.png": bytesOf(3 << 20), "huge.png": bytesOf(40 << 20)}
	var os []store.Output
	for name, data := range outs {
		os = append(os, store.Output{Name: name, Data: data})
	}
	if acc, err := f.st.Complete(ctx, []store.Completion{{Attempt: claimed[0].Attempt, Worker: f.worker.ID, OK: true,
		Duration: time.Millisecond, Outputs: os}}); err != nil || !acc[0] {
		t.Fatalf("complete: %v, %v", acc, err)
	}
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	read := new(atomic.Int64)
	ts := httptest.NewServer(app.New(countedOutputs{dashboardBackend{s}, read}, app.Options{Key: make([]byte, 32), Logger: s.log, Failures: s.failures}))
	t.Cleanup(ts.Close)
	cookie, _ := dashSignIn(t, ts.URL, f.token, "/app/")
	image := func(name string) (int, []byte, int64) {
		t.Helper()
		read.Store(0)
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/app/workflows/"+id+"/tasks/t/image/"+name, nil)
		req.AddCookie(cookie)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b, read.Load()
	}
	if code, b, n := image("big.bin"); code != http.StatusNotFound || !strings.Contains(string(b), "not an image") || n != 0 {
		t.Errorf("image preview of a 2 MiB output not an image: %d %q after reading %d bytes of it, want 404 with nothing read", code, b, n)
	}
	const probe = 1 << 20 // web/app's imageProbeBytes
	if code, b, n := image("huge.png"); code != http.StatusRequestEntityTooLarge || n > probe {
		t.Errorf("image preview of a 40 MiB image: %d %q after reading %d bytes of it, want 413 after at most %d", code, b, n, probe)
	}
	for _, name := range []string{"pic.png", "mid.png"} {
		if code, b, n := image(name); code != http.StatusOK || !bytes.Equal(b, outs[name]) || n < int64(len(outs[name])) {
			t.Errorf("image preview of %s: %d, %d bytes after reading %d, want 200 and its %d bytes", name, code, len(b), n, len(outs[name]))
		}
	}
}

// countedOutputs is the dashboard's backend with the bytes its API
// answers for outputs counted.
type countedOutputs struct {
	dashboardBackend
	read *atomic.Int64
}

// API is dashboardBackend's, counting the bytes of outputs it answers.
func (c countedOutputs) API() http.Handler {
	api := c.dashboardBackend.API()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/outputs/") {
			w = countingWriter{w, c.read}
		}
		api.ServeHTTP(w, r)
	})
}

// countingWriter adds the bytes written through it to n.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(b []byte) (int, error) {
	w.n.Add(int64(len(b)))
	return w.ResponseWriter.Write(b)
}
