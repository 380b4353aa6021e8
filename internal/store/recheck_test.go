package store

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// verifyFixture is a fixture with a replicated workflow's helpers: workers
// by name, claims of one replica on one worker and attempt states.
type verifyFixture struct {
	*fixture
	workers map[string]string
}

func newVerifyFixture(t *testing.T, names ...string) *verifyFixture {
	t.Helper()
	f := &verifyFixture{fixture: newFixture(t), workers: map[string]string{}}
	for _, n := range names {
		reg, err := f.s.RegisterWorker(context.Background(), WorkerHello{Kind: "headless", Slots: 1}, time.Minute)
		w := reg.ID
		if err != nil {
			t.Fatal(err)
		}
		f.workers[n] = w
	}
	return f
}

// trust gives a worker a long, clean record (adaptive replication trusts it).
func (f *verifyFixture) trust(t *testing.T, name string) {
	t.Helper()
	if _, err := f.s.pool.Exec(context.Background(), `UPDATE workers SET results_valid = 30, valid_streak = 30 WHERE id = $1`,
		f.workers[name]); err != nil {
		t.Fatal(err)
	}
}

// claimOn claims one replica of the ready task called name on a worker.
func (f *verifyFixture) claimOn(t *testing.T, name, worker string, solo bool) Claimed {
	t.Helper()
	ctx := context.Background()
	cands, _, err := f.s.Candidates(ctx, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cands {
		if c.Name != name {
			continue
		}
		cs, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: c.TaskID, Worker: f.workers[worker], Solo: solo}}, time.Minute)
		if err != nil || len(cs) != 1 {
			t.Fatalf("claim %s on %s: %+v, %v", name, worker, cs, err)
		}
		return cs[0]
	}
	t.Fatalf("task %s is not ready: %+v", name, cands)
	return Claimed{}
}

func (f *verifyFixture) complete(t *testing.T, c Claimed, out string) {
	t.Helper()
	if acc, err := f.s.Complete(context.Background(), []Completion{ok(c, out)}); err != nil || !acc[0] {
		t.Fatalf("complete attempt %d: %v, %v", c.Attempt, acc, err)
	}
}

// attemptStates maps attempt ids of a task to their state.
func (f *verifyFixture) attemptStates(t *testing.T, wf, task string) map[int64]Attempt {
	t.Helper()
	as, err := f.s.Attempts(context.Background(), f.owner, wf, task)
	if err != nil {
		t.Fatal(err)
	}
	m := map[int64]Attempt{}
	for _, a := range as {
		m[a.ID] = a
	}
	return m
}

func (f *verifyFixture) output(t *testing.T, wf, task string) string {
	t.Helper()
	out, err := outputBytesOf(f.s.Output(context.Background(), f.owner, wf, task, "stdout"))
	if err != nil {
		t.Fatalf("output of %s: %v", task, err)
	}
	return string(out)
}

func (f *verifyFixture) record(t *testing.T, name string) (valid, invalid int64) {
	t.Helper()
	recs, err := f.s.Workers(context.Background(), []string{f.workers[name]})
	if err != nil || len(recs) != 1 {
		t.Fatalf("worker %s: %+v, %v", name, recs, err)
	}
	return recs[0].ResultsValid, recs[0].ResultsInvalid
}

