//go:build unix

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
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

	st := wait(t, p.client, id, 60*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s", st.State)
	}
	if got := countLines(w.out, regexp.MustCompile(`disconnected from server`)); got > 0 {
		t.Errorf("the worker was disconnected %d times:\n%s", got, w.out)
	}
	// One succeeded attempt per task. Any other attempt ended only
	// because its lease lapsed while its outcome waited for the stalled
	// commit (nobody renews such a lease, and a busy machine stalls
	// longer), never for a closed socket, which the log shows above.
	var done, other int
	var reasons []string
	rows, err := conn.Query(ctx, `SELECT a.state, coalesce(a.reason, '') FROM attempts a
		JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var state, reason string
		if err := rows.Scan(&state, &reason); err != nil {
			t.Fatal(err)
		}
		switch {
		case state == "succeeded":
			done++
		case state == "lost" && strings.Contains(reason, "vanished"): // expireSQL's reasons
			other++
		default:
			reasons = append(reasons, state+": "+reason)
		}
	}
	rows.Close()
	if done != n || len(reasons) > 0 {
		t.Errorf("%d attempts succeeded, want %d (one per task); attempts that ended otherwise than by a lapsed lease: %q", done, n, reasons)
	}
	if other > 0 {
		t.Logf("%d attempts lapsed while their outcomes waited for the stalled commits", other)
	}
}
