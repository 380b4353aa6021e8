//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// startVolunteer starts a headless worker without the operator key: a
// volunteer, whose failures are evidence rather than verdicts.
func startVolunteer(t *testing.T, name string, slots int, server string) *proc {
	t.Helper()
	p := start(t, name, "worker", "--server", server, "--slots", fmt.Sprint(slots), "--key=",
		"--cache-dir", compileCache())
	if _, ok := p.out.waitFor(regexp.MustCompile(`msg=connected`), 30*time.Second); !ok {
		t.Fatalf("%s did not connect:\n%s", name, p.out)
	}
	return p
}

// failer answers every assignment at once with a failure of the task's own
// (reason exit), as a hostile volunteer would to fail other people's work,
// or with another reason (runFailing), and counts what it was given.
type failer struct {
	*fakeWorker
	assigned atomic.Int64
	// most is the most attempts it held at once
	most atomic.Int64

	mu sync.Mutex
	at []time.Time // when each assign frame arrived
}

func runFailer(t *testing.T, server string, slots int) *failer {
	t.Helper()
	return runFailing(t, server, slots, protocol.ReasonExit)
}

// runFailing starts a failer that fails every attempt with reason.
func runFailing(t *testing.T, server string, slots int, reason string) *failer {
	t.Helper()
	f := &failer{fakeWorker: dialFakeVolunteer(t, server, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: slots})}
	go func() {
		for fr := range f.frames {
			if fr.Type != protocol.TypeAssign {
				continue
			}
			f.mu.Lock()
			f.at = append(f.at, time.Now())
			f.mu.Unlock()
			n := int64(len(fr.Assign))
			f.assigned.Add(n)
			if n > f.most.Load() {
				f.most.Store(n)
			}
			fails := make([]protocol.Fail, len(fr.Assign))
			for i, a := range fr.Assign {
				fails[i] = protocol.Fail{Attempt: a.Attempt, Reason: reason, Message: "failed by a test's failer"}
			}
			data, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeFail, Fails: fails})
			if err != nil {
				return
			}
			if f.ws.Write(f.ctx, websocket.MessageText, data) != nil {
				return
			}
		}
	}()
	return f
}

