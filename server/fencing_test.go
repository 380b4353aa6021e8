package server

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
)

// An outcome counts only for an attempt its connection holds: one for any
// other attempt is refused in memory, never queued for the database. One
// whose commit failed (the ack said retry) is accepted again; one being
// committed, or settled, is not. Its payload bytes are held in the
// connection's and the replica's budgets until its commit is settled.
func TestOutcomesAreFencedByConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	if _, err := f.st.CreateWorkflow(ctx, f.owner.ID, f.oneTask()); err != nil {
		t.Fatal(err)
	}
	cands, _, err := f.st.Candidates(ctx, 1, nil)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v: %v", cands, err)
	}
	claimed, err := f.st.ClaimPicks(ctx, []store.Pick{{TaskID: cands[0].TaskID, Worker: f.worker.ID}}, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claimed %v: %v", claimed, err)
	}
	attempt := claimed[0].Attempt
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	c := socketless(s, f.worker.ID, 1)

	// result sends a result for a as a frame of n payload bytes held in
	// the budgets, and reports whether it was queued for the database.
	result := func(a int64, n int64) bool {
		t.Helper()
		_, limit := s.payloadLimits()
		if err := c.inflight.acquire(ctx, n, limit); err != nil {
			t.Fatal(err)
		}
		if err := s.hub.payload.acquire(ctx, n, limit); err != nil {
			t.Fatal(err)
		}
		hold := &payloadHold{n: n, budgets: []*byteBudget{&c.inflight, &s.hub.payload}}
		hold.refs.Store(1)
		c.hold = hold
		err := s.handleFrame(ctx, c, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{Attempt: a,
			Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("out\n")}}}}})
		c.hold = nil
		hold.done()
		if err != nil {
			t.Fatal(err)
		}
		return len(s.completions.in) > 0
	}
	held := func() int64 {
		t.Helper()
		if a, b := c.inflight.held(), s.hub.payload.held(); a != b {
			t.Fatalf("the connection holds %d payload bytes, the replica %d", a, b)
		}
		return c.inflight.held()
	}
	flush := func(ctx context.Context) {
		t.Helper()
		s.flushCompletions(ctx, <-s.completions.in)
	}

	if result(attempt+1000, 1<<20) {
		t.Fatal("a result for an attempt never assigned to the connection was queued")
	}
	if n := held(); n != 0 {
		t.Fatalf("%d bytes held after a refused result", n)
	}
	if _, ok := s.hub.started(c, []protocol.Assign{{Attempt: attempt, Module: f.module}}, []int64{0}); !ok {
		t.Fatal("started refused")
	}
	s.hub.setFree(c, 0)
	if !result(attempt, 100) {
		t.Fatal("the result of an attempt the connection holds was not queued")
	}
	if free := s.hub.freeOf(c); free != 1 {
		t.Errorf("free slots %d after the result arrived, want 1", free)
	}
	if n := held(); n != 100 {
		t.Errorf("%d payload bytes held while the result waits for its commit, want 100", n)
	}
	if result(attempt, 10) && len(s.completions.in) > 1 {
		t.Fatal("a second result of an attempt whose result is being committed was queued")
	}

	// The commit fails: the worker is told to retry, and may.
	failed, cancel := context.WithCancel(ctx)
	cancel()
	flush(failed)
	if n := held(); n != 0 {
		t.Errorf("%d payload bytes held after the commit's verdict", n)
	}
	// Until it is committed, the worker's heartbeats keep its lease (the
	// outcome waits at the worker); an attempt the connection never held
	// is not renewed.
	if err := s.handleFrame(ctx, c, &protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{
		Running: []protocol.Progress{{Attempt: attempt, Fraction: 1}, {Attempt: attempt + 1000, Fraction: 1}}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case rs := <-s.renewals.in:
		if len(rs) != 1 || rs[0].r.Attempt != attempt {
			t.Errorf("renewals %+v, want attempt %d's alone", rs, attempt)
		}
	default:
		t.Error("a heartbeat listing an attempt whose outcome waits for a retry renewed nothing")
	}
	if !result(attempt, 100) {
		t.Fatal("a result sent again after an ack saying retry was refused")
	}
	flush(ctx)
	if len(c.outcomes) != 0 || held() != 0 {
		t.Errorf("after the commit: outcomes %v, %d bytes held; want none", c.outcomes, held())
	}
	if st, err := f.st.Attempts(ctx, f.owner.ID, claimed[0].WorkflowID, claimed[0].Name); err != nil || len(st) != 1 || st[0].State != "succeeded" {
		t.Fatalf("attempts after the commit: %+v, %v", st, err)
	}
	if result(attempt, 100) {
		t.Fatal("a result of an attempt already committed was queued")
	}
}

