//go:build unix

package e2e

import (
	"context"
	"testing"
	"time"
)

// Cancelling a workflow stops a task stuck in an infinite loop on its worker
// (the slot is free again and runs the next task) and cancels what had not
// run.
func TestCancelStopsRunningInfiniteLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	startWorker(t, "worker", 1, p.srv.url)
	spin := push(t, p.client, "spin")
	noop := push(t, p.client, "noop")
	id := submit(t, p.client, workflow("spin",
		task{"name": "loop", "module": spin},
		task{"name": "after", "module": noop, "inputs": map[string]any{"x": map[string]any{"from": "loop"}}},
	))
	eventually(t, 30*time.Second, "the loop to run", func() bool {
		st, err := p.client.Status(ctx, id)
		return err == nil && st.Tasks[0].State == "running"
	})
	time.Sleep(300 * time.Millisecond) // let it spin for real
	cancelled := time.Now()
	st, err := p.client.Cancel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "cancelled" || st.Tasks[0].State != "cancelled" || st.Tasks[1].State != "cancelled" {
		t.Fatalf("after cancel: workflow %s, tasks %s and %s", st.State, st.Tasks[0].State, st.Tasks[1].State)
	}
	// The only slot must come free: a new workflow runs on it, within a
	// minute, while the loop would have run for its whole wall time.
	next := submit(t, p.client, workflow("next", task{"name": "n", "module": noop}))
	done := wait(t, p.client, next, time.Minute)
	if done.State != "done" {
		t.Fatalf("next workflow ended %s", done.State)
	}
	t.Logf("the slot came free %v after the cancel", time.Since(cancelled))
	as, err := p.client.Attempts(ctx, id, "loop")
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || as[0].State != "cancelled" {
		t.Fatalf("attempts of the loop: %+v", as)
	}
	// Cancelling again changes nothing.
	if st, err := p.client.Cancel(ctx, id); err != nil || st.State != "cancelled" {
		t.Fatalf("second cancel: %v, %v", st, err)
	}
}
