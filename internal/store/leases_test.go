package store

import (
	"context"
	"testing"
	"time"
)

// The lease reaper finds lapsed attempts through running_attempts, and
// deletes from it the attempts that ended before its pass.
func TestReaperForgetsEndedAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submit(t, "batch", f.task("short"), f.task("long"))
	short := f.claim(t, 1, 50*time.Millisecond)
	long := f.claim(t, 1, time.Minute)
	if len(short) != 1 || len(long) != 1 {
		t.Fatalf("claimed %d and %d", len(short), len(long))
	}
	listed := func() int {
		t.Helper()
		var n int
		if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM running_attempts`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := listed(); n != 2 {
		t.Fatalf("%d attempts listed as running, want 2", n)
	}
	if _, err := f.s.Complete(ctx, []Completion{ok(long[0], "L")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	for _, pass := range []struct{ lost, listed int }{{1, 1}, {0, 0}} {
		n, err := f.s.ExpireLeases(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if n != pass.lost || listed() != pass.listed {
			t.Errorf("a pass ended %d attempts and left %d listed, want %d and %d", n, listed(), pass.lost, pass.listed)
		}
	}
}

// The lease sweep's statements read the attempts that may run, through
// running_attempts, not every attempt ever kept, with statistics taken
// while thousands of attempts ran.
func TestSweepReadsOnlyTheAttemptsThatMayRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	const n = 3000
	old := f.largeWorkflow(t, n)
	// Analyzed with every old attempt running; then they all end and the
	// sweep forgets them.
	for _, q := range []string{
		`INSERT INTO attempts (task_id, worker_id, lease_until) SELECT id, '` + f.worker + `', now() FROM tasks WHERE workflow_id = '` + old + `'`,
		`INSERT INTO running_attempts (attempt_id) SELECT id FROM attempts`,
		`ANALYZE attempts, running_attempts`,
		`UPDATE attempts SET state = 'succeeded', ended_at = now()`,
		`UPDATE tasks SET state = 'done', pending = 0, finished_at = now() WHERE workflow_id = '` + old + `'`,
		sweepEndedSQL,
	} {
		if _, err := f.s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	f.submit(t, "batch", f.task("a"), f.task("b"))
	if cs := f.claim(t, 2, time.Minute); len(cs) != 2 {
		t.Fatalf("%d claimed", len(cs))
	}
	for _, q := range []struct {
		name string
		sql  string
		args []any
	}{
		{"forget ended attempts", sweepEndedSQL, nil},
		{"expire leases", expireSQL, []any{100, int64(30000), int64(30000)}},
		{"renew every lease", renewAllSQL, []any{int64(60000), int64(1000)}},
	} {
		plan := f.explainHot(t, q.sql, q.args)
		plan.walk(func(p *planNode) {
			if p.Relation == "attempts" && (p.NodeType == "Seq Scan" || (p.ActualRows+p.Removed)*p.ActualLoops > 4) {
				t.Errorf("%s: %s on attempts read %v rows (%v of them left out) over %v loops, with 2 attempts running among %d",
					q.name, p.NodeType, p.ActualRows+p.Removed, p.Removed, p.ActualLoops, n+2)
			}
		})
	}
}
