//go:build unix

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// Outcomes piling up behind commits that stall (here a lock on
// workflows, as a slow disk or a long transaction would) do not cost a
// worker its connection. The server frees a slot when an outcome arrives,
// so a worker with one slot keeps running tasks whose outcomes wait for
// their ack, and its heartbeats once listed them all: hundreds of attempts
// for one slot, which the server took for nonsense and closed the socket,
// so that every attempt in flight was lost and ran again.
func TestStalledCommitsKeepTheWorkerConnected(t *testing.T) {
	t.Parallel()
	// A lease well over the stall: outcomes waiting for their commit are
	// renewed by nobody, and would lapse on a slow machine.
	p := newPlatform(t, "--lease", "6s") // heartbeats every 1.2 s
	w := startWorker(t, "worker", 1, p.srv.url)
	noop := push(t, p.client, "noop")

	const n = 400
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("t%03d", i), "module": noop})
	}
	id := submit(t, p.client, workflow("backlog", tasks...))

	ctx := context.Background()
	// Every completion counts its workflow down: it waits for this lock
	// (taken once the workflow is written), claims do not. (Not a lock on
	// task_outputs: an empty stdout is stored without a row, so the
	// completions of no-op tasks write none.)
	tx := lockTable(t, p.db, "LOCK TABLE workflows IN SHARE MODE")
	locked := time.Now()
	conn := tx.Conn()
	succeeded := func() int {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id
			WHERE t.workflow_id = $1 AND a.state = 'succeeded'`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := succeeded() // the few that committed before the lock
	// Far more outcomes than the worker's one slot and its queue wait for
	// their ack (the server refuses a heartbeat of more than 2 × (1 + 32)
	// + 16 attempts), over two heartbeats, within the lease of the
	// attempts claimed first.
	eventually(t, 20*time.Second, "attempts to run while their commits wait", func() bool {
		var started int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id
			JOIN workflows w ON w.id = t.workflow_id WHERE w.id = $1`, id).Scan(&started)
		return err == nil && started >= 120
	})
	time.Sleep(2600 * time.Millisecond)
	if after := succeeded(); after != before {
		t.Fatalf("%d attempts succeeded while their workflow could not be counted down: the commits did not stall", after-before)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	stall := time.Since(locked)

	st := wait(t, p.client, id, 60*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s", st.State)
	}
	if got := countLines(w.out, regexp.MustCompile(`disconnected from server`)); got > 0 {
		t.Errorf("the worker was disconnected %d times:\n%s", got, w.out)
	}
	var attempts, done int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE a.state = 'succeeded') FROM attempts a
		JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1`, id).Scan(&attempts, &done); err != nil {
		t.Fatal(err)
	}
	// One attempt per task. On a machine so busy that the stall outlasted
	// the lease, the first outcomes' leases may lapse while they wait for
	// their commit (nobody renews them): those tasks run again, which is
	// not what this test is about.
	switch {
	case done != n:
		t.Errorf("%d attempts succeeded, want %d (one per task)", done, n)
	case attempts != n && stall < 6*time.Second:
		t.Errorf("%d attempts for %d tasks although the lock was released within the lease: want one per task", attempts, n)
	case attempts != n:
		t.Logf("%d attempts for %d tasks: the lock outlasted the 6 s lease (%v)", attempts, n, stall.Round(time.Millisecond))
	}
}
