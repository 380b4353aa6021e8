package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
)

// A wait returns once every gate open for its worker when it began has
// closed: gates of other workers do not hold it, and its context ends it.
func TestClaimGates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		held    []string // workers of the one gate opened
		worker  string   // the one waiting
		returns bool     // before the gate closes
	}{
		{"no gate", nil, "a", true},
		{"another worker's gate", []string{"b"}, "a", true},
		{"its gate", []string{"a"}, "a", false},
		{"a gate of several workers", []string{"b", "a"}, "a", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g claimGates
			release := func() {}
			if tc.held != nil {
				release = g.hold(tc.held)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- g.wait(ctx, tc.worker) }()
			if tc.returns {
				if err := <-done; err != nil {
					t.Fatalf("wait: %v", err)
				}
				release()
				cancel()
				return
			}
			for g.waiting.Load() == 0 { // held at the gate
				time.Sleep(time.Millisecond)
			}
			select {
			case err := <-done:
				t.Fatalf("wait returned (%v) while its gate was open", err)
			default:
			}
			release()
			if err := <-done; err != nil {
				t.Fatalf("wait after the gate closed: %v", err)
			}
			// A gate closed is gone; another held again ends with the context.
			release = g.hold(tc.held)
			go func() { done <- g.wait(ctx, tc.worker) }()
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("wait at an open gate after its context ended: %v", err)
			}
			release()
			if g.open.Load() != 0 || len(g.by) != 0 {
				t.Errorf("%d gates open, %d workers listed after all closed", g.open.Load(), len(g.by))
			}
		})
	}
}

// gateWorker is a worker over a real WebSocket, written by hand to send its
// frames exactly when a test wants them.
type gateWorker struct {
	t       *testing.T
	ws      *websocket.Conn
	id      string
	welcome *protocol.Welcome
}

// dialGateWorker connects a worker of one slot.
func dialGateWorker(t *testing.T, s *Server, url string) *gateWorker {
	t.Helper()
	return dialGateWorkerWith(t, s, url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1})
}

// dialGateWorkerWith connects a worker that says hello and returns once the
// server has added it.
func dialGateWorkerWith(t *testing.T, s *Server, url string, hello *protocol.Hello) *gateWorker {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	w := &gateWorker{t: t, ws: ws}
	w.send(&protocol.Frame{Type: protocol.TypeHello, Hello: hello})
	w.welcome = w.next(protocol.TypeWelcome).Welcome
	w.id = w.welcome.WorkerID
	for !strings.Contains(strings.Join(s.hub.ids(), " "), w.id) { // serveWorker adds it after the welcome
		time.Sleep(time.Millisecond)
	}
	return w
}

func (w *gateWorker) send(f *protocol.Frame) {
	w.t.Helper()
	data, bin, err := protocol.Encode(f)
	if err != nil {
		w.t.Fatal(err)
	}
	typ := websocket.TextMessage
	if bin {
		typ = websocket.BinaryMessage
	}
	if err := w.ws.WriteMessage(typ, data); err != nil {
		w.t.Fatalf("write %s: %v", f.Type, err)
	}
}

// next returns the next frame of type typ, skipping others.
func (w *gateWorker) next(typ string) *protocol.Frame { return w.nextOf(typ) }

// nextOf returns the next frame of one of the types, skipping others.
func (w *gateWorker) nextOf(types ...string) *protocol.Frame {
	w.t.Helper()
	w.ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		mt, data, err := w.ws.ReadMessage()
		if err != nil {
			w.t.Fatalf("waiting for %v: %v", types, err)
		}
		f, err := protocol.Decode(data, mt == websocket.BinaryMessage)
		if err != nil {
			w.t.Fatal(err)
		}
		if slices.Contains(types, f.Type) {
			return f
		}
	}
}

// result sends the result of attempt.
func (w *gateWorker) result(attempt int64) {
	w.send(&protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{Attempt: attempt,
		Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("out\n")}}}}})
}