// Attack 2 of issue 21: an anonymous volunteer that answers every
// assignment with a failure, and one that takes tasks and never answers,
// while an honest volunteer computes. Every task of max_attempts 1 ends
// done with the right output (a failure from one volunteer only waits for
// another worker), neither attacker ever gets a task it failed or lost
// again, the failer's disproved failures become strikes, and with them it
// gets no more tasks.
func TestHostileVolunteersFailNoTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t, "--lease", "3s")
	echo := push(t, p.client, "echo")
	bad := runFailer(t, p.srv.url, 4)
	// Heartbeats that list nothing: its leases lapse.
	staller := dialFakeVolunteer(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1, Queue: 3})
	var tasks []task
	const n = 40
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("t%d", i), "module": echo, "max_attempts": 1,
			"stdin": map[string]any{"data": fmt.Sprintf("out %d\n", i)}})
	}
	id := submit(t, p.client, workflow("victim", tasks...))
	eventually(t, 30*time.Second, "the failer to fail some tasks", func() bool { return bad.assigned.Load() >= 4 })
	startVolunteer(t, "honest", 2, p.srv.url)
	st := wait(t, p.client, id, 120*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	for i := range n {
		name := fmt.Sprintf("t%d", i)
		if out := output(t, p.client, id, name, "stdout"); out != fmt.Sprintf("out %d\n", i) {
			t.Errorf("task %s stdout %q", name, out)
		}
	}
	db, err := pgx.Connect(ctx, p.db)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	// No task went twice to a worker that failed or lost it.
	var twice int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT task_id, worker_id FROM attempts WHERE state IN ('failed', 'lost')
		GROUP BY task_id, worker_id HAVING count(*) > 1) x`).Scan(&twice); err != nil {
		t.Fatal(err)
	}
	if twice > 0 {
		t.Errorf("%d tasks went back to a worker that had failed or lost them", twice)
	}
	var failerStrikes float64
	var failed int64
	if err := db.QueryRow(ctx, `SELECT strikes, (SELECT count(*) FROM attempts WHERE worker_id = $1 AND state = 'failed')
		FROM workers WHERE id = $1`, bad.welcome.WorkerID).Scan(&failerStrikes, &failed); err != nil {
		t.Fatal(err)
	}
	if failed == 0 || failerStrikes < float64(failed)-1 {
		t.Errorf("the failer failed %d attempts and has %.1f strikes: want a strike for each failure the honest worker disproved", failed, failerStrikes)
	}
	t.Logf("failer: %d attempts assigned, %d failed, %.1f strikes", bad.assigned.Load(), failed, failerStrikes)
	staller.ws.CloseNow()

	// With its strikes, the failer gets nothing of the next workflow once
	// its record is read again (every 10 s, or on every 4th failure in a
	// row).
	time.Sleep(11 * time.Second)
	before := bad.assigned.Load()
	id2 := submit(t, p.client, workflow("after", task{"name": "a", "module": echo, "max_attempts": 1, "stdin": map[string]any{"data": "a\n"}},
		task{"name": "b", "module": echo, "max_attempts": 1, "stdin": map[string]any{"data": "b\n"}}))
	if st := wait(t, p.client, id2, 60*time.Second); st.State != client.WorkflowDone {
		t.Fatalf("second workflow ended %s: %+v", st.State, st.Tasks)
	}
	if got := bad.assigned.Load() - before; got != 0 {
		t.Errorf("the failer, with %.1f strikes, was given %d attempts of the next workflow", failerStrikes, got)
	}
}

// An operator's worker's failure is a verdict, as before: a task that
// fails on it fails for good after max_attempts, on that one worker.
// A volunteer's failure alone leaves the task waiting for a second
// worker, and the status says so.
func TestOneVolunteersFailureWaitsForASecondWorker(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	fail := push(t, p.client, "fail")
	startVolunteer(t, "volunteer", 1, p.srv.url)
	id := submit(t, p.client, workflow("w", task{"name": "bad", "module": fail, "max_attempts": 1}))
	var st *client.Status
	eventually(t, 60*time.Second, "the volunteer's failure", func() bool {
		var err error
		st, err = p.client.Status(context.Background(), id)
		return err == nil && strings.Contains(st.Task("bad").Error, "waiting for another worker to confirm")
	})
	if bad := st.Task("bad"); bad.State != "ready" || bad.Attempts != 1 {
		t.Fatalf("task %+v: want ready after its one attempt, waiting for a second worker", bad)
	}
	startWorker(t, "operator", 1, p.srv.url)
	st = wait(t, p.client, id, 60*time.Second)
	if bad := st.Task("bad"); st.State != client.WorkflowFailed || bad.Attempts != 2 || !strings.Contains(bad.Error, "failed after 2 attempts") {
		t.Fatalf("workflow %s, task %+v: want failed after 2 attempts on 2 workers", st.State, bad)
	}
	// The CLI shows both attempts, by a start of the workflow's id.
	cli := func(args ...string) string {
		t.Helper()
		out, err := runCLI(t, p.db, append(args, "--server", p.srv.url, "--token", p.srv.token)...)
		if err != nil {
			t.Fatalf("cyclepool %v: %v\n%s", args, err, out)
		}
		return out
	}
	out := cli("attempts", id[:8], "bad")
	var workers []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 2 && f[1] == "failed" {
			workers = append(workers, f[2])
		}
	}
	if len(workers) != 2 || workers[0] == workers[1] || !strings.Contains(out, "this task always fails") {
		t.Errorf("cyclepool attempts: want two failed attempts on two workers:\n%s", out)
	}
	cli("logs", id[:8], "bad")
}

// New worker identities are bounded per address; a worker that proves its
// identity reconnects whatever the bound, and so do the operator's
// workers. An operator key the server does not know is refused before the
// upgrade.
func TestNewIdentitiesAreBoundedPerAddress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t, "--new-workers-per-address", "3", "--new-worker-every", "1h")
	hello := func() *protocol.Hello {
		return &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1}
	}
	var first *fakeWorker
	for i := range 3 {
		f := dialFakeVolunteer(t, p.srv.url, hello())
		if i == 0 {
			first = f
		}
	}
	// The fourth new identity is refused, with a message that says why.
	u := "ws://" + strings.TrimPrefix(p.srv.url, "http://") + "/ws/worker"
	ws, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	data, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeHello, Hello: hello()})
	if err := ws.Write(ctx, websocket.MessageText, data); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, msg, err := ws.Read(rctx)
	if err != nil || !strings.Contains(string(msg), "too many new worker identities from this address") {
		t.Fatalf("fourth new identity: %q, %v; want refused", msg, err)
	}
	// The first reconnects with its identity; an operator's worker connects.
	first.ws.CloseNow()
	again := hello()
	again.WorkerID, again.ReconnectToken = first.welcome.WorkerID, first.welcome.ReconnectToken
	if f := dialFakeVolunteer(t, p.srv.url, again); f.welcome.WorkerID != first.welcome.WorkerID {
		t.Errorf("reconnected as %s, want %s", f.welcome.WorkerID, first.welcome.WorkerID)
	}
	startWorker(t, "operator", 1, p.srv.url)
	// The workers' list says which are the operator's, and each one's build.
	wl, err := p.client.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	operators := 0
	for _, w := range wl.Workers {
		if w.Operator {
			operators++
			if !strings.HasPrefix(w.Build, "devel") {
				t.Errorf("the operator's worker says build %q, want the binary's (devel …)", w.Build)
			}
		}
	}
	if operators != 1 {
		t.Errorf("%d operator's workers listed, want 1: %+v", operators, wl.Workers)
	}
	// A made-up operator key is refused with 401.
	_, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer cwk_madeup"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("made-up operator key: %v %v; want 401", resp, err)
	}
	var identities int64
	db, err := pgx.Connect(ctx, p.db)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	if err := db.QueryRow(ctx, `SELECT count(*) FROM workers WHERE NOT operator`).Scan(&identities); err != nil {
		t.Fatal(err)
	}
	if identities != 3 {
		t.Errorf("%d volunteer identities stored, want 3", identities)
	}
}

// A volunteer that keeps reporting outcomes for attempts it does not hold
// (a forger guessing attempt ids) is disconnected after 16 in a row, and
// its address is kept out for a while (429), so that the server does not
// read its payloads for ever; the operator's workers still connect.
func TestForgerIsDisconnectedAndKeptOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	forger := dialFakeVolunteer(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1,
		Device: protocol.Device{Paused: true}})
	payload := make([]byte, 64<<10)
	refused := 0
	for i := range 40 {
		attempt := int64(1_000_000 + i)
		data, bin, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
			Attempt: attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: payload}}, DurationMS: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		typ := websocket.MessageText
		if bin {
			typ = websocket.MessageBinary
		}
		if forger.ws.Write(ctx, typ, data) != nil {
			break
		}
	}
	closed := false
	timeout := time.After(30 * time.Second)
	for !closed {
		select {
		case fr, ok := <-forger.frames:
			switch {
			case !ok:
				closed = true
			case fr.Type == protocol.TypeAck:
				for _, a := range fr.Acks {
					if !a.OK && strings.Contains(a.Error, "does not hold attempt") {
						refused++
					}
				}
			case fr.Type == protocol.TypeError && !strings.Contains(fr.Error.Message, "reports in a row for attempts this connection does not hold"):
				t.Errorf("error frame %q", fr.Error.Message)
			}
		case <-timeout:
			t.Fatal("the forger's connection was still open after 30 s")
		}
	}
	// Refused one by one (the acks of the last may not have left before
	// the socket closed), then disconnected.
	if refused > 16 {
		t.Errorf("%d forged results refused before the connection closed, want at most 16", refused)
	}
	if _, ok := p.srv.out.waitFor(regexp.MustCompile(`more than 16 reports in a row for attempts this connection does not hold`), 10*time.Second); !ok {
		t.Errorf("the server did not say why it closed the forger's connection:\n%s", p.srv.out)
	}
	u := "ws://" + strings.TrimPrefix(p.srv.url, "http://") + "/ws/worker"
	_, resp, err := websocket.Dial(ctx, u, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the forger's address connecting again: %v %v; want 429 with Retry-After", resp, err)
	}
	dialFakeHello(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1})
}

// A volunteer that hands back every attempt the moment it gets it (reason
// worker, which costs no one anything), as a page whose runner is broken
// or a hostile worker would, gets its budget of them and is then held:
// it cannot spin a task through attempts, each a row in the database. The
// task is charged nothing, and an honest worker then runs it.
func TestHandBackLoopIsHeld(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	echo := push(t, p.client, "echo")
	id := submit(t, p.client, workflow("handed-back", task{"name": "t", "module": echo, "max_attempts": 1,
		"stdin": map[string]any{"data": "kept\n"}}))
	const (
		budget = 64              // server.handBackBurst
		hold   = 5 * time.Second // server.handBackHold
	)
	loop := runFailing(t, p.srv.url, 1, protocol.ReasonWorker)
	// The budget, the one past it, and one after the hold.
	eventually(t, 60*time.Second, "the looping worker to be held and let go", func() bool { return loop.assigned.Load() >= budget+3 })
	loop.mu.Lock()
	at := slices.Clone(loop.at)
	loop.mu.Unlock()
	first := -1 // the first assignment after a gap of at least the hold
	for i := 1; i < len(at) && first < 0; i++ {
		if at[i].Sub(at[i-1]) >= hold {
			first = i
		}
	}
	if first <= budget || first > budget+2 {
		t.Fatalf("%d assignments, the first after a gap of %v at %d: want the budget, %d, and one or two more before the worker is held",
			len(at), hold, first, budget)
	}
	loop.ws.CloseNow()
	as := attempts(t, p.client, id, "t")
	t.Logf("%d assignments before the hold; %d attempts recorded", first, len(as))

	startVolunteer(t, "honest", 1, p.srv.url)
	st := wait(t, p.client, id, 60*time.Second)
	if st.State != client.WorkflowDone || st.Tasks[0].Attempts != 1 {
		t.Fatalf("workflow ended %s: %+v: want done, charged only the honest attempt", st.State, st.Tasks)
	}
	if out := output(t, p.client, id, "t", "stdout"); out != "kept\n" {
		t.Errorf("stdout %q", out)
	}
}
