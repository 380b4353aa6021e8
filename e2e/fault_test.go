//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// A worker killed in the middle of a long task loses its attempt when the
// lease lapses; the next attempt, on another worker, starts from the last
// checkpoint the first one saved, not from zero.
func TestKilledWorkerResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	w1 := startHeldWorker(t, "worker1", 1, p.srv.url)
	counter := push(t, p.client, "counter")
	id := submit(t, p.client, workflow("resume",
		task{"name": "count", "module": counter, "args": []string{"60", heldStep(100)},
			"checkpoint_interval": "1s", "max_attempts": 3},
	))
	eventually(t, 30*time.Second, "two checkpoints of task count", func() bool {
		st, err := p.client.Status(context.Background(), id)
		return err == nil && st.Task("count") != nil && st.Task("count").Checkpoints >= 2
	})
	w1.kill()
	startHeldWorker(t, "worker2", 1, p.srv.url)

	st := wait(t, p.client, id, 90*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	out := output(t, p.client, id, "count", "stdout")
	m := regexp.MustCompile(`^counted 60 from (\d+)\n$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("stdout = %q, want \"counted 60 from K\\n\"", out)
	}
	k, _ := strconv.Atoi(m[1])
	if k <= 0 || k >= 60 {
		t.Errorf("second attempt resumed from step %d, want a saved step in 1..59", k)
	}
	if log, err := p.client.Log(context.Background(), id, "count"); err != nil {
		t.Errorf("log: %v", err)
	} else if !strings.Contains(log, fmt.Sprintf("resumed from step %d", k)) {
		t.Errorf("log %q does not say it resumed from step %d", log, k)
	}

	as := attempts(t, p.client, id, "count")
	if len(as) != 2 {
		t.Fatalf("attempts = %+v, want 2 (lost, succeeded)", as)
	}
	if as[0].State != "lost" {
		t.Errorf("first attempt is %s (%q), want lost", as[0].State, as[0].Reason)
	}
	if as[1].State != "succeeded" {
		t.Errorf("second attempt is %s (%q), want succeeded", as[1].State, as[1].Reason)
	}
	if as[1].RestoredFrom < 1 {
		t.Errorf("second attempt restored_from = %d, want >= 1", as[1].RestoredFrom)
	}
	if as[0].Worker == as[1].Worker {
		t.Errorf("both attempts ran on worker %s; the second should have run on worker2", as[0].Worker)
	}
	if n := countState(as, "succeeded"); n != 1 {
		t.Errorf("%d attempts succeeded, want exactly 1", n)
	}
}

// A worker that stops heartbeating loses its attempt; after another worker
// has completed the task, the old attempt's result, checkpoint and failure
// are all refused (fencing by attempt id) and change nothing.
func TestStaleResultIsRefused(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	fake := dialFake(t, p.srv.url)
	echo := push(t, p.client, "echo")
	id := submit(t, p.client, workflow("stale",
		task{"name": "t", "module": echo, "stdin": map[string]any{"data": "real\n"}, "max_attempts": 3},
	))

	assign := fake.next(t, protocol.TypeAssign, 15*time.Second)
	if len(assign.Assign) != 1 || !strings.HasSuffix(assign.Assign[0].Task, "/t") {
		t.Fatalf("assign = %+v, want one attempt of task t", assign.Assign)
	}
	stale := assign.Assign[0].Attempt

	// The fake worker's heartbeats do not list the attempt, so its lease
	// lapses while the worker is still connected.
	eventually(t, 15*time.Second, "the fake worker's attempt to be lost", func() bool {
		as, err := p.client.Attempts(context.Background(), id, "t")
		return err == nil && len(as) >= 1 && as[0].State == "lost"
	})

	startWorker(t, "worker", 1, p.srv.url)
	st := wait(t, p.client, id, 60*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	if got := output(t, p.client, id, "t", "stdout"); got != "real\n" {
		t.Fatalf("stdout before the stale result = %q, want %q", got, "real\n")
	}
	checkpointsBefore := st.Task("t").Checkpoints

	fake.send(t, &protocol.Frame{Type: protocol.TypeCheckpoint, Checkpoint: &protocol.Checkpoint{
		Attempt: stale, Seq: 1, State: protocol.Blob{Data: []byte("stalestate")}}})
	if ack := fake.ack(t, stale, protocol.AckCheckpoint, 10*time.Second); ack.OK {
		t.Errorf("checkpoint of the stale attempt %d was acknowledged OK: %+v", stale, ack)
	}

	fake.send(t, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
		Attempt: stale, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("fake\n")}},
		Log: protocol.Blob{Data: []byte("fake log\n")}, DurationMS: 5}}})
	if ack := fake.ack(t, stale, protocol.AckResult, 10*time.Second); ack.OK {
		t.Errorf("result of the stale attempt %d was acknowledged OK: %+v", stale, ack)
	}

	fake.send(t, &protocol.Frame{Type: protocol.TypeFail, Fails: []protocol.Fail{{
		Attempt: stale, Reason: protocol.ReasonExit, Message: "exit code 9"}}})
	if ack := fake.ack(t, stale, protocol.AckFail, 10*time.Second); ack.OK {
		t.Errorf("failure of the stale attempt %d was acknowledged OK: %+v", stale, ack)
	}

	if got := output(t, p.client, id, "t", "stdout"); got != "real\n" {
		t.Errorf("stdout after the stale result = %q, want the real worker's %q", got, "real\n")
	}
	st2, err := p.client.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if tk := st2.Task("t"); st2.State != client.WorkflowDone || tk.State != client.TaskDone || tk.Checkpoints != checkpointsBefore {
		t.Errorf("after the stale frames: workflow %s, task %+v (checkpoints before %d)", st2.State, tk, checkpointsBefore)
	}
	as := attempts(t, p.client, id, "t")
	if len(as) != 2 || as[0].ID != stale || as[0].State != "lost" || as[1].State != "succeeded" {
		t.Errorf("attempts = %+v, want [lost %d, succeeded]", as, stale)
	}
}

// Killing the only server in the middle of a workflow and starting a new one
// on the same database and port loses nothing: the worker reconnects by
// itself, and every task ends done with exactly one successful attempt.
func TestServerRestartMidWorkflow(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	data := t.TempDir()
	port := freePort(t)
	srv := startServer(t, "server", db, data, port)
	c := client.New(srv.url, srv.token)
	w := startHeldWorker(t, "worker", 2, srv.url)
	counter := push(t, c, "counter")
	const n = 20
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("c%02d", i), "module": counter,
			"args": []string{strconv.Itoa(steps(i)), heldStep(100)}, "checkpoint_interval": "1s"})
	}
	id := submit(t, c, workflow("restart", tasks...))

	eventually(t, 60*time.Second, "some tasks done and some running", func() bool {
		st, err := c.Status(context.Background(), id)
		return err == nil && st.Counts.Done >= 2 && st.Counts.Running >= 1
	})
	srv.kill()
	time.Sleep(time.Second)
	srv2 := startServer(t, "server2", db, data, port)
	if srv2.token != srv.token {
		t.Errorf("restarted server printed another owner token")
	}
	c = client.New(srv2.url, srv2.token)
	eventually(t, 30*time.Second, "the worker to reconnect", func() bool {
		return countLines(w.out, regexp.MustCompile(`msg=connected`)) >= 2
	})

	st := wait(t, c, id, 2*time.Minute)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	checkCounterTasks(t, c, id, n)
}

// Two replicas share one database; killing one in the middle of a workflow
// moves its worker to the other (in the order of --server), and the
// workflow completes with every task done exactly once. The killed replica
// led the maintenance (the lease reaper): the survivor takes the lead over
// once the leader row's TTL (3s here) runs out.
func TestReplicaKilledMidWorkflow(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	// Replica 2, the one killed, starts first and leads before replica 1
	// starts.
	r2 := startServer(t, "replica2", db, t.TempDir(), 0)
	eventually(t, 10*time.Second, "replica 2 to lead the maintenance", func() bool {
		return metric(t, r2.url, "cyclepool_maintenance_leader") == 1
	})
	r1 := startServer(t, "replica1", db, t.TempDir(), 0)
	c := client.New(r1.url, r1.token)
	startHeldWorker(t, "workerA", 2, r1.url)
	wb := startHeldWorker(t, "workerB", 2, r2.url, r1.url)
	first, _ := wb.out.waitFor(regexp.MustCompile(`msg=connected server=(\S+)`), 0)
	if first != r2.url {
		t.Fatalf("worker B first connected to %q, want replica 2 (%s)", first, r2.url)
	}
	workerB, _ := wb.out.waitFor(regexp.MustCompile(`msg=connected .*worker=(\S+)`), 0)

	counter := push(t, c, "counter")
	const n = 30
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("c%02d", i), "module": counter,
			"args": []string{strconv.Itoa(steps(i)), heldStep(100)}, "checkpoint_interval": "1s"})
	}
	id := submit(t, c, workflow("replicas", tasks...))

	// Kill replica 2 while worker B runs something it was given.
	eventually(t, 60*time.Second, "worker B to run a task with some tasks done", func() bool {
		st, err := c.Status(context.Background(), id)
		if err != nil || st.Counts.Done < 2 {
			return false
		}
		for _, tk := range st.Tasks {
			if tk.State != client.TaskRunning {
				continue
			}
			as, err := c.Attempts(context.Background(), id, tk.Name)
			if err == nil && len(as) > 0 && as[len(as)-1].State == "running" && as[len(as)-1].Worker == workerB {
				return true
			}
		}
		return false
	})
	if metric(t, r1.url, "cyclepool_maintenance_leader") != 0 {
		t.Errorf("replica 1 leads the maintenance too, while replica 2 does")
	}
	r2.kill()
	eventually(t, 15*time.Second, "replica 1 to take the maintenance lead over", func() bool {
		return metric(t, r1.url, "cyclepool_maintenance_leader") == 1
	})

	st := wait(t, c, id, 2*time.Minute)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	checkCounterTasks(t, c, id, n)
	if _, ok := wb.out.waitFor(regexp.MustCompile(`msg=connected server=`+regexp.QuoteMeta(r1.url)+`\b`), 10*time.Second); !ok {
		t.Errorf("worker B never connected to replica 1 (%s) after replica 2 died", r1.url)
	}
}

// A task that always fails is given up after max_attempts, with reasons
// that say why; its dependents end upstream_failed and the workflow failed.
// A task that writes more than its output limit fails with limit_output.
func TestTaskFailureEndsWithReasons(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	startWorker(t, "worker", 2, p.srv.url)
	fail := push(t, p.client, "fail")
	echo := push(t, p.client, "echo")
	chatty := push(t, p.client, "chatty")
	id := submit(t, p.client, workflow("failing",
		task{"name": "bad", "module": fail, "max_attempts": 2},
		task{"name": "after", "module": echo, "stdin": map[string]any{"from": "bad"}},
		task{"name": "after2", "module": echo, "inputs": map[string]any{"x": map[string]any{"from": "after"}}},
		task{"name": "chatty", "module": chatty, "args": []string{strconv.Itoa(2 << 20)}, "max_attempts": 1,
			"limits": map[string]any{"output_mib": 1}},
		task{"name": "fine", "module": echo, "stdin": map[string]any{"data": "ok\n"}},
	))
	st := wait(t, p.client, id, time.Minute)
	if st.State != client.WorkflowFailed {
		t.Fatalf("workflow ended %s, want failed: %+v", st.State, st.Tasks)
	}

	bad := st.Task("bad")
	if bad.State != client.TaskFailed || bad.Attempts != 2 {
		t.Errorf("task bad: %s after %d attempts, want failed after 2", bad.State, bad.Attempts)
	}
	if !strings.Contains(bad.Error, "exit code 3") {
		t.Errorf("task bad error = %q, want it to name exit code 3", bad.Error)
	}
	as := attempts(t, p.client, id, "bad")
	if len(as) != 2 || countState(as, "failed") != 2 {
		t.Errorf("attempts of bad = %+v, want 2 failed", as)
	}
	for _, a := range as {
		if !strings.Contains(a.Reason, "exit") || !strings.Contains(a.Reason, "3") {
			t.Errorf("attempt %d of bad: reason %q does not name the exit code", a.ID, a.Reason)
		}
		if a.EndedAt == nil {
			t.Errorf("attempt %d of bad has no end time", a.ID)
		}
	}
	if log, err := p.client.Log(context.Background(), id, "bad"); err != nil || !strings.Contains(log, "this task always fails") {
		t.Errorf("log of bad = %q, %v; want the task's stderr", log, err)
	}

	for _, name := range []string{"after", "after2"} {
		if tk := st.Task(name); tk.State != client.TaskUpstreamFailed || tk.Attempts != 0 {
			t.Errorf("task %s: %s after %d attempts, want upstream_failed and never run", name, tk.State, tk.Attempts)
		}
	}
	if tk := st.Task("fine"); tk.State != client.TaskDone {
		t.Errorf("independent task fine ended %s, want done", tk.State)
	}

	ch := st.Task("chatty")
	if ch.State != client.TaskFailed || ch.Attempts != 1 {
		t.Errorf("task chatty: %s after %d attempts, want failed after 1", ch.State, ch.Attempts)
	}
	if !strings.Contains(ch.Error, protocol.ReasonOutput) {
		t.Errorf("task chatty error = %q, want it to name %s", ch.Error, protocol.ReasonOutput)
	}
	cas := attempts(t, p.client, id, "chatty")
	if len(cas) != 1 || cas[0].State != "failed" || !strings.Contains(cas[0].Reason, protocol.ReasonOutput) {
		t.Errorf("attempts of chatty = %+v, want one failed with %s", cas, protocol.ReasonOutput)
	}
	if st.Counts.Failed != 2 || st.Counts.UpstreamFailed != 2 || st.Counts.Done != 1 {
		t.Errorf("counts = %+v, want 2 failed, 2 upstream_failed, 1 done", st.Counts)
	}
}

// steps is the step count of counter task i: outputs differ between tasks.
func steps(i int) int { return 2 + i%3 }

// checkCounterTasks checks that every task cNN of a finished counter
// workflow is done, with exactly one succeeded attempt and the right output.
func checkCounterTasks(t *testing.T, c *client.Client, id string, n int) {
	t.Helper()
	st, err := c.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Tasks) != n {
		t.Fatalf("%d tasks, want %d", len(st.Tasks), n)
	}
	retried := 0
	for i := range n {
		name := fmt.Sprintf("c%02d", i)
		tk := st.Task(name)
		if tk == nil || tk.State != client.TaskDone {
			t.Errorf("task %s: %+v, want done", name, tk)
			continue
		}
		as := attempts(t, c, id, name)
		if k := countState(as, "succeeded"); k != 1 {
			t.Errorf("task %s: %d succeeded attempts, want exactly 1: %+v", name, k, as)
		}
		if countState(as, "running") != 0 {
			t.Errorf("task %s is done but has running attempts: %+v", name, as)
		}
		if len(as) > 1 {
			retried++
		}
		out := output(t, c, id, name, "stdout")
		if !regexp.MustCompile(fmt.Sprintf(`^counted %d from \d+\n$`, steps(i))).MatchString(out) {
			t.Errorf("task %s stdout = %q, want \"counted %d from K\"", name, out, steps(i))
		}
	}
	t.Logf("%d of %d tasks needed more than one attempt", retried, n)
}

func attempts(t *testing.T, c *client.Client, id, name string) []client.Attempt {
	t.Helper()
	as, err := c.Attempts(context.Background(), id, name)
	if err != nil {
		t.Fatalf("attempts of %s: %v", name, err)
	}
	return as
}

func countState(as []client.Attempt, state string) int {
	n := 0
	for _, a := range as {
		if a.State == state {
			n++
		}
	}
	return n
}

// countLines counts the lines of l that match re.
func countLines(l *lineLog, re *regexp.Regexp) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if re.MatchString(s) {
			n++
		}
	}
	return n
}

// fakeWorker speaks the worker protocol by hand, to say what a real worker
// would not.
type fakeWorker struct {
	ws      *websocket.Conn
	ctx     context.Context
	frames  chan *protocol.Frame
	welcome *protocol.Welcome
}

// dialFake connects a fake headless worker with one slot and reads welcome.
func dialFake(t *testing.T, server string) *fakeWorker {
	t.Helper()
	return dialFakeHello(t, server, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1})
}

// dialFakeHello connects a fake worker that says hello and reads welcome.
// It presents the tests' operator key: it gets as many attempts as it has
// slots from the start, and the tasks it fails or loses may go back to it
// (dialFakeVolunteer is a volunteer).
func dialFakeHello(t *testing.T, server string, hello *protocol.Hello) *fakeWorker {
	t.Helper()
	return dialFakeAs(t, server, hello, os.Getenv("CYCLEPOOL_WORKER_KEY"))
}

// dialFakeVolunteer is dialFakeHello without the operator key: a new
// volunteer, held to one attempt until its first result, and never given
// a task it failed or lost again.
func dialFakeVolunteer(t *testing.T, server string, hello *protocol.Hello) *fakeWorker {
	t.Helper()
	return dialFakeAs(t, server, hello, "")
}

// dialFakeAs is dialFakeHello presenting key ("": none).
func dialFakeAs(t *testing.T, server string, hello *protocol.Hello, key string) *fakeWorker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	u := "ws://" + strings.TrimPrefix(server, "http://") + "/ws/worker"
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	var opts *websocket.DialOptions
	if key != "" {
		opts = &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}}
	}
	ws, _, err := websocket.Dial(dctx, u, opts)
	dcancel()
	if err != nil {
		t.Fatalf("dial %s: %v", u, err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	ws.SetReadLimit(protocol.DefaultMaxFrameBytes)
	f := &fakeWorker{ws: ws, ctx: ctx, frames: make(chan *protocol.Frame, 64)}
	f.send(t, &protocol.Frame{Type: protocol.TypeHello, Hello: hello})
	go func() {
		defer close(f.frames)
		for {
			typ, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			fr, err := protocol.Decode(data, typ == websocket.MessageBinary)
			if err != nil {
				fr = &protocol.Frame{Type: protocol.TypeError, Error: &protocol.Error{Message: "bad frame from server: " + err.Error()}}
			}
			select {
			case f.frames <- fr:
			case <-ctx.Done():
				return
			}
		}
	}()
	w := f.next(t, protocol.TypeWelcome, 10*time.Second)
	f.welcome = w.Welcome
	// Heartbeat from the start: the server gives no work to a worker that
	// has said nothing for a few heartbeat intervals (and closes its socket
	// a little later), and uploading and submitting can take that long on a
	// loaded machine.
	f.keepAlive(t)
	return f
}

func (f *fakeWorker) send(t *testing.T, fr *protocol.Frame) {
	t.Helper()
	data, bin, err := protocol.Encode(fr)
	if err != nil {
		t.Fatal(err)
	}
	typ := websocket.MessageText
	if bin {
		typ = websocket.MessageBinary
	}
	wctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	if err := f.ws.Write(wctx, typ, data); err != nil {
		t.Fatalf("fake worker: send %s: %v", fr.Type, err)
	}
}

// next returns the next frame of type typ, skipping others.
func (f *fakeWorker) next(t *testing.T, typ string, d time.Duration) *protocol.Frame {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case fr, ok := <-f.frames:
			if !ok {
				t.Fatalf("fake worker: socket closed while waiting for %s", typ)
			}
			if fr.Type == protocol.TypeError {
				t.Fatalf("fake worker: server error: %s", fr.Error.Message)
			}
			if fr.Type == typ {
				return fr
			}
		case <-timeout:
			t.Fatalf("fake worker: no %s frame within %v", typ, d)
		}
	}
}

// ack returns the server's ack of kind of for attempt.
func (f *fakeWorker) ack(t *testing.T, attempt int64, of string, d time.Duration) protocol.Ack {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		fr := f.next(t, protocol.TypeAck, time.Until(deadline))
		for _, a := range fr.Acks {
			if a.Attempt == attempt && a.Of == of {
				return a
			}
		}
	}
}

// keepAlive sends, every 400 ms until the test ends, heartbeats that list no
// running attempt.
func (f *fakeWorker) keepAlive(t *testing.T) {
	data, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{}})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		tick := time.NewTicker(400 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-f.ctx.Done():
				return
			case <-tick.C:
				wctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
				err := f.ws.Write(wctx, websocket.MessageText, data)
				cancel()
				if err != nil {
					return
				}
			}
		}
	}()
}

// A worker that says nothing after its hello (its process hung, or the
// network dropped without a close) has its socket closed by the server
// after two lease periods, at least 10 s; a worker that talks keeps its own.
func TestSilentWorkerIsDisconnected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	start := time.Now()
	c := helloSocket(t, p.srv.url)
	// A worker of the platform, which heartbeats, keeps its socket.
	startWorker(t, "worker", 1, p.srv.url)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, _, err := c.Read(rctx); err != nil {
			if rctx.Err() != nil {
				t.Fatal("the silent worker's socket was still open after 30 s")
			}
			break
		}
	}
	// The lease is 2 s (newPlatform): two lease periods are below the
	// floor of 10 s.
	if d := time.Since(start); d < 9*time.Second {
		t.Fatalf("the silent worker's socket closed after %v, before 10 s", d)
	}
	noop := push(t, p.client, "noop")
	id := submit(t, p.client, workflow("after", task{"name": "n", "module": noop}))
	if st := wait(t, p.client, id, time.Minute); st.State != "done" {
		t.Fatalf("workflow after the disconnection ended %s", st.State)
	}
	if n := metric(t, p.srv.url, `cyclepool_worker_connections_total{kind="headless"}`); n != 2 {
		t.Errorf("%d headless connections, want 2: the worker that talks was disconnected too", n)
	}
}

// A frame whose handling waits for the database (here a checkpoint, while
// a lock stalls its write for longer than the idle limit) is not silence:
// the worker keeps its socket and gets its ack once the write is done.
func TestSlowFrameIsNotSilence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t, "--lease", "4s") // silent after 10 s
	// The task first, then the socket: it says nothing until the
	// checkpoint below, and must get its task within those 10 s.
	counter := push(t, p.client, "counter")
	submit(t, p.client, workflow("slow", task{"name": "c", "module": counter, "args": []string{"1", "1"}}))
	ws := helloSocket(t, p.srv.url)
	write := func(f *protocol.Frame) {
		t.Helper()
		data, bin, _ := protocol.Encode(f)
		typ := websocket.MessageText
		if bin {
			typ = websocket.MessageBinary
		}
		if err := ws.Write(ctx, typ, data); err != nil {
			t.Fatal(err)
		}
	}
	// read returns the next frame of type typ, skipping others.
	read := func(typ string, within time.Duration) *protocol.Frame {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		for {
			mt, data, err := ws.Read(rctx)
			if err != nil {
				t.Fatalf("waiting for a %s frame: %v", typ, err)
			}
			f, err := protocol.Decode(data, mt == websocket.MessageBinary)
			if err != nil {
				t.Fatal(err)
			}
			if f.Type == typ {
				return f
			}
		}
	}
	as := read(protocol.TypeAssign, 30*time.Second).Assign[0]

	tx := lockTable(t, p.db, "LOCK TABLE attempts IN EXCLUSIVE MODE")
	write(&protocol.Frame{Type: protocol.TypeCheckpoint, Checkpoint: &protocol.Checkpoint{Attempt: as.Attempt, Seq: 1,
		State: protocol.Blob{Data: []byte("state")}}})
	time.Sleep(12 * time.Second) // the checkpoint's write waits for the lock
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	ack := read(protocol.TypeAck, 10*time.Second)
	if len(ack.Acks) != 1 || ack.Acks[0].Attempt != as.Attempt || ack.Acks[0].Of != protocol.AckCheckpoint {
		t.Fatalf("got acks %+v, want the checkpoint's", ack.Acks)
	}
}