// submitEarly submits a one-task workflow until its submission claims the
// task itself and sends it to w before its COMMIT, calling afterSend
// between the two: a dispatcher's round that holds w's slot at that moment
// sends the task after the commit instead, and w completes it. It returns
// the attempt sent early and a channel that gives the submission's id and
// error.
func submitEarly(t *testing.T, s *Server, f *fixture, w *gateWorker, name string, afterSend func()) (int64, <-chan submitted) {
	t.Helper()
	for range 20 {
		var early atomic.Bool
		s.disp.afterSend = func() {
			early.Store(true)
			afterSend()
		}
		s.disp.readyLeft.Store(false)
		s.disp.tasksWake.Store(false)
		done := make(chan submitted, 1)
		go func() {
			nw := f.oneTask()
			nw.Name = name
			id, err := s.submit(context.Background(), f.owner.ID, nw)
			done <- submitted{id, err}
		}()
		a := w.next(protocol.TypeAssign).Assign[0]
		if early.Load() {
			s.disp.afterSend = nil
			return a.Attempt, done
		}
		w.result(a.Attempt) // sent by a dispatcher's round
		if ack := w.next(protocol.TypeAck).Acks[0]; !ack.OK {
			t.Fatalf("ack %+v of a task sent after its commit", ack)
		}
		if sub := <-done; sub.err != nil {
			t.Fatal(sub.err)
		}
	}
	t.Fatal("no submission of 20 claimed its task itself")
	return 0, nil
}

type submitted struct {
	id  string
	err error
}

// checkAtCommit connects to f's database and adds a check run at the
// COMMIT of a transaction that wrote a workflow and claimed its tasks (not
// of one written alone): one named held-at-commit waits for advisory lock
// 4242, one named refused-at-commit fails. Real PostgreSQL holding or
// refusing a claiming submission's COMMIT once its attempts are out.
func checkAtCommit(t *testing.T, f *fixture) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) })
	if _, err := admin.Exec(ctx, `CREATE FUNCTION test_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT FROM tasks t JOIN attempts a ON a.task_id = t.id WHERE t.workflow_id = NEW.id) THEN
				IF NEW.name = 'held-at-commit' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
				IF NEW.name = 'refused-at-commit' THEN RAISE EXCEPTION 'refused at commit'; END IF;
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER test_at_commit AFTER INSERT ON workflows DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION test_at_commit()`); err != nil {
		t.Fatal(err)
	}
	return admin
}

