package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/pgtest"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The completion flusher wakes this replica's long polls itself once it has
// committed the end of a workflow, without waiting for the database's
// notification, and gives a waiter that wants it the workflow's status,
// read in the completion's round trip: the same as a read of its own. The
// server here runs no listener (Run is not called), so only the flusher can
// wake the waiter.
func TestCompletionFlushWakesTheLongPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	st, owner, reg := f.st, f.owner, f.worker
	id, err := st.CreateWorkflow(ctx, owner.ID, f.oneTask())
	if err != nil {
		t.Fatal(err)
	}
	cands, _, err := st.Candidates(ctx, 1, nil)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v: %v", cands, err)
	}
	claimed, err := st.ClaimPicks(ctx, []store.Pick{{TaskID: cands[0].TaskID, Worker: reg.ID}}, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claimed %v: %v", claimed, err)
	}

	s := New(st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	woken, forget := s.ends.addWatching(strings.ToLower(id))
	defer forget()
	gone := make(chan struct{})
	close(gone) // the ack is dropped: no socket behind this connection
	c := &conn{id: reg.ID, done: gone, log: slog.New(slog.DiscardHandler)}
	s.flushCompletions(ctx, []completion{{c: c, of: protocol.AckResult, workflow: strings.ToLower(id),
		comp: store.Completion{Attempt: claimed[0].Attempt, Worker: reg.ID, OK: true, Outputs: []store.Output{{Name: "stdout", Data: []byte("out")}}}}})
	select {
	case wk := <-woken:
		if !wk.finished || wk.status == nil {
			t.Fatalf("the waiter was woken with %+v, want told the workflow finished, with its status", wk)
		}
		want, spans, err := st.StatusAndSpans(ctx, owner.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(wk.status.Status, want) || !reflect.DeepEqual(wk.status.Spans, spans) {
			t.Errorf("status read with the completion:\n%+v %+v\nread after:\n%+v %+v", wk.status.Status, wk.status.Spans, want, spans)
		}
	default:
		t.Fatal("the flusher committed the workflow's end and did not wake its waiter")
	}
	if sum, err := st.Summary(ctx, owner.ID, id); err != nil || sum.State != store.StateDone {
		t.Fatalf("workflow after the flush: %+v, %v", sum, err)
	}
}

// fixture is a store with an owner who pushed a module, and a registered
// worker.
type fixture struct {
	st     *store.Store
	owner  store.Owner
	token  string // the owner's
	url    string // the database's
	module string
	worker store.Registration
}

// openStore opens a store on a fresh database, closed when the test ends,
// and returns it with the database's URL and the token of an owner.
func openStore(t *testing.T) (st *store.Store, url, token string) {
	t.Helper()
	ctx := context.Background()
	url = pgtest.Template(t, "store", func(ctx context.Context, url string) error {
		st, err := store.Open(ctx, url)
		if err != nil {
			return err
		}
		st.Close()
		return nil
	})
	st, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	token, err = st.CreateOwner(ctx, "owner")
	if err != nil {
		t.Fatal(err)
	}
	return st, url, token
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	st, url, tok := openStore(t)
	owner, err := st.OwnerByToken(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	mod := "sha256:" + fmt.Sprintf("%064x", 1)
	if _, _, err := st.PutModule(ctx, owner.ID, 1<<30, mod, []byte("\x00asm"), []string{}); err != nil {
		t.Fatal(err)
	}
	reg, err := st.RegisterWorker(ctx, store.WorkerHello{Kind: "headless", Slots: 1}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, owner: owner, token: tok, url: url, module: mod, worker: reg}
}

// socketless adds to s's hub a worker connection of slots slots with no
// socket behind it (the frames it is sent are dropped), heard from now: one
// of the operator's, which all its slots may fill from the start.
func socketless(s *Server, worker string, slots int) *conn {
	gone := make(chan struct{})
	close(gone)
	c := &conn{id: worker, done: gone, log: slog.New(slog.DiscardHandler), threads: slots, slots: slots, free: slots,
		running: map[int64]heldAttempt{}, operator: true}
	c.heard.Store(time.Now().UnixNano())
	s.hub.add(c)
	return c
}

// submitMany submits a batch workflow of n tasks.
func (f *fixture) submitMany(t *testing.T, n int) {
	t.Helper()
	var tasks []store.NewTask
	for i := range n {
		tasks = append(tasks, store.NewTask{Name: fmt.Sprintf("t%d", i), Module: f.module, MaxAttempts: 1, TimeoutMS: 1000,
			MemoryPages: 16, OutputBytes: 1 << 20, LogBytes: 1 << 10})
	}
	if _, err := f.st.CreateWorkflow(context.Background(), f.owner.ID, &store.NewWorkflow{Name: "many", Priority: "batch", Tasks: tasks}); err != nil {
		t.Fatal(err)
	}
}

// oneTask is an interactive workflow of one task.
func (f *fixture) oneTask() *store.NewWorkflow {
	return &store.NewWorkflow{Name: "one", Priority: "interactive", Tasks: []store.NewTask{{
		Name: "t", Module: f.module, MaxAttempts: 1, TimeoutMS: 1000, MemoryPages: 16, OutputBytes: 1 << 20, LogBytes: 1 << 10}}}
}

// A submission claims its ready tasks for an idle slot only when no older
// ready task may be waiting for it: not while the dispatcher's last round
// (or the one under way) left ready tasks, nor while a wake-up announced
// some. Otherwise it only writes the workflow, and the dispatcher claims.
func TestSubmissionClaimsOnlyWhenNoTaskWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	for _, tc := range []struct {
		name        string
		left, woken bool
		claims      bool
	}{
		{"nothing waits", false, false, true},
		{"a round left ready tasks", true, false, false},
		{"ready tasks announced", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
			c := socketless(s, f.worker.ID, 1)
			s.disp.readyLeft.Store(tc.left)
			s.disp.tasksWake.Store(tc.woken)
			id, err := s.submit(ctx, f.owner.ID, f.oneTask())
			if err != nil {
				t.Fatal(err)
			}
			st, err := f.st.Status(ctx, f.owner.ID, id)
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]string{true: store.StateRunning, false: store.StateReady}[tc.claims]
			if got := st.Tasks[0].State; got != want {
				t.Errorf("task %s after the submission, want %s", got, want)
			}
			if (len(c.running) == 1) != tc.claims {
				t.Errorf("the worker holds %d attempts, want %d", len(c.running), map[bool]int{true: 1}[tc.claims])
			}
		})
	}
}

