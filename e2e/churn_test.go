//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
)

// churnSteps is the step count (of 100 ms) of churn task i.
func churnSteps(i int) int { return 10 + i%5 }

// A soak of volunteers coming and going: a worker is SIGKILLed and
// replaced every 3 s, and the server is SIGKILLed and restarted once,
// while a steady worker computes too. Every task has max_attempts 1, so an
// attempt charged to a task for a worker's vanishing would fail the
// workflow. It finishes with every output correct, every task charged
// exactly the one attempt that succeeded, and the steady worker charged
// no loss.
func TestChurnCostsNoTaskItsAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migratedDB(t)
	data := t.TempDir()
	port := freePort(t)
	srv := startServer(t, "server", db, data, port)
	c := client.New(srv.url, srv.token)
	steady := startHeldWorker(t, "steady", 1, srv.url)
	counter := push(t, c, "counter")
	const n = 20
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("c%02d", i), "module": counter,
			"args": []string{strconv.Itoa(churnSteps(i)), heldStep(100)}, "checkpoint_interval": "1s", "max_attempts": 1})
	}
	id := submit(t, c, workflow("churn", tasks...))

	finished := func() bool {
		st, err := c.Status(ctx, id)
		return err == nil && st.State != client.WorkflowRunning
	}
	// The soak ends when the workflow does; it fails when no task finishes
	// for 30 rounds in a row (a machine busy with other tests slows it,
	// but does not stop it).
	restarted := false
	done, stalled := 0, 0
	for round := 0; !finished(); round++ {
		if st, err := c.Status(ctx, id); err == nil && st.Counts.Done > done {
			done, stalled = st.Counts.Done, 0
		} else if stalled++; stalled > 30 {
			t.Fatalf("no task finished in 30 rounds of churn (%d of %d done after %d rounds)", done, n, round)
		}
		w := startHeldWorker(t, fmt.Sprintf("churn%d", round), 2, srv.url)
		time.Sleep(3 * time.Second)
		w.kill()
		if st, err := c.Status(ctx, id); err == nil && !restarted && st.Counts.Done >= n/3 {
			srv.kill()
			time.Sleep(500 * time.Millisecond)
			srv = startServer(t, "server2", db, data, port)
			c = client.New(srv.url, srv.token)
			restarted = true
		}
	}
	if !restarted {
		t.Fatal("the workflow finished before the server was restarted: the soak is too short to say anything")
	}
	st := wait(t, c, id, time.Minute)
	if st.State != client.WorkflowDone && st.State != client.WorkflowFailed {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	lostOrReturned, tooBusy := 0, 0
	for i := range n {
		name := fmt.Sprintf("c%02d", i)
		tk := st.Task(name)
		// On a machine so busy that a churn worker's 3 s of life often
		// brings its task no further, a task may vanish with its workers
		// the 10 times max_lost allows: it then fails for that, charged
		// no attempt. Nothing else may fail it.
		if tk.State == client.TaskFailed && tk.Attempts == 0 && strings.Contains(tk.Error, "(max_lost)") {
			tooBusy++
			continue
		}
		if tk.Attempts != 1 {
			t.Errorf("task %s was charged %d attempts, want the 1 that succeeded", name, tk.Attempts)
		}
		as := attempts(t, c, id, name)
		if k := countState(as, "succeeded"); k != 1 {
			t.Errorf("task %s: %d succeeded attempts, want 1: %+v", name, k, as)
		}
		lostOrReturned += len(as) - 1
		out := output(t, c, id, name, "stdout")
		if !regexp.MustCompile(fmt.Sprintf(`^counted %d from \d+\n$`, churnSteps(i))).MatchString(out) {
			t.Errorf("task %s stdout = %q", name, out)
		}
	}
	if tooBusy > 0 {
		t.Logf("%d of %d tasks vanished with their workers 10 times (max_lost): the machine is too busy for this soak", tooBusy, n)
	}
	if tooBusy == n {
		t.Fatal("every task reached max_lost: the soak said nothing")
	}
	if lostOrReturned == 0 {
		t.Error("no attempt was lost or returned: the churn did not reach a running task")
	}
	t.Logf("%d attempts lost or returned over %d tasks", lostOrReturned, n)
	// The steady worker never vanished: it keeps its standing.
	steadyID := workerID(t, steady)
	pg, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close(ctx)
	var lost int
	if err := pg.QueryRow(ctx, `SELECT tasks_lost FROM workers WHERE id = $1`, steadyID).Scan(&lost); err != nil {
		t.Fatal(err)
	}
	if lost != 0 {
		t.Errorf("the steady worker was charged %d losses", lost)
	}
}