// A submission sends its attempt before its COMMIT. The worker's result,
// back before the commit, waits for it (held at the worker's gate) and is
// then accepted: the workflow is done. Over a real WebSocket, with a real
// database.
func TestResultBeforeTheCommitWaitsForIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	admin := checkAtCommit(t, f)
	s, url := runServer(t, f)
	w := dialGateWorker(t, s, url)
	if _, err := admin.Exec(context.Background(), `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	sentResult := make(chan struct{})
	attempt, done := submitEarly(t, s, f, w, "held-at-commit", func() {
		<-sentResult
		// The COMMIT is held: a result handled now would find no
		// attempt and be refused. The read loop must hold it instead.
		giveUp := time.Now().Add(20 * time.Second)
		for s.hub.gates.waiting.Load() == 0 && time.Now().Before(giveUp) {
			time.Sleep(time.Millisecond)
		}
		if s.hub.gates.waiting.Load() == 0 {
			t.Error("the result was not held at its worker's gate")
		}
		if _, err := admin.Exec(context.Background(), `SELECT pg_advisory_unlock(4242)`); err != nil {
			t.Error(err)
		}
	})
	w.result(attempt)
	close(sentResult)
	if ack := w.next(protocol.TypeAck).Acks[0]; ack.Attempt != attempt || !ack.OK {
		t.Errorf("ack %+v, want attempt %d accepted", ack, attempt)
	}
	sub := <-done
	if sub.err != nil {
		t.Fatal(sub.err)
	}
	if st, err := f.st.Summary(context.Background(), f.owner.ID, sub.id); err != nil || st.State != "done" {
		t.Errorf("workflow %v (%v), want done", st, err)
	}
}

// A submission whose COMMIT fails after its attempt went out (refused by a
// check at commit) takes the attempt back: the worker is told to cancel
// it, its result is refused, nothing is written, and the worker's slot is
// free for the next submission.
func TestUncommittedSubmissionTakesItsAttemptBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	admin := checkAtCommit(t, f)
	s, url := runServer(t, f)
	w := dialGateWorker(t, s, url)
	attempt, done := submitEarly(t, s, f, w, "refused-at-commit", func() {})
	if sub := <-done; sub.err == nil {
		t.Fatal("the submission succeeded without its commit")
	}
	if c := w.next(protocol.TypeCancel).Cancel; len(c.Attempts) != 1 || c.Attempts[0] != attempt {
		t.Errorf("cancel %+v, want attempt %d", c, attempt)
	}
	w.result(attempt)
	if ack := w.next(protocol.TypeAck).Acks[0]; ack.Attempt != attempt || ack.OK || ack.Retry {
		t.Errorf("ack %+v, want attempt %d refused", ack, attempt)
	}
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM attempts WHERE id = $1`, attempt).Scan(&n); err != nil || n != 0 {
		t.Errorf("attempt %d written %d times (%v), want never", attempt, n, err)
	}
	// The slot is free: the next submission's task reaches the worker.
	s.disp.readyLeft.Store(false)
	s.disp.tasksWake.Store(false)
	id, err := s.submit(ctx, f.owner.ID, f.oneTask())
	if err != nil {
		t.Fatal(err)
	}
	b := w.next(protocol.TypeAssign).Assign[0]
	w.result(b.Attempt)
	if ack := w.next(protocol.TypeAck).Acks[0]; ack.Attempt != b.Attempt || !ack.OK {
		t.Errorf("ack %+v of the next submission's attempt, want it accepted", ack)
	}
	if st, err := f.st.Summary(ctx, f.owner.ID, id); err != nil || st.State != "done" {
		t.Errorf("next workflow %v (%v), want done", st, err)
	}
}

// A panic while a submission sends its attempts, after its COMMIT went out
// in the same write: the panic is caught, the store reads the COMMIT's
// answer, and the committed attempt is ended without counting against its
// task or worker and taken back (cancel, its result refused). The workflow
// is submitted all the same, and its task, ready again, runs to the end.
func TestPanicWhileSendingEndsTheCommittedAttempt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	admin := checkAtCommit(t, f)
	s, url := runServer(t, f)
	w := dialGateWorker(t, s, url)
	attempt, done := submitEarly(t, s, f, w, "panic-in-send", func() { panic("a bug in sending") })
	sub := <-done
	if sub.err != nil || sub.id == "" {
		t.Fatalf("submission: id %q, err %v; want it submitted", sub.id, sub.err)
	}
	// The cancel, the refusal of the result sent after it and the task's
	// next attempt (ready again, it may come first), in any order.
	var cancelled, refused bool
	var b *protocol.Assign
	for !cancelled || !refused || b == nil {
		switch f := w.nextOf(protocol.TypeCancel, protocol.TypeAck, protocol.TypeAssign); f.Type {
		case protocol.TypeCancel:
			if len(f.Cancel.Attempts) != 1 || f.Cancel.Attempts[0] != attempt {
				t.Fatalf("cancel %+v, want attempt %d", f.Cancel, attempt)
			}
			cancelled = true
			w.result(attempt)
		case protocol.TypeAck:
			if ack := f.Acks[0]; ack.Attempt != attempt || ack.OK {
				t.Fatalf("ack %+v, want attempt %d refused", ack, attempt)
			}
			refused = true
		case protocol.TypeAssign:
			b = &f.Assign[0]
		}
	}
	var state string
	if err := admin.QueryRow(ctx, `SELECT state FROM attempts WHERE id = $1`, attempt).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state == "running" {
		t.Errorf("attempt %d still running in the database", attempt)
	}
	// The task went to the worker again, and counts one attempt: that one.
	w.result(b.Attempt)
	if ack := w.next(protocol.TypeAck).Acks[0]; ack.Attempt != b.Attempt || !ack.OK {
		t.Errorf("ack %+v of the task's next attempt, want it accepted", ack)
	}
	var attempts int
	if err := admin.QueryRow(ctx, `SELECT attempts FROM tasks WHERE workflow_id = $1`, sub.id).Scan(&attempts); err != nil || attempts != 1 {
		t.Errorf("the task counts %d attempts (%v), want 1: the one taken back does not count", attempts, err)
	}
	if st, err := f.st.Summary(ctx, f.owner.ID, sub.id); err != nil || st.State != "done" {
		t.Errorf("workflow %v (%v), want done", st, err)
	}
}