// Once a quorum is reached, or the task fails, the replicas still running
// are cancelled: their attempts end and ChannelCancel names them.
func TestSiblingReplicasCancelled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		finish func(t *testing.T, f *verifyFixture, a, b Claimed)
		state  string
		// stopped is how many replicas get cancelled (the last ones).
		stopped int
	}{
		{name: "quorum reached", state: StateDone, stopped: 1, finish: func(t *testing.T, f *verifyFixture, a, b Claimed) {
			f.complete(t, a, "x")
			f.complete(t, b, "x")
		}},
		{name: "task failed", state: StateFailed, stopped: 2, finish: func(t *testing.T, f *verifyFixture, a, _ Claimed) {
			if _, err := f.s.Complete(context.Background(), []Completion{{Attempt: a.Attempt, Worker: a.Worker, Reason: "input",
				Message: "missing", End: EndTaskFinal}}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newVerifyFixture(t, "w1", "w2", "w3")
			id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch", Tasks: []NewTask{f.task("a")},
				Replicas: 3, Quorum: 2, MaxReplicas: 5})
			if err != nil {
				t.Fatal(err)
			}
			a := f.claimOn(t, "a", "w1", false)
			b := f.claimOn(t, "a", "w2", false)
			c := f.claimOn(t, "a", "w3", false)
			conn, err := f.s.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+ChannelCancel); err != nil {
				t.Fatal(err)
			}
			tc.finish(t, f, a, b)
			if st := f.states(t, id); st["a"] != tc.state {
				t.Fatalf("task a = %s, want %s", st["a"], tc.state)
			}
			all := []Claimed{a, b, c}
			var want []string
			for _, r := range all[len(all)-tc.stopped:] {
				if got := f.attemptStates(t, id, "a")[r.Attempt]; got.State != "cancelled" {
					t.Errorf("replica %d = %+v, want cancelled", r.Attempt, got)
				}
				want = append(want, strconv.FormatInt(r.Attempt, 10))
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			n, err := conn.Conn().WaitForNotification(wctx)
			if err != nil {
				t.Fatalf("no cancel notification: %v", err)
			}
			if n.Payload != strings.Join(want, ",") {
				t.Errorf("cancel payload = %q, want %q", n.Payload, strings.Join(want, ","))
			}
		})
	}
}

// A result a trusted worker got accepted alone is re-checked when that
// worker later loses a quorum: the task is reopened while its workflow
// runs, and a quorum decides. Confirmed, nothing downstream changes;
// overturned, the task takes the quorum's outputs and its dependents that
// consumed the old ones run again.
func TestUnverifiedResultRechecked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		recheck   []string // outputs of the re-check replicas (on w1, then w2)
		wantA     string
		bReset    bool
		trustedIn int64 // the trusted worker's invalid results at the end
	}{
		{name: "confirmed", recheck: []string{"A?"}, wantA: "A?", trustedIn: 1},
		{name: "overturned", recheck: []string{"A", "A"}, wantA: "A", bReset: true, trustedIn: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newVerifyFixture(t, "trusted", "w1", "w2")
			f.trust(t, "trusted")
			id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch",
				Tasks:    []NewTask{f.task("a"), f.task("b", NewInput{Name: "in", From: 0, Output: "stdout"}), f.task("c")},
				Replicas: 2, Quorum: 2, MaxReplicas: 5})
			if err != nil {
				t.Fatal(err)
			}
			// a runs alone on the trusted worker and is accepted unverified.
			a0 := f.claimOn(t, "a", "trusted", true)
			f.complete(t, a0, "A?")
			if st := f.states(t, id); st["a"] != StateDone {
				t.Fatalf("a accepted alone: %v", st)
			}
			if v := f.attemptStates(t, id, "a")[a0.Attempt].Verdict; v != VerdictUnverified {
				t.Fatalf("a's verdict = %q, want unverified", v)
			}
			// b consumes a's output and is verified by w1 and w2.
			b1 := f.claimOn(t, "b", "w1", false)
			b2 := f.claimOn(t, "b", "w2", false)
			if string(b1.Inputs[0].Data) != "A?" {
				t.Fatalf("b's input = %q", b1.Inputs[0].Data)
			}
			f.complete(t, b1, "B(A?)")
			f.complete(t, b2, "B(A?)")
			// c: the trusted worker loses a quorum.
			c0 := f.claimOn(t, "c", "trusted", false)
			c1 := f.claimOn(t, "c", "w1", false)
			f.complete(t, c0, "forged")
			f.complete(t, c1, "C")
			c2 := f.claimOn(t, "c", "w2", false)
			f.complete(t, c2, "C")
			st := f.states(t, id)
			if st["c"] != StateDone || st["a"] != StateReady || st[""] != StateRunning {
				t.Fatalf("after the trusted worker lost a quorum: %v, want c done, a ready for a re-check, workflow running", st)
			}
			if st["b"] != StateDone {
				t.Fatalf("b = %s, want done until the re-check decides", st["b"])
			}
			// The trusted worker may not re-check itself; w1 and w2 do.
			if cs, _ := f.s.ClaimPicks(ctx, []Pick{{TaskID: a0.TaskID, Worker: f.workers["trusted"]}}, time.Minute); len(cs) != 0 {
				t.Fatalf("the trusted worker re-checks its own result: %+v", cs)
			}
			for i, out := range tc.recheck {
				r := f.claimOn(t, "a", []string{"w1", "w2"}[i], false)
				f.complete(t, r, out)
			}
			st = f.states(t, id)
			if st["a"] != StateDone {
				t.Fatalf("after the re-check: %v, want a done", st)
			}
			if got := f.output(t, id, "a"); got != tc.wantA {
				t.Errorf("a's output = %q, want %q", got, tc.wantA)
			}
			if !tc.bReset {
				if st["b"] != StateDone || st[""] != StateDone {
					t.Fatalf("confirmed re-check changed b or the workflow: %v", st)
				}
				if got := f.output(t, id, "b"); got != "B(A?)" {
					t.Errorf("b's output = %q", got)
				}
			} else {
				if st["b"] != StateReady || st[""] != StateRunning {
					t.Fatalf("overturned re-check: %v, want b ready to run again and the workflow running", st)
				}
				// b runs again on the quorum's output, on the same workers.
				b1 := f.claimOn(t, "b", "w1", false)
				b2 := f.claimOn(t, "b", "w2", false)
				if string(b1.Inputs[0].Data) != "A" {
					t.Fatalf("b's input after the reset = %q, want the quorum's", b1.Inputs[0].Data)
				}
				f.complete(t, b1, "B(A)")
				f.complete(t, b2, "B(A)")
				if st := f.states(t, id); st["b"] != StateDone || st[""] != StateDone {
					t.Fatalf("after b ran again: %v", st)
				}
				if got := f.output(t, id, "b"); got != "B(A)" {
					t.Errorf("b's output = %q, want B(A)", got)
				}
			}
			if _, invalid := f.record(t, "trusted"); invalid != tc.trustedIn {
				t.Errorf("trusted worker's invalid results = %d, want %d", invalid, tc.trustedIn)
			}
			if st, err := f.s.Status(ctx, f.owner, id); err != nil || st.State != StateDone {
				t.Fatalf("workflow = %+v, %v", st, err)
			}
		})
	}
}

