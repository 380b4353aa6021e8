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
	"runtime"
	"strings"
	"testing"
	"time"
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
	ctx := context.Background()
	st, _, tok := openStore(t)
	s := New(st, Config{Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	cookie, csrf := dashSignIn(t, ts.URL, tok, "/app/modules")
	// Every turn taken (by other owners).
	u := s.moduleUploads
	var releases []func()
	for i := range u.n {
		release, err := u.acquire(ctx, -1-int64(i))
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	const n, size = 8, 32 << 20
	module := bytes.Repeat([]byte{'m'}, size) // not a module: refused once read
	var head bytes.Buffer
	mw := multipart.NewWriter(&head)
	_ = mw.WriteField("csrf", csrf)
	if _, err := mw.CreateFormFile("module", "big.wasm"); err != nil {
		t.Fatal(err)
	}
	tail := fmt.Sprintf("\r\n--%s--\r\n", mw.Boundary())
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	statuses := make(chan int, n)
	for range n {
		go func() {
			body := io.MultiReader(bytes.NewReader(head.Bytes()), bytes.NewReader(module), strings.NewReader(tail))
			req, _ := http.NewRequest(http.MethodPost, ts.URL+"/app/modules", body)
			req.Header.Set("Content-Type", mw.FormDataContentType())
			req.AddCookie(cookie)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	for deadline := time.Now().Add(time.Minute); u.waiting.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d uploads wait for a turn, the others did not", u.waiting.Load(), n)
		}
	}
	var now runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&now)
	grown := int64(now.HeapAlloc) - int64(base.HeapAlloc)
	t.Logf("heap grown by %d MiB while %d dashboard uploads of %d MiB wait", grown>>20, n, size>>20)
	if grown > 2*size {
		t.Errorf("the heap grew by %d MiB while the dashboard's uploads waited for their turn", grown>>20)
	}
	for _, release := range releases {
		release()
	}
	for range n {
		if code := <-statuses; code != http.StatusBadRequest {
			t.Errorf("an upload ended %d, want 400 (read, then refused as no module)", code)
		}
	}
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