// A panic in the middle of sending a submission's attempts, before they
// are recorded as started, gives their slots back: the task, ended
// uncounted, reaches the worker again through its freed slot, and runs to
// the end.
func TestPanicMidSendFreesTheSlots(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	admin := checkAtCommit(t, f)
	s, url := runServer(t, f)
	w := dialGateWorker(t, s, url)
	var panicked atomic.Bool
	s.disp.beforeStart = func(ctx context.Context) {
		// Only in a submission's sending (its context has a deadline, a
		// dispatcher round's has none), and once.
		if _, ok := ctx.Deadline(); ok && panicked.CompareAndSwap(false, true) {
			panic("a bug in sending")
		}
	}
	for try := 0; ; try++ {
		s.disp.readyLeft.Store(false)
		s.disp.tasksWake.Store(false)
		id, err := s.submit(ctx, f.owner.ID, f.oneTask())
		if err != nil {
			t.Fatal(err)
		}
		a := w.next(protocol.TypeAssign).Assign[0]
		w.result(a.Attempt)
		if ack := w.next(protocol.TypeAck).Acks[0]; ack.Attempt != a.Attempt || !ack.OK {
			t.Errorf("ack %+v, want attempt %d accepted", ack, a.Attempt)
		}
		if !panicked.Load() {
			if try == 20 {
				t.Fatal("no submission of 20 sent its attempt itself")
			}
			continue // a dispatcher round sent it
		}
		if st, err := f.st.Summary(ctx, f.owner.ID, id); err != nil || st.State != "done" {
			t.Errorf("workflow %+v (%v), want done", st, err)
		}
		var attempts int
		if err := admin.QueryRow(ctx, `SELECT attempts FROM tasks WHERE workflow_id = $1`, id).Scan(&attempts); err != nil || attempts != 1 {
			t.Errorf("the task counts %d attempts (%v), want 1: the one ended mid-send does not count", attempts, err)
		}
		return
	}
}

