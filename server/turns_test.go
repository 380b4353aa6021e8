package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/workflow"
)

// Turns go to whoever fits under both bounds, the whole and the owner's;
// a request larger than an owner's share counts as that share.
func TestTurns(t *testing.T) {
	t.Parallel()
	u := newTurns(10, 6)
	ctx := context.Background()
	gone, cancel := context.WithCancel(ctx)
	cancel() // a request that cannot wait: it takes a turn only if one is free
	r1, err := u.acquire(ctx, 1, 6)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.acquire(gone, 1, 1); err == nil {
		t.Error("an owner past its share got a turn")
	}
	r2, err := u.acquire(gone, 2, 4)
	if err != nil {
		t.Errorf("another owner under the bound of the whole got no turn: %v", err)
	}
	if _, err := u.acquire(gone, 3, 1); err == nil {
		t.Error("a turn past the whole")
	}
	r1()
	r1() // twice: gives back once
	if u.busy != 4 {
		t.Errorf("%d units busy, want 4", u.busy)
	}
	r4, err := u.acquire(gone, 4, 100) // counted as a share: 6 of the 6 left
	if err != nil {
		t.Errorf("a request larger than a share got no turn with room for a share: %v", err)
	}
	if u.busy != 10 {
		t.Errorf("%d units busy, want 10", u.busy)
	}
	r2()
	r4()
	if u.busy != 0 || len(u.owners) != 0 {
		t.Errorf("all given back: busy %d, owners %v", u.busy, u.owners)
	}
}

// Turns go in the order they were asked for: a request waiting for room is
// not passed by later, smaller ones as room frees (before, a stream of
// them kept a large request waiting until its context ended), while a
// request past its owner's share holds back only its owner's.
func TestTurnsInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := newTurns(16, 8)
	take := func(owner, n int64) func() {
		t.Helper()
		r, err := u.acquire(ctx, owner, n)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waiting := func(n int64, what string) {
		t.Helper()
		for giveUp := time.Now().Add(30 * time.Second); u.waiting.Load() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(giveUp) {
				t.Fatalf("%d requests waiting, want %d: %s", u.waiting.Load(), n, what)
			}
		}
	}
	a, c := take(1, 5), take(3, 5) // 10 of 16 busy
	type got struct {
		who     string
		release func()
	}
	given := make(chan got, 3)
	wait := func(who string, owner, n int64) {
		go func() {
			r, err := u.acquire(ctx, owner, n)
			if err != nil {
				t.Error(err)
			}
			given <- got{who, r}
		}()
	}
	wait("large", 2, 8) // 18 > 16: waits for room
	waiting(1, "the large request waits")
	wait("small", 4, 4) // 14 would fit, but it comes after the large one
	waiting(2, "the small request waits behind the large one")
	// Past its share, owner 1 waits, and holds back no one else.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := u.acquire(gone, 1, 4); err == nil {
		t.Error("an owner past its share got a turn")
	}
	a() // 5 busy: room for the large request, then not for the small
	first := <-given
	if first.who != "large" {
		t.Fatalf("%s got the first turn as room freed, want the large request asked first", first.who)
	}
	select {
	case g := <-given:
		t.Fatalf("%s got a turn with %d of %d busy", g.who, u.busy, u.limit)
	default:
	}
	c()
	if second := <-given; second.who != "small" {
		t.Fatalf("%s got the second turn, want the small request", second.who)
	} else {
		second.release()
	}
	first.release()
	if u.busy != 0 || len(u.owners) != 0 || len(u.queue) != 0 {
		t.Errorf("all given back: busy %d, owners %v, %d waiting", u.busy, u.owners, len(u.queue))
	}

	// A request whose context ends while it waits lets those behind it go.
	hold := take(5, 8)
	hold2 := take(6, 6) // 14 busy
	wctx, stop := context.WithCancel(ctx)
	failed := make(chan error, 1)
	go func() {
		_, err := u.acquire(wctx, 7, 8)
		failed <- err
	}()
	waiting(1, "a request waits for room")
	wait("behind", 8, 2)
	waiting(2, "a small request waits behind it")
	stop()
	if err := <-failed; err == nil {
		t.Error("a request whose context ended got a turn")
	}
	if g := <-given; g.who != "behind" {
		t.Fatalf("%s got a turn, want the request behind the one gone", g.who)
	} else {
		g.release()
	}
	hold()
	hold2()
	if u.busy != 0 || len(u.owners) != 0 || len(u.queue) != 0 {
		t.Errorf("all given back: busy %d, owners %v, %d waiting", u.busy, u.owners, len(u.queue))
	}
}

// refusedWorkflow is a workflow file of about size bytes, refused once
// parsed (its module was never pushed), so that it writes nothing.
func refusedWorkflow(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"name":"large","tasks":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"t%06d","module":"sha256:%064x"}`, i, 7)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// Workflow files wait for their turn unread: an owner who sends many large
// submissions at once holds no more than the turns allow (each took about
// 15 times its size while parsed and written, without bound). A small
// submission does not wait behind large ones.
func TestSubmissionsAreBounded(t *testing.T) {
	f := newFixture(t)
	s := New(f.st, Config{Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	submit := func(body []byte) *http.Request {
		req, _ := http.NewRequest("POST", ts.URL+"/api/v1/workflows", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+f.token)
		return req
	}
	large := refusedWorkflow(4 << 20)
	if len(large) <= smallSubmission || len(large) > workflow.MaxFileSize {
		t.Fatalf("a file of %d bytes", len(large))
	}
	u := s.submissions.large
	var held []func() // every large turn, as other owners
	for i := int64(0); i*u.perOwner < u.limit; i++ {
		release, err := u.acquire(context.Background(), -1-i, u.perOwner)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	small := fmt.Appendf(nil, `{"name":"small","tasks":[{"name":"a","module":%q}]}`, f.module)
	resp, err := http.DefaultClient.Do(submit(small))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("a small submission while large ones wait: %d, want 201", resp.StatusCode)
	}
	for _, release := range held {
		release()
	}
	waitUnread(t, u, 8, len(large), http.StatusBadRequest, func() *http.Request { return submit(large) })
}
