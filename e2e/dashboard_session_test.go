//go:build unix

package e2e

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
)

// csrfField finds a form's CSRF token in a page.
var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// Signing out of the dashboard ends the session on the server: the same
// cookie, copied before (another browser, a stolen cookie), no longer
// works, on this replica or any other. Another session of the owner ends
// with it.
func TestSignOutEndsTheSessionEverywhere(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	base := p.srv.url
	cookie, csrf := dashSession(t, base, p.srv.token)
	other, _ := dashSession(t, base, p.srv.token)
	for _, c := range []*http.Cookie{cookie, other} {
		if res, _ := dashRequest(t, http.MethodGet, base+"/app/", c, nil, nil); res.StatusCode != http.StatusOK {
			t.Fatalf("signed in: /app/ answered %s", res.Status)
		}
	}
	if res, _ := dashRequest(t, http.MethodPost, base+"/app/logout", cookie, url.Values{"csrf": {csrf}}, nil); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out answered %s", res.Status)
	}
	for name, c := range map[string]*http.Cookie{"the signed-out cookie": cookie, "the owner's other session": other} {
		res, _ := dashRequest(t, http.MethodGet, base+"/app/", c, nil, nil)
		if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/app/login") {
			t.Errorf("%s after sign-out: %s to %q, want a redirect to the sign-in page", name, res.Status, res.Header.Get("Location"))
		}
		if res, _ := dashRequest(t, http.MethodGet, base+"/app/api/v1/workflows", c, nil, nil); res.StatusCode == http.StatusOK {
			t.Errorf("%s still reads the API after sign-out", name)
		}
	}
	// Signing in again works.
	dashSession(t, base, p.srv.token)
}

// Guessing tokens is slow: after 10 failed sign-ins from an address in a
// minute, every sign-in from it is refused with 429 for the rest of the
// minute, the right token too.
func TestSignInIsThrottled(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	try := func(token string) int {
		t.Helper()
		res, body := dashRequest(t, http.MethodGet, p.srv.url+"/app/login", nil, nil, nil)
		var login *http.Cookie
		for _, c := range res.Cookies() {
			if c.Name == "cp_login" {
				login = c
			}
		}
		csrf := csrfField.FindStringSubmatch(body)
		if login == nil || csrf == nil {
			t.Fatalf("the sign-in page has no CSRF cookie or field")
		}
		res, _ = dashRequest(t, http.MethodPost, p.srv.url+"/app/login", login, url.Values{"csrf": {csrf[1]}, "token": {token}}, nil)
		return res.StatusCode
	}
	for i := range 10 {
		if code := try("cp_guess"); code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, code)
		}
	}
	if code := try("cp_guess"); code != http.StatusTooManyRequests {
		t.Errorf("guess 11: %d, want 429", code)
	}
	if code := try(p.srv.token); code != http.StatusTooManyRequests {
		t.Errorf("the right token after 10 guesses: %d, want 429 until the minute has passed", code)
	}
}
