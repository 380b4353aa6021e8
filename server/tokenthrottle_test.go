package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/throttle"
)

// Wrong bearer tokens from one address are looked up until the address is
// past its failures (its IPv6 /64 counted as one); then its unknown tokens
// are answered 429 with Retry-After and no query: with the database
// closed, they still are, where a lookup would fail. A cached token from
// that address is served, and so is any token from another address.
func TestAPITokenGuessesThrottled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	other, err := f.st.CreateOwner(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, NewWorkerEvery: -1, Logger: slog.New(slog.DiscardHandler)})
	h := s.authed(func(w http.ResponseWriter, r *http.Request, o store.Owner) { fmt.Fprint(w, o.Name) })
	const (
		guesser  = "[2001:db8:1:2::1]:40000"
		neighbor = "[2001:db8:1:2:ffff::7]:40001" // the guesser's /64
		honest   = "192.0.2.1:40002"
	)
	type step struct {
		name     string
		addr     string
		token    string
		want     int  // 0: a server error (5xx)
		closeDB  bool // before the request
		repeat   int  // times the request is sent (0: once)
		wantBody string
	}
	steps := []step{
		{name: "wrong tokens under the bound", addr: guesser, token: "guess", want: http.StatusUnauthorized, repeat: throttle.DefaultFailures - 1},
		{name: "the last one under the bound, from the same /64", addr: neighbor, token: "guess", want: http.StatusUnauthorized},
		{name: "past the bound", addr: guesser, token: "guess", want: http.StatusTooManyRequests},
		{name: "past the bound, from the same /64", addr: neighbor, token: "guess", want: http.StatusTooManyRequests},
		{name: "a valid token, not cached, from the guesser", addr: guesser, token: other, want: http.StatusTooManyRequests},
		{name: "another address, a valid token", addr: honest, token: f.token, want: http.StatusOK, wantBody: "owner"},
		{name: "another address, a wrong token", addr: honest, token: "typo", want: http.StatusUnauthorized},
		{name: "the guesser, a cached token", addr: guesser, token: f.token, want: http.StatusOK, wantBody: "owner"},
		{name: "database closed: the guesser's wrong tokens", closeDB: true, addr: guesser, token: "guess", want: http.StatusTooManyRequests, repeat: 100},
		{name: "database closed: another address's lookup fails", addr: "192.0.2.3:40003", token: "guess"},
		{name: "database closed: a cached token", addr: guesser, token: f.token, want: http.StatusOK, wantBody: "owner"},
	}
	for _, st := range steps {
		if st.closeDB {
			f.st.Close()
		}
		for range max(st.repeat, 1) {
			req := httptest.NewRequest(http.MethodGet, "/api/v1/workers", nil)
			req.RemoteAddr = st.addr
			req.Header.Set("Authorization", "Bearer "+st.token)
			rec := httptest.NewRecorder()
			h(rec, req)
			if st.want == 0 && rec.Code >= 500 {
				continue
			}
			if rec.Code != st.want {
				t.Fatalf("%s: status %d (%s), want %d", st.name, rec.Code, rec.Body, st.want)
			}
			if st.want == http.StatusTooManyRequests && rec.Header().Get("Retry-After") == "" {
				t.Fatalf("%s: 429 without Retry-After", st.name)
			}
			if st.wantBody != "" && rec.Body.String() != st.wantBody {
				t.Fatalf("%s: served %q, want %q", st.name, rec.Body, st.wantBody)
			}
		}
	}
}

// Wrong secrets sent through any door count against one budget per
// address: wrong owner tokens to the API hold the dashboard's sign-in and
// unknown operator keys too (429 with Retry-After), while an operator key
// accepted before is still accepted.
func TestWrongSecretsShareOneBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	_, wsURL := runServer(t, f)
	base := "http" + strings.TrimSuffix(strings.TrimPrefix(wsURL, "ws"), "/ws/worker")
	if err := f.st.AddOperatorKey(ctx, "key-a"); err != nil {
		t.Fatal(err)
	}
	dial := func(key string) *http.Response {
		t.Helper()
		ws, resp, err := websocket.DefaultDialer.DialContext(ctx, wsURL, http.Header{"Authorization": {"Bearer " + key}})
		if err == nil {
			ws.Close()
		}
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		return resp
	}
	if res := dial("key-a"); res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("a known operator key: %s", res.Status)
	}
	for i := range throttle.DefaultFailures {
		req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer guess")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %s, want 401", i+1, res.Status)
		}
	}
	if res := dial("key-b"); res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Errorf("an unknown operator key past the budget: %s, want 429 with Retry-After", res.Status)
	}
	if res := dial("key-a"); res.StatusCode != http.StatusSwitchingProtocols {
		t.Errorf("an operator key accepted before, past the budget: %s, want 101", res.Status)
	}
	res, err := http.Get(base + "/app/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	m := dashCSRF.FindSubmatch(body)
	if m == nil || len(res.Cookies()) == 0 {
		t.Fatalf("the sign-in page has no CSRF field or cookie:\n%s", body)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/app/login", strings.NewReader(url.Values{"csrf": {string(m[1])}, "token": {"guess"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for _, c := range res.Cookies() {
		req.AddCookie(c)
	}
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Errorf("a dashboard sign-in past the budget: %s, want 429 with Retry-After", res.Status)
	}
}

// Wrong tokens sent at once from one address are looked up no more than
// the address's failures allow: requests that arrive while lookups are in
// flight wait for their outcome instead of all passing the check first.
func TestAPITokenGuessesAtOnceThrottled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, NewWorkerEvery: -1, Logger: slog.New(slog.DiscardHandler)})
	h := s.authed(func(w http.ResponseWriter, r *http.Request, o store.Owner) { fmt.Fprint(w, o.Name) })
	const n = 200
	codes := make(chan int, n)
	start := make(chan struct{})
	for i := range n {
		go func() {
			<-start
			req := httptest.NewRequest(http.MethodGet, "/api/v1/workers", nil)
			req.RemoteAddr = "192.0.2.9:40000"
			req.Header.Set("Authorization", fmt.Sprintf("Bearer guess-%d", i))
			rec := httptest.NewRecorder()
			h(rec, req)
			codes <- rec.Code
		}()
	}
	close(start)
	looked := 0
	for range n {
		switch c := <-codes; c {
		case http.StatusUnauthorized:
			looked++
		case http.StatusTooManyRequests:
		default:
			t.Errorf("status %d, want 401 or 429", c)
		}
	}
	if looked > throttle.DefaultFailures {
		t.Errorf("%d of %d wrong tokens sent at once were looked up, want at most %d", looked, n, throttle.DefaultFailures)
	}
}
