package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/cyclepool/cyclepool/migrations"
)

// The migrations that took foreign keys away and put triggers in their
// place (00010 to 00013) go down and up again on a database in use:
// workflows with edges, running and finished attempts, outputs, and rows
// the dropped keys would refuse (a task whose module its workflow does not
// list, with an edge), which Down removes before it puts the keys back.
// 00014's Down writes the empty stdout rows earlier versions read.
func TestMigrationsGoDownAndUpAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submit(t, "batch", f.task("a"), f.task("b", NewInput{Name: "in", From: 0, Output: "stdout"}))
	f.submit(t, "batch", f.task("c"), f.task("d"))
	cs := f.claim(t, 3, time.Minute)
	if len(cs) != 3 {
		t.Fatalf("%d claimed, want 3", len(cs))
	}
	if acc, err := f.s.Complete(ctx, []Completion{ok(cs[0], "out"), ok(cs[2], "")}); err != nil || !acc[0] || !acc[1] {
		t.Fatalf("complete: %v %v", acc, err)
	}
	// An orphan task (its module is not in workflow_modules) with an edge.
	if _, err := f.s.pool.Exec(ctx, `WITH o AS (
			INSERT INTO tasks (workflow_id, name, module_id, args, priority, state, deps_left,
				max_attempts, timeout_ms, memory_pages, output_bytes, log_bytes, ckpt_ms, seed)
			SELECT workflow_id, 'orphan', 'sha256:none', '{}', priority, 'blocked', 1, 1, 1, 1, 1, 1, 1, 1
			FROM tasks WHERE name = 'a' RETURNING id
		)
		INSERT INTO task_inputs (task_id, name, from_task, output) SELECT o.id, 'in', a.id, 'stdout' FROM o, tasks a WHERE a.name = 'a'`); err != nil {
		t.Fatal(err)
	}
	// Closed before the store (cleanups run last first): the connections
	// it holds are the pool's, and the pool's Close waits for them.
	db := stdlib.OpenDBFromPool(f.s.pool)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 9); err != nil {
		t.Fatalf("down to 9: %v", err)
	}
	// Earlier versions read an empty stdout from its row (00014's Down).
	var stdouts int
	if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM task_outputs WHERE name = 'stdout' AND task_id = $1 AND data = ''`,
		cs[2].TaskID).Scan(&stdouts); err != nil || stdouts != 1 {
		t.Errorf("after going down, %d empty stdout rows of the task that wrote none (%v), want 1", stdouts, err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	var tasks, edges, attempts int
	if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM task_inputs),
		(SELECT count(*) FROM attempts)`).Scan(&tasks, &edges, &attempts); err != nil {
		t.Fatal(err)
	}
	if tasks != 4 || edges != 1 || attempts != 3 {
		t.Errorf("%d tasks, %d edges, %d attempts after down and up; want 4, 1 and 3 (the orphan and its edge gone)", tasks, edges, attempts)
	}
	// The platform still works: the rest of the tasks run.
	more := f.claim(t, 10, time.Minute)
	var comps []Completion
	for _, c := range append(cs[1:2], more...) {
		comps = append(comps, ok(c, "out"))
	}
	if acc, err := f.s.Complete(ctx, comps); err != nil || len(acc) != 2 {
		t.Fatalf("complete the rest: %v %v (claimed %d more)", acc, err, len(more))
	}
}
