package store

import (
	"context"
	"maps"
	"testing"
	"time"
)

// ActiveCounts counts the unfinished tasks of every workflow by state, and
// nothing of finished or cancelled ones.
func TestActiveCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	in := NewInput{Name: "in", From: 0, Output: "stdout"}
	f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c", in))     // a, b ready; c blocked
	gone := f.submit(t, "batch", f.task("x"), f.task("y"), f.task("z")) // cancelled below
	if _, err := f.s.Cancel(ctx, f.owner, gone); err != nil {
		t.Fatal(err)
	}
	cs := f.claim(t, 1, time.Minute) // a runs
	if len(cs) != 1 {
		t.Fatalf("%d claimed", len(cs))
	}
	for _, step := range []struct {
		name string
		do   func()
		want map[string]int64
	}{
		{"one running", func() {}, map[string]int64{StateBlocked: 1, StateReady: 1, StateRunning: 1}},
		{"a done", func() {
			if _, err := f.s.Complete(ctx, []Completion{ok(cs[0], "A")}); err != nil {
				t.Fatal(err)
			}
		}, map[string]int64{StateBlocked: 0, StateReady: 2, StateRunning: 0}},
	} {
		step.do()
		got, workers, err := f.s.ActiveCounts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(got, step.want) {
			t.Errorf("%s: %v, want %v", step.name, got, step.want)
		}
		if workers["headless"] != 1 {
			t.Errorf("%s: workers %v, want one headless", step.name, workers)
		}
	}
}

// ActiveCounts reads the queue and the running attempts, not every task
// and attempt ever kept, with statistics taken while thousands of tasks
// were ready or running (a scrape of /metrics after a large workflow).
func TestActiveCountsWithStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	const n = 3000
	old := f.largeWorkflow(t, n)
	if _, err := f.s.pool.Exec(ctx, `INSERT INTO attempts (task_id, worker_id, lease_until)
		SELECT id, $2, now() FROM tasks WHERE workflow_id = $1`, old, f.worker); err != nil {
		t.Fatal(err)
	}
	// Analyzed with every task ready and every attempt running; then all
	// of them end.
	for _, q := range []string{`ANALYZE tasks, attempts`,
		`UPDATE tasks SET state = 'done', pending = 0, finished_at = now() WHERE workflow_id = '` + old + `'`,
		`UPDATE attempts SET state = 'succeeded', ended_at = now()`,
		`UPDATE workflows SET state = 'done', tasks_left = 0 WHERE id = '` + old + `'`} {
		if _, err := f.s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	f.submit(t, "batch", f.task("a"), f.task("b"))
	if cs := f.claim(t, 1, time.Minute); len(cs) != 1 {
		t.Fatalf("%d claimed", len(cs))
	}
	got, _, err := f.s.ActiveCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{StateBlocked: 0, StateReady: 1, StateRunning: 1}; !maps.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	plan := f.explainHot(t, activeCountsSQL, nil)
	plan.walk(func(p *planNode) {
		if (p.Relation == "tasks" || p.Relation == "attempts") && (p.NodeType == "Seq Scan" || p.NodeType == "Parallel Seq Scan" || p.ActualRows*p.ActualLoops > 2) {
			t.Errorf("%s on %s returned %v rows over %v loops, with 2 tasks unfinished among %d", p.NodeType, p.Relation, p.ActualRows, p.ActualLoops, n+2)
		}
	})
}

// PruneActivity forgets the tasks done in minutes over a day old, and only
// those.
func TestPruneActivity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	if _, err := f.s.pool.Exec(ctx, `INSERT INTO tasks_done_minutes (minute, n) VALUES
		(date_trunc('minute', now()) - interval '25 hours', 5), (date_trunc('minute', now()) - interval '23 hours', 7)`); err != nil {
		t.Fatal(err)
	}
	if err := f.s.PruneActivity(ctx); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := f.s.pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM tasks_done_minutes`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 7 {
		t.Errorf("%d tasks counted after pruning, want the 7 of 23 hours ago", n)
	}
}
