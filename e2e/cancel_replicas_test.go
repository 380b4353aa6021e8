//go:build unix

package e2e

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// A workflow cancelled through replica A stops its infinite loop running on
// the only worker, which is connected to replica B alone (the cancel travels
// from A to B by LISTEN/NOTIFY): within a few seconds the worker's only slot
// is free and runs the next task, without the worker reconnecting. The
// lease is 5 minutes, so the worker heartbeats once a minute and a
// heartbeat's lost lease cannot be what stops the loop.
func TestCancelOnOneReplicaStopsAttemptOnAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migratedDB(t)
	ra := startServer(t, "replicaA", db, t.TempDir(), 0, "--lease", "5m")
	rb := startServer(t, "replicaB", db, t.TempDir(), 0, "--lease", "5m")
	ca := client.New(ra.url, ra.token)
	w := startWorker(t, "worker", 1, rb.url)
	if server, _ := w.out.waitFor(regexp.MustCompile(`msg=connected server=(\S+)`), 0); server != rb.url {
		t.Fatalf("the worker connected to %q, want replica B (%s)", server, rb.url)
	}
	workerID, _ := w.out.waitFor(regexp.MustCompile(`msg=connected .*worker=(\S+)`), 0)

	spin := push(t, ca, "spin")
	noop := push(t, ca, "noop")
	id := submit(t, ca, workflow("spin",
		task{"name": "loop", "module": spin},
		task{"name": "after", "module": noop, "inputs": map[string]any{"x": map[string]any{"from": "loop"}}},
	))
	eventually(t, 30*time.Second, "the loop to run on the worker", func() bool {
		as, err := ca.Attempts(ctx, id, "loop")
		return err == nil && len(as) == 1 && as[0].State == "running"
	})
	if as := attempts(t, ca, id, "loop"); as[0].Worker != workerID {
		t.Fatalf("the loop runs on worker %s, want %s (on replica B)", as[0].Worker, workerID)
	}

	cancelled := time.Now()
	st, err := ca.Cancel(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != client.WorkflowCancelled || st.Task("loop").State != client.TaskCancelled || st.Task("after").State != client.TaskCancelled {
		t.Fatalf("after cancel: workflow %s, tasks %+v", st.State, st.Tasks)
	}
	// The worker's only slot must come free: a new workflow runs on it.
	next := submit(t, ca, workflow("next", task{"name": "n", "module": noop}))
	// Within a minute, while the loop would have run for its whole wall
	// time: the cancel reached the worker through the other replica.
	done := wait(t, ca, next, time.Minute)
	took := time.Since(cancelled)
	if done.State != client.WorkflowDone {
		t.Fatalf("next workflow ended %s: %+v", done.State, done.Tasks)
	}
	t.Logf("the slot came free %v after the cancel", took)
	if as := attempts(t, ca, next, "n"); len(as) != 1 || as[0].Worker != workerID || as[0].State != "succeeded" {
		t.Errorf("attempts of the next task: %+v, want one that succeeded on worker %s", as, workerID)
	}
	if as := attempts(t, ca, id, "loop"); len(as) != 1 || as[0].State != "cancelled" {
		t.Errorf("attempts of the loop: %+v, want one cancelled", as)
	}
	if n := countLines(w.out, regexp.MustCompile(`msg=connected`)); n != 1 {
		t.Errorf("the worker connected %d times, want once (to replica B)", n)
	}
}