// workerID is the id a headless worker process logged when it connected.
func workerID(t *testing.T, p *proc) string {
	t.Helper()
	m, ok := p.out.waitFor(regexp.MustCompile(`msg=connected .*worker=([0-9a-f-]{36})`), time.Second)
	if !ok {
		t.Fatalf("%s logged no worker id:\n%s", p.name, p.out)
	}
	return m
}

// When the database refuses writes for a while (here it turns read-only,
// as a standby or a volume remounted read-only would), no task loses an
// attempt and the worker no standing: results wait at the worker, dispatch
// pauses, /readyz says why it is not ready, and once writes work again the
// workflow finishes on the worker it had, every task in one attempt.
func TestDatabaseRefusingWritesChargesNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	w := startHeldWorker(t, "worker", 2, p.srv.url)
	counter := push(t, p.client, "counter")
	const n = 8
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("c%02d", i), "module": counter,
			"args": []string{strconv.Itoa(churnSteps(i)), heldStep(100)}, "checkpoint_interval": "1s", "max_attempts": 1})
	}
	id := submit(t, p.client, workflow("readonly", tasks...))
	eventually(t, 60*time.Second, "a task done and two running", func() bool {
		st, err := p.client.Status(ctx, id)
		return err == nil && st.Counts.Done >= 1 && st.Counts.Running >= 2
	})

	admin, err := pgx.Connect(ctx, p.db)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// New sessions of this database are read-only; the server's present
	// ones are ended, so that its pool opens new ones.
	setReadOnly := func(on bool) {
		t.Helper()
		q := `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET default_transaction_read_only', current_database()); END $$`
		if on {
			q = `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$`
		}
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(true)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `SELECT 1`) })
	// Three leases (2 s each) without a write: every lease lapses.
	sawNotReady, sawMetric, sawNotice := "", false, false
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if st, err := p.client.Status(ctx, id); err == nil && strings.Contains(st.Notice, "cannot store results now (the database is read-only)") {
			sawNotice = true
		}
		if code, body := get(t, p.srv.url+"/readyz"); code == http.StatusServiceUnavailable && strings.Contains(body, "cannot write") {
			sawNotReady = body
		}
		if _, body := get(t, p.srv.url+"/metrics"); strings.Contains(body, "cyclepool_database_writable 0") {
			sawMetric = true
		}
	}
	// An owner's upload meanwhile is told to come back later, not that
	// the server broke.
	if _, err := p.client.PushModule(ctx, taskbuild.Bytes(t, "noop")); err == nil || !strings.Contains(err.Error(), "503") ||
		!strings.Contains(err.Error(), "try again later") {
		t.Errorf("a module pushed while the database is read-only: %v, want 503 try again later", err)
	}
	setReadOnly(false)
	if sawNotReady == "" {
		t.Error("/readyz never said the database cannot write")
	} else if !strings.Contains(sawNotReady, "the database is read-only") || strings.Contains(sawNotReady, "SQLSTATE") {
		t.Errorf("/readyz %q: want the cause in plain words, not the database's message", sawNotReady)
	}
	if !sawMetric {
		t.Error("cyclepool_database_writable never said 0")
	}
	if !sawNotice {
		t.Error("the workflow's status never told its owner that the server cannot store results")
	}
	st := wait(t, p.client, id, 90*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	for i := range n {
		name := fmt.Sprintf("c%02d", i)
		as := attempts(t, p.client, id, name)
		if len(as) != 1 || as[0].State != "succeeded" || st.Task(name).Attempts != 1 {
			t.Errorf("task %s: %d attempts charged, attempts %+v, want the one that succeeded", name, st.Task(name).Attempts, as)
		}
		out := output(t, p.client, id, name, "stdout")
		if !regexp.MustCompile(fmt.Sprintf(`^counted %d from \d+\n$`, churnSteps(i))).MatchString(out) {
			t.Errorf("task %s stdout = %q", name, out)
		}
	}
	var lost int
	if err := admin.QueryRow(ctx, `SELECT tasks_lost FROM workers WHERE id = $1`, workerID(t, w)).Scan(&lost); err != nil {
		t.Fatal(err)
	}
	if lost != 0 {
		t.Errorf("the worker was charged %d losses", lost)
	}
	for _, re := range []string{`the database (cannot|still cannot) write.*cause=.*read-only transaction \(SQLSTATE 25006\)`, `the database writes again`} {
		if _, ok := p.srv.out.waitFor(regexp.MustCompile(re), time.Second); !ok {
			t.Errorf("the server did not log %q", re)
		}
	}
	if code, body := get(t, p.srv.url+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the outage: %d %s", code, body)
	}
}

