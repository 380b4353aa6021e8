package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A large submission is answered without waiting for the refresh of the
// planner's statistics, which follows in the background.
func TestLargeSubmissionDoesNotWaitForStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	// ANALYZE waits for this lock; the submission's inserts do not.
	blocker, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `LOCK TABLE tasks, task_inputs IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	tasks := make([]NewTask, analyzeAfterTasks)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
		if i > 0 {
			tasks[i].Inputs = []NewInput{{Name: "in", From: i - 1, Output: "stdout"}}
		}
	}
	tasks = append(tasks, f.task("last", NewInput{Name: "a", From: 0, Output: "stdout"}))
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := f.s.CreateWorkflow(sctx, f.owner, &NewWorkflow{Name: "big", Priority: "batch", Tasks: tasks}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the submission took %v: it waited for ANALYZE", took)
	}
	if got := reltuples(t, f, "tasks"); got >= analyzeAfterTasks {
		t.Fatalf("tasks analyzed (%v rows) while ANALYZE could not run", got)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The refresh follows.
	deadline := time.Now().Add(20 * time.Second)
	for reltuples(t, f, "tasks") < analyzeAfterTasks || reltuples(t, f, "task_inputs") < analyzeAfterTasks {
		if time.Now().After(deadline) {
			t.Fatalf("statistics not refreshed: tasks %v rows, task_inputs %v", reltuples(t, f, "tasks"), reltuples(t, f, "task_inputs"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close does not wait for a refresh that cannot run.
func TestCloseStopsAStatisticsRefresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	blocker, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `LOCK TABLE tasks IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	f.s.stats.request(true, false)
	// The refresh is under way, waiting for the lock, before stop (asked
	// outside the blocker's transaction, whose view of the activity stays
	// as it first read it).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting bool
		if err := f.s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'ANALYZE tasks' AND wait_event_type = 'Lock')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no ANALYZE waited for the lock")
		}
	}
	done := make(chan struct{})
	go func() {
		f.s.stats.stop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stop waited for an ANALYZE blocked on a lock")
	}
}

// Requests made while a refresh runs are merged into one more run, which
// starts no sooner than the gap after the first ends.
func TestStatisticsRefreshesMerge(t *testing.T) {
	t.Parallel()
	const gap = 300 * time.Millisecond
	release := make(chan struct{})
	var runs []string
	var ended, next time.Time
	r := newStatsRefresher(gap, func(ctx context.Context, sql string) error {
		runs = append(runs, sql)
		if len(runs) == 1 {
			<-release
			ended = time.Now()
		} else {
			next = time.Now()
		}
		return nil
	})
	r.request(true, false)
	for !func() bool { r.mu.Lock(); defer r.mu.Unlock(); return !r.tasks && r.running }() {
		time.Sleep(time.Millisecond) // the first run has taken its request
	}
	r.request(false, true)
	r.request(true, false)
	r.request(false, false)
	close(release)
	r.wg.Wait()
	want := []string{"ANALYZE tasks", "ANALYZE tasks, task_inputs"}
	if fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Fatalf("runs %q, want %q", runs, want)
	}
	if d := next.Sub(ended); d < gap {
		t.Errorf("the second run started %v after the first ended, want at least %v", d, gap)
	}
	r.stop()
	r.request(true, true)
	r.wg.Wait()
	if len(runs) != 2 {
		t.Fatalf("a request after stop ran: %q", runs)
	}
}

