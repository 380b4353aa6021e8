//go:build linux

package headless

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// pipelined returns an isolated Runner with one slot process that has the
// noop module and module warm loaded, and that pipelines attempts whatever
// they last took; queued attempts wait up to wait behind a running one.
func pipelined(t *testing.T, wait time.Duration, warm *wasmworker.Job) *Runner {
	t.Helper()
	r := isolated(t, Config{})
	r.pool.pipe = pipelining{depth: 4, minBusy: 1, short: time.Hour, wait: wait}
	for _, j := range []*wasmworker.Job{rawJob(wasmtest.Noop()), warm} {
		if o := r.Run(context.Background(), j); o.Reason != "" {
			t.Fatalf("warm-up: %s: %s", o.Reason, o.Message)
		}
	}
	if n := len(r.pool.pids()); n != 1 {
		t.Fatalf("%d slot processes after the warm-up, want 1", n)
	}
	return r
}

// counts returns how many attempts were queued behind another, and how many
// of them were revoked.
func counts(r *Runner) (followed, revoked int) {
	r.pool.mu.Lock()
	defer r.pool.mu.Unlock()
	return r.pool.followed, r.pool.revoked
}

// startSpin starts a spin that never ends and waits until it runs.
func startLongSpin(t *testing.T, r *Runner) (context.CancelFunc, chan *wasmworker.Outcome) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	j, _ := job(t, "spin", protocol.Assign{})
	out := make(chan *wasmworker.Outcome, 1)
	go func() { out <- r.Run(ctx, j) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(r.pool.pids(true)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the spin did not start")
		}
		time.Sleep(time.Millisecond)
	}
	return cancel, out
}

// runNoops starts n noop attempts with ctx and waits until they are queued
// behind the running attempt.
func runNoops(t *testing.T, r *Runner, ctx context.Context, n int) chan *wasmworker.Outcome {
	t.Helper()
	f0, _ := counts(r)
	outs := make(chan *wasmworker.Outcome, n)
	for range n {
		go func() { outs <- r.Run(ctx, rawJob(wasmtest.Noop())) }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if f, _ := counts(r); f-f0 == n {
			return outs
		}
		if time.Now().After(deadline) {
			r.pool.mu.Lock()
			var state []string
			for c := range r.pool.all {
				state = append(state, fmt.Sprintf("slot %d: %d tickets, open %v, seq %d, modules %d, dead %v",
					c.id, len(c.tickets), c.open, c.seq, len(c.modules), c.isDead()))
			}
			r.pool.mu.Unlock()
			t.Fatalf("the noops did not queue behind the running attempt: %s", strings.Join(state, "; "))
		}
		time.Sleep(time.Millisecond)
	}
}

func wantOutcome(t *testing.T, what string, outs chan *wasmworker.Outcome, reason string) {
	t.Helper()
	select {
	case o := <-outs:
		if o.Reason != reason {
			t.Errorf("%s: reason %q (%s), want %q", what, o.Reason, o.Message, reason)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no outcome", what)
	}
}

// Attempts queued behind one that runs long are revoked and run in another
// slot process, as if nothing had happened.
func TestPipelinedSlowAttemptRevokesQueue(t *testing.T) {
	spinWarm, _ := job(t, "spin", protocol.Assign{Args: []string{"100"}})
	r := pipelined(t, 300*time.Millisecond, spinWarm)
	cancel, spin := startLongSpin(t, r)
	outs := runNoops(t, r, context.Background(), 3)
	for range 3 {
		wantOutcome(t, "queued noop", outs, "")
	}
	if _, revoked := counts(r); revoked != 3 {
		t.Errorf("%d attempts revoked, want 3", revoked)
	}
	select {
	case o := <-spin:
		t.Fatalf("the spin ended: %s: %s", o.Reason, o.Message)
	default:
	}
	cancel()
	wantOutcome(t, "spin", spin, protocol.ReasonCancelled)
}

// Cancelling a queued attempt revokes it without touching the running one;
// cancelling the running one kills its slot process, and the attempts
// queued behind it run elsewhere.
func TestPipelinedCancel(t *testing.T) {
	spinWarm, _ := job(t, "spin", protocol.Assign{Args: []string{"100"}})
	r := pipelined(t, time.Hour, spinWarm)
	cancelSpin, spin := startLongSpin(t, r)
	pids := r.pool.pids()

	ctx, cancel := context.WithCancel(context.Background())
	outs := runNoops(t, r, ctx, 2)
	cancel()
	for range 2 {
		wantOutcome(t, "cancelled queued noop", outs, protocol.ReasonCancelled)
	}
	if got := r.pool.pids(); len(got) != 1 || got[0] != pids[0] {
		t.Errorf("slot processes %v after cancelling queued attempts, want %v", got, pids)
	}

	outs = runNoops(t, r, context.Background(), 3)
	cancelSpin()
	wantOutcome(t, "spin", spin, protocol.ReasonCancelled)
	for range 3 {
		wantOutcome(t, "noop queued behind the cancelled spin", outs, "")
	}
	if _, revoked := counts(r); revoked != 5 {
		t.Errorf("%d attempts revoked, want 5", revoked)
	}
}

// A running attempt's checkpoints are relayed while attempts wait behind it
// in its slot process's pipe.
func TestPipelinedCheckpoints(t *testing.T) {
	warm, _ := job(t, "counter", protocol.Assign{Args: []string{"1", "0"}})
	r := pipelined(t, time.Hour, warm)
	j, h := job(t, "counter", protocol.Assign{Args: []string{"200", "5"}, CkptMS: 1})
	out := make(chan *wasmworker.Outcome, 1)
	go func() { out <- r.Run(context.Background(), j) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(r.pool.pids(true)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the counter did not start")
		}
		time.Sleep(time.Millisecond)
	}
	outs := runNoops(t, r, context.Background(), 3)
	select {
	case o := <-out:
		if o.Reason != "" || outputs(o)["stdout"] != "counted 200 from 0\n" {
			t.Fatalf("counter: %s: %s %q", o.Reason, o.Message, outputs(o)["stdout"])
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the counter did not end")
	}
	h.mu.Lock()
	n := len(h.checkpoints)
	h.mu.Unlock()
	if n == 0 {
		t.Error("no checkpoints relayed")
	}
	for range 3 {
		wantOutcome(t, "queued noop", outs, "")
	}
	if _, revoked := counts(r); revoked != 0 {
		t.Errorf("%d attempts revoked, want 0", revoked)
	}
}
