package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// CancelTask ends one task and its running attempt, fails its descendants,
// leaves the other tasks running and refuses a finished task without a
// change.
func TestCancelTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	// a -> b -> c, and d alone.
	id := f.submit(t, "batch", f.task("a"), f.task("b", NewInput{Name: "x", From: 0, Output: "stdout"}),
		f.task("c", NewInput{Name: "x", From: 1, Output: "stdout"}), f.task("d"))
	cs := f.claim(t, 2, time.Minute)
	byName := claimedByName(cs)
	attempts, err := f.s.CancelTask(ctx, f.owner, id, "a")
	if err != nil || len(attempts) != 1 || attempts[0] != byName["a"].Attempt {
		t.Fatalf("cancel a: %v, %v; want its running attempt %d", attempts, err, byName["a"].Attempt)
	}
	if acc, _ := f.s.Complete(ctx, []Completion{ok(byName["a"], "late")}); acc[0] {
		t.Fatal("the cancelled attempt's result was accepted")
	}
	want := map[string]string{"": "running", "a": "cancelled", "b": "upstream_failed", "c": "upstream_failed", "d": "running"}
	if st := f.states(t, id); !mapsEqual(st, want) {
		t.Fatalf("after cancelling a: %v, want %v", st, want)
	}
	as, err := f.s.Attempts(ctx, f.owner, id, "a")
	if err != nil || len(as) != 1 || as[0].State != "cancelled" {
		t.Fatalf("attempts of a: %+v, %v", as, err)
	}

	tests := []struct {
		name, owner, task string
		want              error
	}{
		{"a cancelled task", "", "a", ErrTaskFinished},
		{"a task failed upstream", "", "c", ErrTaskFinished},
		{"an unknown task", "", "z", ErrNotFound},
		{"another owner's task", "other", "d", ErrNotFound},
	}
	for _, tc := range tests {
		owner := f.owner
		if tc.owner != "" {
			owner++
		}
		if _, err := f.s.CancelTask(ctx, owner, id, tc.task); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if st := f.states(t, id); !mapsEqual(st, want) {
		t.Fatalf("refused cancels changed the workflow: %v", st)
	}

	// The last task ends the workflow: failed, as it cannot be done.
	if _, err := f.s.Complete(ctx, []Completion{ok(byName["d"], "D")}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CancelTask(ctx, f.owner, id, "d"); !errors.Is(err, ErrTaskFinished) {
		t.Errorf("cancel a done task: %v, want ErrTaskFinished", err)
	}
	if out, err := outputBytesOf(f.s.Output(ctx, f.owner, id, "d", "stdout")); err != nil || string(out) != "D" {
		t.Errorf("d's output after a refused cancel: %q, %v", out, err)
	}
	if st := f.states(t, id); st[""] != "failed" {
		t.Errorf("workflow after its last task: %v, want failed", st)
	}

	// Cancelling the only unfinished task finishes the workflow at once.
	one := f.submit(t, "batch", f.task("only"))
	if attempts, err := f.s.CancelTask(ctx, f.owner, one, "only"); err != nil || len(attempts) != 0 {
		t.Fatalf("cancel a ready task: %v, %v", attempts, err)
	}
	if st := f.states(t, one); st[""] != "failed" || st["only"] != "cancelled" {
		t.Errorf("after cancelling its only task: %v", st)
	}
	if got := f.claim(t, 4, time.Minute); len(got) != 0 {
		t.Errorf("a cancelled task was claimed: %+v", got)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// The status of a task names the worker running it and when its latest
// checkpoint was saved.
func TestStatusShowsWorkerAndCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b"))
	c := f.claim(t, 1, time.Minute)[0]
	if saved, err := f.s.SaveCheckpoint(ctx, c.Attempt, c.Worker, []byte("s"), time.Minute); err != nil || !saved {
		t.Fatalf("checkpoint: %v %v", saved, err)
	}
	st, err := f.s.Status(ctx, f.owner, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range st.Tasks {
		switch tk.Name {
		case c.Name:
			if tk.Worker != f.worker || tk.Checkpoints != 1 || tk.CheckpointAt == nil || time.Since(*tk.CheckpointAt) > time.Minute {
				t.Errorf("running task: worker %q checkpoints %d at %v; want worker %s, 1 checkpoint just now", tk.Worker, tk.Checkpoints, tk.CheckpointAt, f.worker)
			}
		default:
			if tk.Worker != "" || tk.CheckpointAt != nil {
				t.Errorf("waiting task: worker %q, checkpoint at %v", tk.Worker, tk.CheckpointAt)
			}
		}
	}
	changes, err := f.s.TaskChanges(ctx, id, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range changes {
		if tk.Name == c.Name && (tk.Worker != f.worker || tk.CheckpointAt == nil) {
			t.Errorf("task change of the running task: worker %q, checkpoint at %v", tk.Worker, tk.CheckpointAt)
		}
	}
	// Done, the task still names the worker that ran it.
	if _, err := f.s.Complete(ctx, []Completion{ok(c, "out")}); err != nil {
		t.Fatal(err)
	}
	st, err = f.s.Status(ctx, f.owner, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range st.Tasks {
		if tk.Name == c.Name && (tk.State != StateDone || tk.Worker != f.worker) {
			t.Errorf("done task: state %s, worker %q; want done, worker %s", tk.State, tk.Worker, f.worker)
		}
	}
}

// ModuleUse and Edges read an owner's own workflows only.
func TestModuleUseAndEdges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b"),
		f.task("c", NewInput{Name: "x", From: 0, Output: "stdout"}, NewInput{Name: "y", From: 1, Output: "stdout"}, NewInput{Name: "", From: 0, Output: "stdout"}))
	use, err := f.s.ModuleUse(ctx, f.owner)
	if err != nil || len(use) != 1 || !slices.Equal(use[f.module], []string{"wf"}) {
		t.Fatalf("module use: %v, %v", use, err)
	}
	if use, err := f.s.ModuleUse(ctx, f.owner+1); err != nil || len(use) != 0 {
		t.Errorf("another owner's module use: %v, %v", use, err)
	}
	var plan []struct{ Plan planNode }
	if err := f.s.pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+moduleUseSQL, f.owner).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	plan[0].Plan.walk(func(n *planNode) {
		if n.Relation == "tasks" {
			t.Errorf("module use reads the tasks (%s)", n.NodeType)
		}
	})
	edges, err := f.s.Edges(ctx, f.owner, id)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(edges, func(a, b [2]string) int { return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1])) })
	if want := [][2]string{{"a", "c"}, {"b", "c"}}; !slices.Equal(edges, want) {
		t.Errorf("edges = %v, want %v (one per pair)", edges, want)
	}
	if _, err := f.s.Edges(ctx, f.owner+1, id); !errors.Is(err, ErrNotFound) {
		t.Errorf("another owner's edges: %v, want ErrNotFound", err)
	}
}