func reltuples(t *testing.T, f *fixture, table string) float64 {
	t.Helper()
	var n float64
	if err := f.s.pool.QueryRow(context.Background(), `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The status and event-stream queries read a new large workflow through
// its key, not the other workflows' tasks, with statistics taken before it
// was submitted: a submitter's next request may come before the refresh.
func TestStatusReadsItsWorkflowWithStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	const n = 3000
	tasks := make([]NewTask, n)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	old, err := f.s.createLarge(ctx, f.owner, &NewWorkflow{Name: "old", Priority: "batch", Tasks: tasks})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `UPDATE tasks SET state = 'done', finished_at = now() WHERE workflow_id = $1`, old); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `ANALYZE tasks, task_inputs`); err != nil {
		t.Fatal(err)
	}
	for i := range tasks[:n/2] {
		if i > 0 {
			tasks[i].Inputs = []NewInput{{Name: "in", From: i - 1, Output: "stdout"}}
		}
	}
	id, err := f.s.createLarge(ctx, f.owner, &NewWorkflow{Name: "new", Priority: "batch", Tasks: tasks[:n/2]})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		name string
		sql  string
		args []any
	}{
		{"status", workflowTasksSQL, []any{id, f.owner}},
		{"task changes", taskChangesSQL, []any{id, time.Now().Add(-time.Hour)}},
	} {
		eachPlanMode(t, f, q.sql, q.args, func(mode string, plan planNode) {
			if got := plan.ActualRows; got != n/2 {
				t.Fatalf("%s (%s) read %v tasks, want %d", q.name, mode, got, n/2)
			}
			plan.walk(func(p *planNode) {
				if p.Relation == "tasks" && (p.NodeType == "Seq Scan" || p.ActualRows*p.ActualLoops > n/2) {
					t.Errorf("%s (%s): %s on tasks returned %v rows over %v loops for a workflow of %d", q.name, mode, p.NodeType, p.ActualRows, p.ActualLoops, n/2)
				}
			})
		})
	}
}

// The spans of a workflow's attempts (read with its status when it ends)
// are looked up by its tasks, not found among every attempt of every
// workflow, with statistics taken while the attempts table was small.
func TestSpansReadTheirWorkflowsAttemptsWithStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	const n = 3000
	old := f.largeWorkflow(t, n)
	if _, err := f.s.pool.Exec(ctx, `ANALYZE attempts`); err != nil {
		t.Fatal(err)
	}
	attempt := func(workflow string) {
		t.Helper()
		if _, err := f.s.pool.Exec(ctx, `INSERT INTO attempts (task_id, worker_id, lease_until, state, ended_at)
			SELECT id, $2, now(), 'succeeded', now() FROM tasks WHERE workflow_id = $1`, workflow, f.worker); err != nil {
			t.Fatal(err)
		}
	}
	attempt(old)
	id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "new", Priority: "batch", Tasks: []NewTask{f.task("one")}})
	if err != nil {
		t.Fatal(err)
	}
	attempt(id)
	eachPlanMode(t, f, spansSQL, []any{id, f.owner}, func(mode string, plan planNode) {
		if got := plan.ActualRows; got != 1 {
			t.Fatalf("spans (%s) read %v attempts, want 1", mode, got)
		}
		plan.walk(func(p *planNode) {
			if p.Relation == "attempts" && (p.NodeType == "Seq Scan" || p.ActualRows*p.ActualLoops > 1) {
				t.Errorf("spans (%s): %s on attempts returned %v rows over %v loops for a workflow of one attempt among %d",
					mode, p.NodeType, p.ActualRows, p.ActualLoops, n+1)
			}
		})
	})
}

// eachPlanMode runs sql with args under EXPLAIN ANALYZE as a prepared
// statement in each of PostgreSQL's plan cache modes, and gives check the
// plan.
func eachPlanMode(t *testing.T, f *fixture, sql string, args []any, check func(mode string, plan planNode)) {
	t.Helper()
	for _, mode := range []string{"auto", "force_generic_plan", "force_custom_plan"} {
		check(mode, f.explain(t, sql, args, false, "plan_cache_mode", mode))
	}
}

func placeholders(n int) string {
	s := ""
	for i := 1; i <= n; i++ {
		if i > 1 {
			s += ", "
		}
		s += fmt.Sprintf("$%d", i)
	}
	return s
}

// largeWorkflow writes a batch workflow of n independent tasks (as a large
// submission does) and returns its id.
func (f *fixture) largeWorkflow(t *testing.T, n int) string {
	t.Helper()
	tasks := make([]NewTask, n)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	id, err := f.s.createLarge(context.Background(), f.owner, &NewWorkflow{Name: "large", Priority: "batch", Tasks: tasks})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// explainHot is explain with the hot path's settings (queueBegin:
// generic plans, no sequential scans), as the server runs its statements.
func (f *fixture) explainHot(t *testing.T, sql string, args []any, settings ...string) planNode {
	t.Helper()
	return f.explain(t, sql, args, true, settings...)
}

// explain runs sql with args under EXPLAIN ANALYZE as a prepared
// statement, in a transaction (rolled back) with the hot path's settings
// when hot is set and settings (pairs of name and value) besides, and
// returns the plan. (EXPLAIN with bound parameters would plan with their
// values instead.)
func (f *fixture) explain(t *testing.T, sql string, args []any, hot bool, settings ...string) planNode {
	t.Helper()
	ctx := context.Background()
	conn, err := f.s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		tx.Rollback(ctx)
		conn.Exec(ctx, `DEALLOCATE explained`)
	}()
	if hot {
		if _, err := tx.Exec(ctx, hotPathSettingsSQL); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i+1 < len(settings); i += 2 {
		if _, err := tx.Exec(ctx, `SELECT set_config($1, $2, true)`, settings[i], settings[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, `PREPARE explained AS `+sql); err != nil {
		t.Fatalf("prepare %.40q: %v", sql, err)
	}
	execute := `EXECUTE explained`
	if len(args) > 0 {
		execute += `(` + placeholders(len(args)) + `)`
	}
	var plan []struct{ Plan planNode }
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+execute,
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&plan); err != nil {
		t.Fatalf("explain %.40q: %v", sql, err)
	}
	return plan[0].Plan
}