// Two replicas that take turns claiming from one queue plan from what is
// still ready: a replica's cache of candidates, once caught out, is turned
// off; it would otherwise keep offering the tasks the other one claimed
// (claims send no notification), and its picks would be refused round
// after round.
func TestReplicasTakingTurnsPlanFromWhatIsReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submitMany(t, 200)
	other, err := f.st.RegisterWorker(ctx, store.WorkerHello{Kind: "headless", Slots: 4}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var servers []*Server
	var conns []*conn
	for i, w := range []string{f.worker.ID, other.ID} {
		s := New(f.st, Config{Replica: fmt.Sprintf("r%d", i), Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
		servers, conns = append(servers, s), append(conns, socketless(s, w, 4))
	}
	claimed, refused := 0, 0
	for round := range 40 {
		s, c := servers[round%2], conns[round%2]
		s.hub.setFree(c, 4) // the last round's attempts ended
		n, planned, _, err := s.disp.assign(ctx, s.hub.reserve(1000))
		if err != nil {
			t.Fatal(err)
		}
		claimed, refused = claimed+n, refused+planned-n
	}
	// Each replica's cache may be caught out once, in one round of 4 picks.
	if claimed < 152 || refused > 8 {
		t.Errorf("40 rounds of 4 slots claimed %d tasks, with %d picks refused; want 152 at least, and 8 refused at most", claimed, refused)
	}
}

// A replica alone plans its next rounds from the candidates it read and
// did not claim, and reads anew once a task became ready (wake).
func TestDispatcherReusesItsCandidates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submitMany(t, 200)
	s := New(f.st, Config{Replica: "r", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	c := socketless(s, f.worker.ID, 4)
	read := 2 * candidateWindow(4, 0) // what a fresh read takes
	for round, want := range []int{read - 4, read - 8, read - 12, read - 4} {
		if round == 3 {
			s.wake() // a task became ready: the next round reads anew
		}
		s.hub.setFree(c, 4) // the last round's attempts ended
		if n, _, _, err := s.disp.assign(ctx, s.hub.reserve(1000)); err != nil || n != 4 {
			t.Fatalf("round %d: %d claimed, err %v", round, n, err)
		}
		if got := len(s.disp.cands.tasks); !s.disp.cands.ok || got != want {
			t.Errorf("round %d: %d candidates kept (cache on: %v), want %d", round, got, s.disp.cands.ok, want)
		}
	}
}

// Ready tasks that none of the idle workers may take fill the head of the
// queue: the candidate window widens past them, as it does past replicas
// those workers ran, so that a task behind them, which these workers may
// take, is claimed rather than held back for as long as they wait. (The
// same owner's task: another owner's would be at the head of the window,
// by the queue's fair share.) The tasks ahead: with a setup, for a worker of a build without the
// setup feature; or of a module that never ran (run time unknown), for an
// unstable worker (on battery, its trend not known yet), which takes only
// tasks known to be short.
func TestWindowWidensPastTasksTheWorkersMayNotTake(t *testing.T) {
	t.Parallel()
	fresh := "sha256:" + fmt.Sprintf("%064x", 2) // never ran: run time unknown
	for _, tc := range []struct {
		name     string
		module   string // of the 200 tasks ahead; "" for the fixture's
		setup    []byte // theirs
		unstable bool
	}{
		{"setups, a worker without the feature", "", []byte(`{"env":["A=1"]}`), false},
		{"unknown run times, an unstable worker", fresh, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newFixture(t)
			module := cmp.Or(tc.module, f.module)
			if module != f.module {
				if _, _, err := f.st.PutModule(ctx, f.owner.ID, 1<<30, module, []byte("\x00asm"), []string{}); err != nil {
					t.Fatal(err)
				}
			}
			var tasks []store.NewTask
			for i := range 200 {
				tasks = append(tasks, store.NewTask{Name: fmt.Sprintf("t%d", i), Module: module, MaxAttempts: 1, TimeoutMS: 1000,
					MemoryPages: 16, OutputBytes: 1 << 20, LogBytes: 1 << 10, Setup: tc.setup})
			}
			if _, err := f.st.CreateWorkflow(ctx, f.owner.ID, &store.NewWorkflow{Name: "ahead", Priority: "batch", Tasks: tasks}); err != nil {
				t.Fatal(err)
			}
			plain := store.NewTask{Name: "plain", Module: f.module, MaxAttempts: 1, TimeoutMS: 1000, MemoryPages: 16, OutputBytes: 1 << 20, LogBytes: 1 << 10}
			id, err := f.st.CreateWorkflow(ctx, f.owner.ID, &store.NewWorkflow{Name: "plain", Priority: "batch", Tasks: []store.NewTask{plain}})
			if err != nil {
				t.Fatal(err)
			}
			s := New(f.st, Config{Replica: "r", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
			c := socketless(s, f.worker.ID, 1) // without the setup feature
			if tc.unstable {
				s.rt.stats.Set(f.module, "plain", 5, 10*time.Second) // the task behind them is known short
				c.samples = []sched.Sample{{At: time.Now(), Online: true, Battery: 0.5}}
			}
			claimed := 0
			for range 10 {
				s.hub.setFree(c, 1)
				n, _, _, err := s.disp.assign(ctx, s.hub.reserve(1000))
				if err != nil {
					t.Fatal(err)
				}
				claimed += n
			}
			st, err := f.st.Status(ctx, f.owner.ID, id)
			if err != nil {
				t.Fatal(err)
			}
			if claimed != 1 || st.Tasks[0].State != store.StateRunning {
				t.Errorf("10 rounds claimed %d tasks, and the task behind 200 is %s; want it claimed, alone",
					claimed, st.Tasks[0].State)
			}
		})
	}
}

// A checkpoint saved for an attempt this replica delivered is timed for
// its module (the cost that sets checkpoint intervals); one for an attempt
// the connection does not hold is neither saved nor timed.
func TestCheckpointCostIsObservedForItsModule(t *testing.T) {
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
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	c := socketless(s, f.worker.ID, 1)
	checkpoint := func(attempt int64) {
		t.Helper()
		fr := &protocol.Frame{Type: protocol.TypeCheckpoint, Checkpoint: &protocol.Checkpoint{Attempt: attempt, Seq: 1,
			State: protocol.Blob{Data: []byte("state")}}}
		if err := s.handleFrame(ctx, c, fr); err != nil {
			t.Fatal(err)
		}
	}
	cost := func() (time.Duration, bool) { return s.rt.checkpointCost(f.module) }

	checkpoint(claimed[0].Attempt) // not delivered through this connection
	if d, ok := cost(); ok {
		t.Fatalf("a checkpoint of an attempt not held was timed: %v", d)
	}
	if _, ok := s.hub.started(c, []protocol.Assign{{Attempt: claimed[0].Attempt, Module: f.module}}, []int64{0}); !ok {
		t.Fatal("started refused")
	}
	checkpoint(claimed[0].Attempt)
	if d, ok := cost(); !ok || d <= 0 {
		t.Fatalf("the checkpoint's cost for its module: %v, %v; want a time", d, ok)
	}
}