// A result accepted alone in a workflow that has finished cannot be
// re-run: when its worker loses a quorum later, it is flagged disputed.
func TestUnverifiedResultOfFinishedWorkflowDisputed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newVerifyFixture(t, "trusted", "w1", "w2")
	f.trust(t, "trusted")
	nw := func() string {
		id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch", Tasks: []NewTask{f.task("a")},
			Replicas: 2, Quorum: 2, MaxReplicas: 5})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := nw()
	f.complete(t, f.claimOn(t, "a", "trusted", true), "A?")
	if st := f.states(t, first); st[""] != StateDone {
		t.Fatalf("first workflow: %v", st)
	}
	second := nw()
	c0 := f.claimOn(t, "a", "trusted", false)
	c1 := f.claimOn(t, "a", "w1", false)
	f.complete(t, c0, "forged")
	f.complete(t, c1, "A")
	f.complete(t, f.claimOn(t, "a", "w2", false), "A")
	if st := f.states(t, second); st[""] != StateDone {
		t.Fatalf("second workflow: %v", st)
	}
	st, err := f.s.Status(ctx, f.owner, first)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != StateDone || !st.Tasks[0].Disputed || st.Tasks[0].State != StateDone {
		t.Fatalf("first workflow after the loss: %+v, want done with task a disputed", st)
	}
}

