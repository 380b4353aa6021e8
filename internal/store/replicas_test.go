package store

import (
	"context"
	"testing"
	"time"
)

// A replicated task's replicas go to distinct workers; it is done only when
// a quorum of identical results exists, with the quorum's outputs, and the
// worker whose result lost it loses reputation.
func TestReplicatedTaskNeedsQuorum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	var ws []string
	for range 3 {
		reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 1}, time.Minute)
		w := reg.ID
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	liar, w1, w2 := ws[0], ws[1], ws[2]
	id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch", Tasks: []NewTask{f.task("a")},
		Replicas: 2, Quorum: 2, MaxReplicas: 5})
	if err != nil {
		t.Fatal(err)
	}
	cands, _, err := f.s.Candidates(ctx, 10, nil)
	if err != nil || len(cands) != 1 || cands[0].Pending != 2 || cands[0].Replicas != 2 || !cands[0].Fresh {
		t.Fatalf("candidates = %+v, %v; want one fresh task with 2 pending replicas", cands, err)
	}
	task := cands[0].TaskID
	// Two picks on the same worker: only one is claimed.
	cs, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: task, Worker: liar}, {TaskID: task, Worker: liar}}, time.Minute)
	if err != nil || len(cs) != 1 {
		t.Fatalf("claimed %+v, %v; want one replica for the liar", cs, err)
	}
	if st := f.states(t, id); st["a"] != StateReady {
		t.Fatalf("task with a replica left to start is %s, want ready", st["a"])
	}
	if acc, err := f.s.Complete(ctx, []Completion{ok(cs[0], "forged")}); err != nil || !acc[0] {
		t.Fatalf("complete liar: %v %v", acc, err)
	}
	// The liar may not take a second replica.
	if again, _ := f.s.ClaimPicks(ctx, []Pick{{TaskID: task, Worker: liar}}, time.Minute); len(again) != 0 {
		t.Fatalf("liar took a second replica: %+v", again)
	}
	c1, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: task, Worker: w1}}, time.Minute)
	if err != nil || len(c1) != 1 {
		t.Fatalf("claim w1: %+v %v", c1, err)
	}
	if acc, err := f.s.Complete(ctx, []Completion{ok(c1[0], "real")}); err != nil || !acc[0] {
		t.Fatalf("complete w1: %v %v", acc, err)
	}
	// 1 vs 1: no quorum, one more replica is queued.
	if st := f.states(t, id); st["a"] != StateReady || st[""] != StateRunning {
		t.Fatalf("after a tie: %v, want task ready for a third replica", st)
	}
	c2, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: task, Worker: w2}}, time.Minute)
	if err != nil || len(c2) != 1 {
		t.Fatalf("claim w2: %+v %v", c2, err)
	}
	if _, err := f.s.Complete(ctx, []Completion{ok(c2[0], "real")}); err != nil {
		t.Fatal(err)
	}
	if st := f.states(t, id); st["a"] != StateDone || st[""] != StateDone {
		t.Fatalf("after a quorum: %v, want done", st)
	}
	out, err := outputBytesOf(f.s.Output(ctx, f.owner, id, "a", "stdout"))
	if err != nil || string(out) != "real" {
		t.Fatalf("output = %q, %v; want the quorum's", out, err)
	}
	recs, err := f.s.Workers(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		want := [2]int64{1, 0}
		if r.ID == liar {
			want = [2]int64{0, 1}
		}
		if got := [2]int64{r.ResultsValid, r.ResultsInvalid}; got != want {
			t.Errorf("worker %s valid/invalid = %v, want %v", r.ID, got, want)
		}
	}
	as, err := f.s.Attempts(ctx, f.owner, id, "a")
	if err != nil || len(as) != 3 || as[0].Verdict != VerdictInvalid || as[1].Verdict != VerdictValid || as[2].Verdict != VerdictValid {
		t.Fatalf("attempts = %+v, %v", as, err)
	}
}

// A failed replica queues one more, without failing the task.
func TestFailedReplicaIsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	reg, _ := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 1}, time.Minute)
	w2 := reg.ID
	id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch", Tasks: []NewTask{f.task("a")},
		Replicas: 2, Quorum: 2, MaxReplicas: 5})
	if err != nil {
		t.Fatal(err)
	}
	cands, _, _ := f.s.Candidates(ctx, 10, nil)
	cs, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: cands[0].TaskID, Worker: f.worker}, {TaskID: cands[0].TaskID, Worker: w2}}, time.Minute)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claim both replicas: %+v %v", cs, err)
	}
	if st := f.states(t, id); st["a"] != StateRunning {
		t.Fatalf("task = %s, want running", st["a"])
	}
	if _, err := f.s.Complete(ctx, []Completion{{Attempt: cs[0].Attempt, Worker: f.worker, Reason: "exit", Message: "exit code 1"}}); err != nil {
		t.Fatal(err)
	}
	cands, _, _ = f.s.Candidates(ctx, 10, nil)
	if len(cands) != 1 || cands[0].Pending != 1 {
		t.Fatalf("after a failed replica: %+v, want one pending replica", cands)
	}
}