// WorkerTasks names only the owner's own running tasks; Activity counts
// done tasks and connected workers per minute, connections included that
// ended within the window.
func TestWorkerTasksAndActivity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	began := time.Now()
	f.submit(t, "batch", f.task("a"), f.task("b"))
	cs := f.claim(t, 2, time.Minute)
	if _, err := f.s.Complete(ctx, []Completion{ok(cs[0], "A")}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.FlushTallies(ctx); err != nil {
		t.Fatal(err)
	}
	wt, err := f.s.WorkerTasks(ctx, f.owner)
	if err != nil {
		t.Fatal(err)
	}
	if got := wt[f.worker]; got.Succeeded != 1 || !slices.Equal(got.Running, []string{"wf / " + cs[1].Name}) {
		t.Errorf("worker tasks for the owner: %+v", got)
	}
	wt, err = f.s.WorkerTasks(ctx, f.owner+1)
	if err != nil {
		t.Fatal(err)
	}
	if got := wt[f.worker]; !slices.Equal(got.Running, []string{"(another project)"}) {
		t.Errorf("worker tasks for another owner: %+v", got)
	}

	// A second worker connects and leaves; the first reconnects.
	reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "browser", Slots: 1}, time.Minute)
	w2 := reg.ID
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.WorkerGone(ctx, Gone{Worker: w2, Session: reg.Session}); err != nil {
		t.Fatal(err)
	}
	if wt, err := f.s.WorkerTasks(ctx, f.owner); err != nil || len(wt) != 1 {
		t.Errorf("worker tasks list disconnected workers: %v, %v", wt, err)
	}
	// A third reconnects before its old connection is noticed gone: the old
	// connection's end leaves it connected.
	old, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "browser", Slots: 1}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.s.RegisterWorker(ctx, WorkerHello{ID: old.ID, Token: old.Token, Kind: "browser", Slots: 1}, time.Minute)
	if err != nil || again.ID != old.ID || again.Session == old.Session {
		t.Fatalf("reconnect: %+v, %v; want the same id in a new session", again, err)
	}
	if _, err := f.s.WorkerGone(ctx, Gone{Worker: old.ID, Session: old.Session}); err != nil {
		t.Fatal(err)
	}
	if wt, err := f.s.WorkerTasks(ctx, f.owner); err != nil || len(wt) != 2 {
		t.Errorf("after the old connection of a reconnected worker ended: %d connected workers (%v), want 2", len(wt), err)
	}
	if _, err := f.s.WorkerGone(ctx, Gone{Worker: old.ID, Session: again.Session}); err != nil {
		t.Fatal(err)
	}
	act, err := f.s.Activity(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if len(act) != 60 {
		t.Fatalf("%d minutes of activity, want 60", len(act))
	}
	for i := 1; i < len(act); i++ {
		if act[i].Minute.Sub(act[i-1].Minute) != time.Minute {
			t.Fatalf("minutes %v and %v are not one apart", act[i-1].Minute, act[i].Minute)
		}
	}
	// The test may cross a minute: look at the last two. Within one
	// minute, that minute saw the 3 workers; across two, each saw some of
	// them (the first worker in both).
	done, most, sum := 0, 0, 0
	for _, m := range act[len(act)-2:] {
		done += m.TasksDone
		most, sum = max(most, m.Workers), sum+m.Workers
	}
	crossed := !began.Truncate(time.Minute).Equal(time.Now().Truncate(time.Minute))
	seen := most == 3 || (crossed && most <= 3 && sum >= 3)
	if last := act[len(act)-1]; time.Since(last.Minute) > time.Minute || done != 1 || !seen {
		t.Errorf("the last minutes (the test crossed a minute: %v): %+v, want 1 task done and 3 workers seen", crossed, act[len(act)-2:])
	}
	if first := act[0]; first.TasksDone != 0 || first.Workers != 0 {
		t.Errorf("an hour ago: %+v, want nothing", first)
	}
}