// A submission sends its attempts before it claims them, under ids drawn
// ahead in a block. A worker that holds an attempt claimed since the block
// was drawn gets a newer id all the same: each worker's attempts keep the
// order it got them in, which the reaper and the bound on wall time count
// on. Over a real WebSocket, with a real database.
func TestEarlyAttemptIsNewerThanTheWorkersOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	s, url := runServer(t, f)
	w := dialGateWorkerWith(t, s, url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 2})
	first, done := submitEarly(t, s, f, w, "first", func() {})
	w.result(first)
	if ack := w.next(protocol.TypeAck).Acks[0]; !ack.OK {
		t.Fatalf("ack %+v of the first attempt", ack)
	}
	if sub := <-done; sub.err != nil {
		t.Fatal(sub.err)
	}
	// Claimed by a dispatcher's round, after the block of the first was
	// drawn; the worker keeps it running.
	s.disp.readyLeft.Store(true)
	if _, err := s.submit(ctx, f.owner.ID, f.oneTask()); err != nil {
		t.Fatal(err)
	}
	held := w.next(protocol.TypeAssign).Assign[0].Attempt
	if held <= first {
		t.Fatalf("attempt %d claimed after %d", held, first)
	}
	next, done := submitEarly(t, s, f, w, "next", func() {})
	if next <= held {
		t.Errorf("attempt %d sent early to a worker that holds attempt %d: want a newer id", next, held)
	}
	w.result(next)
	if ack := w.next(protocol.TypeAck).Acks[0]; ack.Attempt != next || !ack.OK {
		t.Errorf("ack %+v, want attempt %d accepted", ack, next)
	}
	sub := <-done
	if sub.err != nil {
		t.Fatal(sub.err)
	}
	// The attempt sent was the one drawn for it, not one claimed again
	// after an older one was left out (hub.started).
	db, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1`,
		sub.id).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d attempts of the task (%v), want the one sent early", n, err)
	}
}

// An attempt older than one its worker holds is not sent: it ends as never
// started, to be queued again, and the slot reserved for it is free again.
func TestStaleAttemptGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	c := socketless(s, f.worker.ID, 2)
	if slots := s.hub.reserve(2); len(slots) != 2 {
		t.Fatalf("reserved %d slots, want 2", len(slots))
	}
	if ends := s.disp.start(c, []protocol.Assign{{Attempt: 100, Module: f.module}}, []int64{0}, nil); len(ends) != 0 {
		t.Fatalf("attempt 100 not started: %+v", ends)
	}
	ends := s.disp.start(c, []protocol.Assign{{Attempt: 50, Module: f.module}}, []int64{0}, nil)
	if len(ends) != 1 || ends[0].Attempt != 50 || ends[0].End != store.EndUnstarted {
		t.Errorf("ends %+v, want attempt 50 ended as never started", ends)
	}
	if _, running := c.running[50]; running {
		t.Error("attempt 50 recorded as running")
	}
	if free := s.hub.freeOf(c); free != 1 {
		t.Errorf("%d free slots, want 1: the stale attempt's slot given back", free)
	}
}

// notClaimed splits what an early submission sent against what its claim
// wrote: the attempts sent but not written go back to their workers, and
// only the undeliverable attempts that were written are ended.
func TestNotClaimed(t *testing.T) {
	t.Parallel()
	cl := func(ids ...int64) []store.Claimed {
		var cs []store.Claimed
		for _, id := range ids {
			cs = append(cs, store.Claimed{Attempt: id})
		}
		return cs
	}
	ends := func(ids ...int64) []store.Completion {
		var cs []store.Completion
		for _, id := range ids {
			cs = append(cs, store.Completion{Attempt: id})
		}
		return cs
	}
	ids := func(cs []store.Claimed) []int64 {
		var out []int64
		for _, c := range cs {
			out = append(out, c.Attempt)
		}
		return out
	}
	endIDs := func(cs []store.Completion) []int64 {
		var out []int64
		for _, c := range cs {
			out = append(out, c.Attempt)
		}
		return out
	}
	for _, tc := range []struct {
		name                      string
		sent, claimed             []store.Claimed
		undeliverable             []store.Completion
		wantGone, wantUndelivered []int64
	}{
		{"all written", cl(1, 2), cl(1, 2), ends(2), nil, []int64{2}},
		{"one refused", cl(1, 2, 3), cl(1, 3), ends(2, 3), []int64{2}, []int64{3}},
		{"none written", cl(1, 2), cl(), ends(1), []int64{1, 2}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gone, kept := notClaimed(tc.sent, tc.undeliverable, tc.claimed)
			if !slices.Equal(ids(gone), tc.wantGone) || !slices.Equal(endIDs(kept), tc.wantUndelivered) {
				t.Errorf("gone %v, undeliverable %v; want %v, %v", ids(gone), endIDs(kept), tc.wantGone, tc.wantUndelivered)
			}
		})
	}
}
