package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

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

func (fakeBackend) SessionGeneration(context.Context, int64) (int64, error) { return 0, nil }

func (fakeBackend) EndSessions(context.Context, int64) error { return nil }

func (fakeBackend) SubmissionTurn(ctx context.Context, _ store.Owner, _ int64) (context.Context, func(), error) {
	return ctx, func() {}, nil
}

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

// apiRecorder is a Backend whose API records the requests that reach it.
type apiRecorder struct {
	fakeBackend
	calls *[]string
}

func (b apiRecorder) API() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*b.calls = append(*b.calls, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	})
}

// Every form that changes something needs the session's CSRF token, sent
// URL-encoded or as multipart: without it nothing reaches the API.
func TestFormsNeedTheCSRFToken(t *testing.T) {
	var calls []string
	hd := New(apiRecorder{calls: &calls}, Options{Key: make([]byte, 32)})
	h := hd.(*handler)
	sess := session{OwnerID: 1, Owner: "ada", Expires: time.Now().Add(time.Hour).Unix(), Nonce: "n0nce"}
	cookie := &http.Cookie{Name: sessionCookie, Value: h.sign("session", sess)}
	post := func(path, csrf string, multi bool) int {
		var body bytes.Buffer
		ct := "application/x-www-form-urlencoded"
		if multi {
			mw := multipart.NewWriter(&body)
			if csrf != "" {
				_ = mw.WriteField("csrf", csrf)
			}
			_ = mw.WriteField("x", "y")
			_ = mw.Close()
			ct = mw.FormDataContentType()
		} else if csrf != "" {
			body.WriteString(url.Values{"csrf": {csrf}}.Encode())
		}
		req := httptest.NewRequest(http.MethodPost, "http://localhost/"+strings.TrimPrefix(path, "/"), &body)
		req.Header.Set("Content-Type", ct)
		req.AddCookie(cookie)
		rec := httptest.NewRecorder()
		hd.ServeHTTP(rec, req)
		return rec.Code
	}
	paths := []string{"/app/logout", "/app/workflows/w1/cancel", "/app/workflows/w1/tasks/t1/cancel", "/app/submit"}
	for _, path := range paths {
		for _, multi := range []bool{false, true} {
			for _, csrf := range []string{"", "forged"} {
				if code := post(path, csrf, multi); code != http.StatusForbidden {
					t.Errorf("POST %s (multipart %v, csrf %q): %d, want 403", path, multi, csrf, code)
				}
			}
		}
	}
	if len(calls) != 0 {
		t.Fatalf("forms without a valid CSRF token reached the API: %v", calls)
	}
	for _, multi := range []bool{false, true} {
		if code := post("/app/workflows/w1/tasks/t1/cancel", h.csrf(sess), multi); code != http.StatusSeeOther {
			t.Errorf("cancel with the token (multipart %v): %d, want 303", multi, code)
		}
	}
	if want := "POST /api/v1/workflows/w1/tasks/t1/cancel"; len(calls) != 2 || calls[0] != want || calls[1] != want {
		t.Errorf("API calls = %v, want %q twice", calls, want)
	}
}