// A checkpoint for an attempt the connection does not hold is refused
// without a database round trip.
func TestCheckpointNotHeldIsRefused(t *testing.T) {
	t.Parallel()
	s := New(nil, Config{Replica: "test", Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	c := socketless(s, "w", 1)
	// A nil store: any database work would panic.
	err := s.handleFrame(context.Background(), c, &protocol.Frame{Type: protocol.TypeCheckpoint,
		Checkpoint: &protocol.Checkpoint{Attempt: 7, Seq: 1, State: protocol.Blob{Data: []byte("x")}}})
	if err != nil {
		t.Fatal(err)
	}
}

// A budget gives bytes up to its limit, then waits for releases; one
// holding nothing gives any amount.
func TestByteBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var b byteBudget
	if err := b.acquire(ctx, 300, 100); err != nil {
		t.Fatal(err)
	}
	b.release(300)
	if err := b.acquire(ctx, 60, 100); err != nil {
		t.Fatal(err)
	}
	got := make(chan error)
	go func() { got <- b.acquire(ctx, 60, 100) }()
	select {
	case err := <-got:
		t.Fatalf("acquired over the limit: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.release(60)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.acquire(short, 60, 100); err == nil {
		t.Fatal("acquired over the limit with a cancelled context")
	}
}

// Bytes go in the order they were asked for: a large frame waiting for
// room is not passed by smaller ones asked for later as room frees
// (before, other connections' small frames could hold it back for as long
// as they kept coming), and one whose context ends lets those behind it go.
func TestByteBudgetInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var b byteBudget
	waiting := func(n int, what string) {
		t.Helper()
		for giveUp := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			b.mu.Lock()
			q := len(b.queue)
			b.mu.Unlock()
			if q == n {
				return
			}
			if time.Now().After(giveUp) {
				t.Fatalf("%d requests waiting, want %d: %s", q, n, what)
			}
		}
	}
	if err := b.acquire(ctx, 60, 100); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 2)
	ask := func(who string, n int64) {
		go func() {
			if err := b.acquire(ctx, n, 100); err != nil {
				t.Error(err)
			}
			order <- who
		}()
	}
	ask("large", 80) // 140 > 100: waits
	waiting(1, "the large frame waits")
	ask("small", 30) // 90 would fit, but it comes after the large one
	waiting(2, "the small frame waits behind the large one")
	b.release(60) // room for the large one (80), then not for the small (110)
	if first := <-order; first != "large" {
		t.Fatalf("%s got its bytes first, want the large frame", first)
	}
	waiting(1, "the small frame waits for room")
	b.release(80)
	if second := <-order; second != "small" {
		t.Fatalf("%s got its bytes second", second)
	}

	// 30 held: a frame whose context ends lets the one behind it go.
	gone, cancel := context.WithCancel(ctx)
	failed := make(chan error, 1)
	go func() { failed <- b.acquire(gone, 90, 100) }()
	waiting(1, "a frame waits for room")
	ask("behind", 50)
	waiting(2, "a frame waits behind it")
	cancel()
	if err := <-failed; err == nil {
		t.Error("a frame whose context ended got its bytes")
	}
	if got := <-order; got != "behind" {
		t.Fatalf("%s got its bytes, want the frame behind the one gone", got)
	}
	b.release(80)
	if b.held() != 0 || len(b.queue) != 0 {
		t.Errorf("all given back: %d held, %d waiting", b.held(), len(b.queue))
	}
}
