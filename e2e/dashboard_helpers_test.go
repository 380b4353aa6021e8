//go:build unix

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// tryEval evaluates expr in the page like eval, but reports failures (a
// page in the middle of navigating) instead of failing the test.
func (b *browser) tryEval(expr string, out any) error {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		return err
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// waitJS waits until the JavaScript expression is true.
func (b *browser) waitJS(d time.Duration, what, expr string) {
	b.t.Helper()
	eventually(b.t, d, what, func() bool {
		var ok bool
		return b.tryEval("!!("+expr+")", &ok) == nil && ok
	})
}

// text is the text of the first element matching a CSS selector ("" when
// there is none).
func (b *browser) text(sel string) string {
	b.t.Helper()
	var s string
	q, _ := json.Marshal(sel)
	if err := b.tryEval(fmt.Sprintf(`(document.querySelector(%s) || {}).textContent || ""`, q), &s); err != nil {
		b.t.Fatalf("read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// path is the page's location path.
func (b *browser) path() string {
	b.t.Helper()
	var s string
	if err := b.tryEval(`location.pathname`, &s); err != nil {
		return ""
	}
	return s
}

// signIn signs in on the dashboard's page with an owner token and waits
// for the page after it.
func (b *browser) signIn(base, token string) {
	b.t.Helper()
	b.do(chromedp.Navigate(base+"/app/login"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("signin")))
	b.waitJS(15*time.Second, "the dashboard after signing in", `document.querySelector("header.top")`)
}

// dashSession signs in over plain HTTP and returns the session cookie and
// the CSRF token of the dashboard's forms.
func dashSession(t *testing.T, base, token string) (cookie *http.Cookie, csrf string) {
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
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(body)
	if login == nil || m == nil {
		t.Fatalf("the sign-in page has no CSRF cookie or field:\n%s", body)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/app/login", strings.NewReader(url.Values{"csrf": {string(m[1])}, "token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(login)
	res, err = noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	for _, c := range res.Cookies() {
		if c.Name == "cp_session" {
			cookie = c
		}
	}
	if cookie == nil || res.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in answered %s without a session cookie", res.Status)
	}
	if !cookie.HttpOnly || !cookie.Secure || cookie.SameSite != http.SameSiteStrictMode {
		t.Errorf("session cookie is not HttpOnly, Secure and SameSite=Strict: %+v", cookie)
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/app/", nil)
	req.AddCookie(cookie)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if m = regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(body); m == nil {
		t.Fatalf("no CSRF field on /app/ (%s)", res.Status)
	}
	return cookie, string(m[1])
}

// dashRequest sends a request to the dashboard with a session cookie.
func dashRequest(t *testing.T, method, u string, cookie *http.Cookie, form url.Values, header map[string]string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, u, body)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

// viewShot saves what the viewport shows (a page too long for a full
// screenshot), like screenshot.
func (b *browser) viewShot(name string, width, height int64) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height)); err != nil {
		b.t.Fatalf("viewport: %v", err)
	}
	dir := screensDir()
	if dir == "" {
		return
	}
	time.Sleep(300 * time.Millisecond)
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%dpx.png", name, width)), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}