// BenchmarkTaskChanges measures one poll of a workflow's event stream: a
// workflow of 10,000 tasks, 32 of them running, 1,000 done and nothing
// changed since the last poll.
func BenchmarkTaskChanges(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b)
	tasks := make([]NewTask, 10000)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%05d", i))
	}
	id := f.submit(b, "batch", tasks...)
	done := f.claim(b, 1000, time.Minute)
	cs := make([]Completion, len(done))
	for i, c := range done {
		cs[i] = ok(c, "x")
	}
	if _, err := f.s.Complete(ctx, cs); err != nil {
		b.Fatal(err)
	}
	f.claim(b, 32, time.Minute)
	since := time.Now()
	b.ResetTimer()
	for b.Loop() {
		ch, err := f.s.TaskChanges(ctx, id, since)
		if err != nil || len(ch) != 32 {
			b.Fatalf("changes: %d, %v; want the 32 running tasks", len(ch), err)
		}
	}
}

func TestPruneWorkers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	register := func() Registration {
		t.Helper()
		reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "browser", Slots: 1}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	gone := func(reg Registration, ago time.Duration) {
		t.Helper()
		if _, err := f.s.WorkerGone(ctx, Gone{Worker: reg.ID, Session: reg.Session}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.s.pool.Exec(ctx, `UPDATE workers SET last_seen = now() - $2 * interval '1 second' WHERE id = $1`,
			reg.ID, ago.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	old1, old2, recent, connected := register(), register(), register(), register()
	gone(old1, 40*24*time.Hour)
	gone(old2, 31*24*time.Hour)
	gone(recent, 29*24*time.Hour)
	// A connected worker is kept however long ago it was last seen (its
	// replica's maintenance may lag).
	if _, err := f.s.pool.Exec(ctx, `UPDATE workers SET last_seen = now() - interval '90 days' WHERE id = $1`, connected.ID); err != nil {
		t.Fatal(err)
	}
	exists := func(id string) bool {
		t.Helper()
		var n int
		if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM workers WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	sessions := func(id string) int {
		t.Helper()
		var n int
		if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM worker_sessions WHERE worker_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if sessions(old1.ID) != 1 {
		t.Fatalf("the old worker has %d sessions before pruning, want 1", sessions(old1.ID))
	}

	cases := []struct {
		limit int
		want  int64
	}{
		{1, 1}, // one at a time when asked
		{100, 1},
		{100, 0}, // nothing left to prune
	}
	for _, c := range cases {
		n, err := f.s.PruneWorkers(ctx, 30*24*time.Hour, c.limit)
		if err != nil || n != c.want {
			t.Fatalf("PruneWorkers(limit %d) = %d, %v; want %d", c.limit, n, err, c.want)
		}
	}
	for _, c := range []struct {
		name string
		id   string
		kept bool
	}{
		{"disconnected 40 days ago", old1.ID, false},
		{"disconnected 31 days ago", old2.ID, false},
		{"disconnected 29 days ago", recent.ID, true},
		{"connected, not seen for 90 days", connected.ID, true},
		{"the fixture's worker", f.worker, true},
	} {
		if exists(c.id) != c.kept {
			t.Errorf("%s: kept %v, want %v", c.name, !c.kept, c.kept)
		}
	}
	if n := sessions(old1.ID); n != 0 {
		t.Errorf("a pruned worker keeps %d sessions", n)
	}
	// A pruned worker that comes back with its old identity is a new worker.
	back, err := f.s.RegisterWorker(ctx, WorkerHello{ID: old1.ID, Token: old1.Token, Kind: "browser", Slots: 1}, time.Minute)
	if err != nil || back.ID == old1.ID || back.ID == "" {
		t.Errorf("a pruned worker reconnecting: %+v, %v; want a new id", back, err)
	}
}
