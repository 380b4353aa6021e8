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