// When a re-check overturns a result, a downstream attempt still running on
// the old input is stopped even if its row is locked at that moment (a
// heartbeat renewing its lease), so it cannot save a checkpoint computed
// from the overturned input; and the re-check's replicas start from zero,
// not from the checkpoint of the worker whose result is in doubt.
func TestOverturnStopsDescendantsAndDropsCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newVerifyFixture(t, "trusted", "w1", "w2", "w3")
	f.trust(t, "trusted")
	id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch",
		Tasks:    []NewTask{f.task("a"), f.task("b", NewInput{Name: "in", From: 0, Output: "stdout"}), f.task("c")},
		Replicas: 2, Quorum: 2, MaxReplicas: 5})
	if err != nil {
		t.Fatal(err)
	}
	// a runs alone on the trusted worker, checkpoints and is accepted.
	a0 := f.claimOn(t, "a", "trusted", true)
	if saved, err := f.s.SaveCheckpoint(ctx, a0.Attempt, a0.Worker, []byte("trusted-state"), time.Minute); err != nil || !saved {
		t.Fatalf("checkpoint of a: %v, %v", saved, err)
	}
	f.complete(t, a0, "A?")
	// One replica of b runs on a's output and checkpoints.
	b1 := f.claimOn(t, "b", "w1", false)
	if saved, err := f.s.SaveCheckpoint(ctx, b1.Attempt, b1.Worker, []byte("state-from-A?"), time.Minute); err != nil || !saved {
		t.Fatalf("checkpoint of b: %v, %v", saved, err)
	}
	// The trusted worker loses a quorum on c: a is reopened.
	c0 := f.claimOn(t, "c", "trusted", false)
	c1 := f.claimOn(t, "c", "w2", false)
	f.complete(t, c0, "forged")
	f.complete(t, c1, "C")
	f.complete(t, f.claimOn(t, "c", "w3", false), "C")
	r1 := f.claimOn(t, "a", "w2", false)
	if r1.Restore != nil {
		t.Fatalf("a re-check replica restores %q, the checkpoint of the worker in doubt", r1.Restore)
	}
	f.complete(t, r1, "A")
	r2 := f.claimOn(t, "a", "w3", false)

	// The second re-check replica overturns A? while b1's row is locked.
	locker, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `SELECT 1 FROM attempts WHERE id = $1 FOR UPDATE`, b1.Attempt); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		acc, err := f.s.Complete(ctx, []Completion{ok(r2, "A")})
		if err == nil && !acc[0] {
			err = errors.New("the overturning result was refused")
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := f.output(t, id, "a"); got != "A" {
		t.Fatalf("a's output after the re-check = %q, want A", got)
	}
	if st := f.attemptStates(t, id, "b")[b1.Attempt].State; st != "cancelled" {
		t.Errorf("b's attempt on the overturned input is %s, want cancelled", st)
	}
	if saved, err := f.s.SaveCheckpoint(ctx, b1.Attempt, b1.Worker, []byte("late-state-from-A?"), time.Minute); err != nil || saved {
		t.Errorf("a checkpoint of b's stopped attempt was saved: %v, %v", saved, err)
	}
	b2 := f.claimOn(t, "b", "w2", false)
	if string(b2.Inputs[0].Data) != "A" || b2.Restore != nil {
		t.Errorf("b runs again on %q restoring %q, want input A from zero", b2.Inputs[0].Data, b2.Restore)
	}
}

// Replicas are independent: a replica started after another one saved a
// checkpoint starts from zero; an unreplicated task resumes from its
// checkpoint as usual.
func TestReplicasDoNotShareCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newVerifyFixture(t, "w1", "w2", "w3")
	if _, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch",
		Tasks: []NewTask{f.task("r")}, Replicas: 2, Quorum: 2, MaxReplicas: 3}); err != nil {
		t.Fatal(err)
	}
	r1 := f.claimOn(t, "r", "w1", false)
	if saved, err := f.s.SaveCheckpoint(ctx, r1.Attempt, r1.Worker, []byte("w1-state"), time.Minute); err != nil || !saved {
		t.Fatalf("checkpoint of the first replica: %v, %v", saved, err)
	}
	if r2 := f.claimOn(t, "r", "w2", false); r2.Restore != nil {
		t.Errorf("the second replica restores %q, the first replica's checkpoint", r2.Restore)
	}

	if _, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "plain", Priority: "batch",
		Tasks: []NewTask{f.task("u")}}); err != nil {
		t.Fatal(err)
	}
	u1 := f.claimOn(t, "u", "w3", false)
	if saved, err := f.s.SaveCheckpoint(ctx, u1.Attempt, u1.Worker, []byte("u-state"), time.Minute); err != nil || !saved {
		t.Fatalf("checkpoint of u: %v, %v", saved, err)
	}
	if acc, err := f.s.Complete(ctx, []Completion{{Attempt: u1.Attempt, Worker: u1.Worker, Reason: "exit", Message: "exit code 1"}}); err != nil || !acc[0] {
		t.Fatalf("fail u's attempt: %v, %v", acc, err)
	}
	if u2 := f.claimOn(t, "u", "w1", false); string(u2.Restore) != "u-state" {
		t.Errorf("u's retry restores %q, want its checkpoint", u2.Restore)
	}
}