// get fetches url and returns its status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 64<<10)
	for {
		k, err := resp.Body.Read(buf)
		b.Write(buf[:k])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// A worker that leaves gives back at once the attempts waiting in its
// queue: they run elsewhere long before their leases (five minutes here)
// could lapse, charged to nobody. The attempt it may have been running
// waits for the worker to come back for the reconnect grace, not for its
// lease: with a grace of a lease it is still held when the others are done;
// with a second it runs again elsewhere long before its lease could lapse,
// its first attempt a loss, not one of the task's attempts.
func TestQueuedAttemptsReturnWhenTheWorkerLeaves(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		grace string
		// rerun: the oldest attempt's task runs again before its lease.
		rerun bool
	}{
		{name: "grace of a lease", grace: "300s"},
		{name: "grace of a second", grace: "1s", rerun: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newPlatform(t, "--lease", "300s", "--reconnect-grace", tc.grace)
			echo := push(t, p.client, "echo")
			f := dialFakeQueue(t, p.srv.url, 3)
			var tasks []task
			for i := range 4 {
				tasks = append(tasks, task{"name": fmt.Sprintf("t%d", i), "module": echo, "max_attempts": 1,
					"stdin": map[string]any{"data": fmt.Sprintf("hello %d\n", i)}})
			}
			id := submit(t, p.client, workflow("queued", tasks...))
			var held []protocol.Assign
			for len(held) < 4 {
				held = append(held, f.next(t, protocol.TypeAssign, 30*time.Second).Assign...)
			}
			f.ws.CloseNow()
			startWorker(t, "worker", 1, p.srv.url)
			want := 3
			if tc.rerun {
				want = 4
			}
			eventually(t, 30*time.Second, fmt.Sprintf("%d tasks done", want), func() bool {
				st, err := p.client.Status(context.Background(), id)
				return err == nil && st.Counts.Done == want
			})
			st, err := p.client.Status(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			oldest := held[0].Attempt
			for _, a := range held[1:] {
				oldest = min(oldest, a.Attempt)
			}
			for _, a := range held {
				name := strings.TrimPrefix(a.Task, id+"/")
				as := attempts(t, p.client, id, name)
				switch {
				case a.Attempt == oldest && !tc.rerun:
					if st.Task(name).State != client.TaskRunning || len(as) != 1 || as[0].State != "running" {
						t.Errorf("the oldest attempt's task %s: %s, attempts %+v; want still held by the worker that left", name, st.Task(name).State, as)
					}
				case a.Attempt == oldest:
					if st.Task(name).State != client.TaskDone || st.Task(name).Attempts != 1 || len(as) != 2 ||
						as[0].State != "lost" || !strings.Contains(as[0].Reason, "vanished while running it") {
						t.Errorf("the oldest attempt's task %s: %s, %d attempts charged, attempts %+v; want done, its first attempt lost",
							name, st.Task(name).State, st.Task(name).Attempts, as)
					}
				default:
					if st.Task(name).State != client.TaskDone || st.Task(name).Attempts != 1 || len(as) != 2 ||
						!strings.Contains(as[0].Reason, "left before it started") {
						t.Errorf("queued task %s: %s, %d attempts charged, attempts %+v; want done, charged only the one that succeeded",
							name, st.Task(name).State, st.Task(name).Attempts, as)
					}
				}
			}
		})
	}
}

// dialFakeQueue is dialFake for a worker with one slot and a queue.
func dialFakeQueue(t *testing.T, server string, queue int) *fakeWorker {
	t.Helper()
	return dialFakeHello(t, server, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1, Queue: queue})
}
