//go:build unix

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// A hostile worker that holds real attempts reports what the task's rules
// forbid: an output name that climbs out of the results directory, outputs
// far over the task's output_mib, a log over its log_kib, a checkpoint
// larger than its memory. Each is refused with a frame that names the
// rule, nothing of it is stored, and an honest worker then finishes the
// workflow with the right outputs, which `cyclepool results` downloads.
func TestResultsBreakingTheTasksRulesAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t, "--lease", "30s")
	echo := push(t, p.client, "echo")
	limits := map[string]any{"output_mib": 1, "log_kib": 1, "memory_mib": 4}
	var tasks []task
	for _, n := range []string{"a", "b", "c", "d"} {
		tasks = append(tasks, task{"name": n, "module": echo, "limits": limits, "stdin": map[string]any{"data": "hello " + n + "\n"}})
	}
	hostile := dialFakeQueue(t, p.srv.url, 3)
	id := submit(t, p.client, workflow("rules", tasks...))
	var held []protocol.Assign
	for len(held) < 4 {
		held = append(held, hostile.next(t, protocol.TypeAssign, 30*time.Second).Assign...)
	}
	// Paused from now on, as a volunteer stepping away: the tasks its
	// refused results send back wait for the honest worker rather than
	// coming back to it, to be held until its leases lapse.
	hostile.send(t, &protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Device: &protocol.Device{Paused: true}}})
	results := []protocol.Result{
		{Attempt: held[0].Attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("x")}, {Name: "../../pwned", Data: []byte("pwned")}}},
		{Attempt: held[1].Attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: make([]byte, 38<<20)}}},
		{Attempt: held[2].Attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("x")}}, Log: protocol.Blob{Data: make([]byte, 38<<20)}},
	}
	want := []string{"must be a clean relative path", "outputs of 39845888 bytes (at most 1048576)", "a log of 39845888 bytes (at most 1024)"}
	for i, r := range results {
		hostile.send(t, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{r}})
		ack := hostile.ack(t, r.Attempt, protocol.AckResult, 30*time.Second)
		if ack.OK || ack.Retry || !strings.Contains(ack.Error, want[i]) {
			t.Errorf("result %d: ack %+v, want refused: %s", i, ack, want[i])
		}
	}
	cp := held[3].Attempt
	hostile.send(t, &protocol.Frame{Type: protocol.TypeCheckpoint, Checkpoint: &protocol.Checkpoint{
		Attempt: cp, Seq: 1, State: protocol.Blob{Data: make([]byte, 5<<20)}}})
	if ack := hostile.ack(t, cp, protocol.AckCheckpoint, 30*time.Second); ack.OK || ack.Retry ||
		!strings.Contains(ack.Error, "larger than the task's memory limit of 4194304 bytes") {
		t.Errorf("checkpoint: ack %+v, want refused for the memory limit", ack)
	}
	// The task whose checkpoint was refused goes back as a worker that
	// stops does (uncharged), rather than after its lease.
	hostile.send(t, &protocol.Frame{Type: protocol.TypeFail, Fails: []protocol.Fail{{Attempt: cp, Reason: protocol.ReasonWorker, Message: "stopping"}}})
	if ack := hostile.ack(t, cp, protocol.AckFail, 30*time.Second); !ack.OK {
		t.Errorf("handing back: ack %+v, want accepted", ack)
	}
	hostile.ws.CloseNow()

	startWorker(t, "honest", 2, p.srv.url)
	st := wait(t, p.client, id, 90*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		if out := output(t, p.client, id, n, "stdout"); out != "hello "+n+"\n" {
			t.Errorf("task %s stdout %q", n, out)
		}
		if st.Task(n).Attempts != 1 {
			t.Errorf("task %s was charged %d attempts, want the 1 that succeeded", n, st.Task(n).Attempts)
		}
	}
	db, err := pgx.Connect(ctx, p.db)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	var pwned, logBytes, invalid int64
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM task_outputs WHERE name LIKE '%..%' OR name LIKE '/%' OR octet_length(data) > 1048576),
			(SELECT coalesce(sum(octet_length(log)), 0) FROM attempts),
			(SELECT results_invalid FROM workers WHERE id = $1)`, hostile.welcome.WorkerID).Scan(&pwned, &logBytes, &invalid); err != nil {
		t.Fatal(err)
	}
	if pwned != 0 || logBytes > 64<<10 || invalid != 3 {
		t.Errorf("%d forbidden outputs stored, %d bytes of logs kept, %d invalid results charged to the hostile worker (want 0, small, 3)", pwned, logBytes, invalid)
	}
	dir := t.TempDir()
	if out, err := runIn(dir, []string{"CYCLEPOOL_SERVER=" + p.srv.url, "CYCLEPOOL_TOKEN=" + p.srv.token}, time.Minute,
		"results", id, "-o", "out"); err != nil {
		t.Errorf("cyclepool results: %v\n%s", err, out)
	}
}
