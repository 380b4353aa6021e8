//go:build unix

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// A worker can report only on attempts it holds. While worker A holds a
// live attempt, worker B's heartbeat, checkpoint, result and failure for it
// (alone, and a forged result beside B's own in one frame) are refused
// (acks ok:false, not retry) and change nothing: the attempt still runs on
// A with its lease, progress and no checkpoint, the task has no output.
// The server keeps serving both: B gets, runs and reports a task of its
// own, and A's own checkpoint and result for its attempt are accepted, so
// the task ends with exactly one attempt, A's, one checkpoint and A's
// output.
func TestWorkerReportsOnlyOnAttemptsItHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The fake workers' heartbeats list no attempt, so A's lease is renewed
	// by nothing but its own checkpoint: long enough for the whole test.
	p := newPlatform(t, "--lease", "30s")
	db, err := pgx.Connect(ctx, p.db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	echo := push(t, p.client, "echo")

	a := dialFake(t, p.srv.url)
	held := submit(t, p.client, workflow("held", task{"name": "t", "module": echo, "max_attempts": 1}))
	as := a.next(t, protocol.TypeAssign, 30*time.Second).Assign
	if len(as) != 1 || as[0].Task != held+"/t" {
		t.Fatalf("A was assigned %+v, want the one attempt of %s/t", as, held)
	}
	attempt := as[0].Attempt
	// B connects once A holds the only task.
	b := dialFake(t, p.srv.url)

	// row is what the database says of A's attempt and its task.
	type row struct {
		worker, state, taskState string
		lease                    time.Time
		progress                 float32
		ckptSeq, outputs         int
		ckpt                     []byte
	}
	read := func() row {
		t.Helper()
		var r row
		if err := db.QueryRow(ctx, `SELECT a.worker_id::text, a.state, a.lease_until, a.progress, t.state, t.checkpoint_seq, t.checkpoint,
				(SELECT count(*) FROM task_outputs o WHERE o.task_id = t.id)
			FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE a.id = $1`, attempt).Scan(
			&r.worker, &r.state, &r.lease, &r.progress, &r.taskState, &r.ckptSeq, &r.ckpt, &r.outputs); err != nil {
			t.Fatal(err)
		}
		return r
	}
	before := read()
	if before.worker != a.welcome.WorkerID || before.state != "running" || before.taskState != "running" {
		t.Fatalf("A's attempt %d before B's frames: %+v, want running on A (%s)", attempt, before, a.welcome.WorkerID)
	}
	refused := func(who string, ack protocol.Ack) {
		t.Helper()
		if ack.OK || ack.Retry {
			t.Errorf("%s for A's attempt %d: ack %+v, want refused (ok false, no retry)", who, attempt, ack)
		}
	}

	// B speaks for A's attempt: progress, a checkpoint, a result, a failure.
	b.send(t, &protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{
		Running: []protocol.Progress{{Attempt: attempt, Fraction: 0.75}}}})
	b.send(t, &protocol.Frame{Type: protocol.TypeCheckpoint, Checkpoint: &protocol.Checkpoint{
		Attempt: attempt, Seq: 1, State: protocol.Blob{Data: []byte("B's state")}}})
	refused("B's checkpoint", b.ack(t, attempt, protocol.AckCheckpoint, 10*time.Second))
	b.send(t, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
		Attempt: attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("from B\n")}}, DurationMS: 5}}})
	refused("B's result", b.ack(t, attempt, protocol.AckResult, 10*time.Second))
	b.send(t, &protocol.Frame{Type: protocol.TypeFail, Fails: []protocol.Fail{{
		Attempt: attempt, Reason: protocol.ReasonTrap, Message: "B says it trapped"}}})
	refused("B's failure", b.ack(t, attempt, protocol.AckFail, 10*time.Second))

	after := read()
	if after.worker != before.worker || after.state != "running" || after.taskState != "running" || !after.lease.Equal(before.lease) ||
		after.ckptSeq != 0 || after.ckpt != nil || after.outputs != 0 {
		t.Errorf("A's attempt after B's frames: %+v, want as before (%+v): running on A, same lease, no checkpoint, no output", after, before)
	}
	if as := attempts(t, p.client, held, "t"); len(as) != 1 || as[0].ID != attempt || as[0].State != "running" || as[0].Worker != a.welcome.WorkerID {
		t.Errorf("attempts of the task after B's frames: %+v, want only A's, running", as)
	}

	// The server still serves B: it gets a task of its own (A's one slot is
	// taken), and of a frame with its own result and a forged one for A's
	// attempt, only its own is accepted.
	mine := submit(t, p.client, workflow("mine", task{"name": "m", "module": echo, "max_attempts": 1}))
	bs := b.next(t, protocol.TypeAssign, 30*time.Second).Assign
	if len(bs) != 1 || bs[0].Task != mine+"/m" {
		t.Fatalf("B was assigned %+v, want the one attempt of %s/m", bs, mine)
	}
	b.send(t, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{
		{Attempt: bs[0].Attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("B's own\n")}}, DurationMS: 5},
		{Attempt: attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("from B again\n")}}, DurationMS: 5},
	}})
	got := acksOf(t, b, protocol.AckResult, 10*time.Second, bs[0].Attempt, attempt)
	if ack := got[bs[0].Attempt]; !ack.OK {
		t.Errorf("B's result for its own attempt: ack %+v, want ok", ack)
	}
	refused("B's result beside its own", got[attempt])
	if st := wait(t, p.client, mine, 30*time.Second); st.State != client.WorkflowDone {
		t.Errorf("B's workflow ended %s, want done", st.State)
	}
	if got := output(t, p.client, mine, "m", "stdout"); got != "B's own\n" {
		t.Errorf("B's task's stdout %q, want B's own", got)
	}
	if r := read(); r.state != "running" || r.taskState != "running" || r.outputs != 0 || r.progress != 0 {
		t.Errorf("A's attempt after B's second frame: %+v, want running, no output, no progress", r)
	}

	// A's own word for its attempt is accepted.
	a.send(t, &protocol.Frame{Type: protocol.TypeCheckpoint, Checkpoint: &protocol.Checkpoint{
		Attempt: attempt, Seq: 1, State: protocol.Blob{Data: []byte("A's state")}}})
	if ack := a.ack(t, attempt, protocol.AckCheckpoint, 10*time.Second); !ack.OK {
		t.Fatalf("A's checkpoint for its attempt: ack %+v, want ok", ack)
	}
	if r := read(); r.ckptSeq != 1 || string(r.ckpt) != "A's state" || !r.lease.After(before.lease) {
		t.Errorf("after A's checkpoint: seq %d, state %q, lease %v (was %v); want seq 1, A's state, the lease renewed",
			r.ckptSeq, r.ckpt, r.lease, before.lease)
	}
	a.send(t, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
		Attempt: attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("from A\n")}}, DurationMS: 5}}})
	if ack := a.ack(t, attempt, protocol.AckResult, 10*time.Second); !ack.OK {
		t.Fatalf("A's result for its attempt: ack %+v, want ok", ack)
	}
	st := wait(t, p.client, held, 30*time.Second)
	if tk := st.Task("t"); st.State != client.WorkflowDone || tk.State != client.TaskDone || tk.Checkpoints != 1 {
		t.Errorf("A's workflow: %s, task %+v; want done with one checkpoint", st.State, tk)
	}
	if got := output(t, p.client, held, "t", "stdout"); got != "from A\n" {
		t.Errorf("the task's stdout %q, want A's", got)
	}
	if as := attempts(t, p.client, held, "t"); len(as) != 1 || as[0].ID != attempt || as[0].State != "succeeded" || as[0].Worker != a.welcome.WorkerID {
		t.Errorf("attempts of the task: %+v, want exactly A's, succeeded", as)
	}
	if r := read(); r.outputs != 1 || r.progress != 0 {
		t.Errorf("the task has %d outputs and its attempt progress %v, want 1 (A's stdout) and 0 (B's heartbeat ignored)", r.outputs, r.progress)
	}
	// Both sockets are still open.
	for name, f := range map[string]*fakeWorker{"A": a, "B": b} {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f.ws.Ping(pctx)
		cancel()
		if err != nil {
			t.Errorf("worker %s's socket: %v, want still open", name, err)
		}
	}
}

// acksOf returns f's acks of kind of for the attempts given, which may come
// in one ack frame or in several (f.ack drops the other acks of the frame
// it finds its own in).
func acksOf(t *testing.T, f *fakeWorker, of string, d time.Duration, ids ...int64) map[int64]protocol.Ack {
	t.Helper()
	deadline := time.Now().Add(d)
	got := map[int64]protocol.Ack{}
	for len(got) < len(ids) {
		for _, ack := range f.next(t, protocol.TypeAck, time.Until(deadline)).Acks {
			if ack.Of == of && slices.Contains(ids, ack.Attempt) {
				got[ack.Attempt] = ack
			}
		}
	}
	return got
}
