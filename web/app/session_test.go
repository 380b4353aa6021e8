package app

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/store"
)

// fakeBackend knows one owner token; the rest of Backend is not used by
// the sign-in pages.
type fakeBackend struct{ Backend }

func (fakeBackend) OwnerByToken(_ context.Context, token string) (store.Owner, error) {
	if token == "cp_good" {
		return store.Owner{ID: 1, Name: "ada"}, nil
	}
	return store.Owner{}, store.ErrNotFound
}

func (fakeBackend) API() http.Handler { return http.NotFoundHandler() }

// The session cookie is Secure whenever the browser will send it back, and
// only then; over plain HTTP to another host the sign-in page warns that
// the connection is not encrypted, and signing in still works.
func TestCookieSecureOnlyWhereItComesBack(t *testing.T) {
	h := New(fakeBackend{}, Options{Key: make([]byte, 32)})
	tests := []struct {
		name, host, proto string
		tls               bool
		secure            bool
	}{
		{"localhost", "localhost:8080", "", false, true},
		{"127.0.0.1", "127.0.0.1:8080", "", false, true},
		{"IPv6 loopback", "[::1]:8080", "", false, true},
		{"a .localhost name", "app.localhost", "", false, true},
		{"TLS here", "example.org", "", true, true},
		{"TLS at a proxy", "example.org", "https", false, true},
		{"plain HTTP on the LAN", "192.168.1.20:8080", "", false, false},
		{"plain HTTP to a name", "cyclepool.example.org", "http", false, false},
		{"a name that only starts like localhost", "localhost.example.org", "", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "http://"+tc.host+"/app/login", nil)
			if tc.proto != "" {
				req.Header.Set("X-Forwarded-Proto", tc.proto)
			}
			if tc.tls {
				req.TLS = &tls.ConnectionState{}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			res := rec.Result()
			body, _ := io.ReadAll(res.Body)
			login := cookieNamed(res.Cookies(), loginCookie)
			if login == nil || login.Secure != tc.secure || !login.HttpOnly || login.SameSite != http.SameSiteStrictMode {
				t.Fatalf("sign-in cookie %+v, want Secure=%v, HttpOnly, SameSite=Strict", login, tc.secure)
			}
			if warned := strings.Contains(string(body), `id="insecure-warning"`); warned == tc.secure {
				t.Errorf("warning shown = %v, want %v", warned, !tc.secure)
			}

			// Sign in with the form: the session cookie follows the same rule.
			m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindSubmatch(body)
			if m == nil {
				t.Fatal("no CSRF field on the sign-in page")
			}
			form := url.Values{"csrf": {string(m[1])}, "token": {"cp_good"}}
			req = httptest.NewRequest(http.MethodPost, "http://"+tc.host+"/app/login", strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.AddCookie(login)
			if tc.proto != "" {
				req.Header.Set("X-Forwarded-Proto", tc.proto)
			}
			if tc.tls {
				req.TLS = &tls.ConnectionState{}
			}
			rec = httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			sess := cookieNamed(rec.Result().Cookies(), sessionCookie)
			if rec.Code != http.StatusSeeOther || sess == nil || sess.Secure != tc.secure || !sess.HttpOnly {
				t.Fatalf("sign-in answered %d with session cookie %+v, want 303 and Secure=%v", rec.Code, sess, tc.secure)
			}
		})
	}
}

func cookieNamed(cs []*http.Cookie, name string) *http.Cookie {
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	return nil
}
