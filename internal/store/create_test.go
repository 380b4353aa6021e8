package store

import (
	"context"
	"fmt"
	"reflect"
	"testing"
)

// submissionCases are the workflow settings the submission tests try.
var submissionCases = []struct {
	name string
	wf   NewWorkflow
}{
	{"batch", NewWorkflow{Priority: "batch"}},
	{"interactive", NewWorkflow{Priority: "interactive"}},
	{"replicated", NewWorkflow{Priority: "batch", Replicas: 2, Quorum: 2, MaxReplicas: 3}},
	{"most replicas alone", NewWorkflow{Priority: "batch", MaxReplicas: 3}},
}

// The one-statement path for small workflows (createSmall) and the general
// path (createLarge) write the same rows: tasks with their states, sort
// keys, limits, arguments and replication settings, and the same edges.
func TestSmallAndLargeSubmissionsWriteTheSameRows(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	dag := func(f *fixture) []NewTask {
		a := f.task("a")
		a.Args = []string{"x", "", "quote\"d", "{1,2}"}
		a.Stdin = []byte("stdin bytes")
		a.Seed, a.CkptMS = 42, 250
		b := f.task("b", NewInput{Name: "in", From: 0, Output: "out"})
		c := f.task("c", NewInput{Name: "", From: 0, Output: "stdout"}, NewInput{Name: "x", From: 1, Output: "y"},
			NewInput{Name: "z", From: 1, Output: "w"})
		c.MaxAttempts, c.TimeoutMS, c.MemoryPages, c.OutputBytes, c.LogBytes = 5, 9000, 32, 123, 45
		d := f.task("d") // no args: an empty array, not NULL
		return []NewTask{a, b, c, d}
	}
	for _, tc := range submissionCases {
		t.Run(tc.name, func(t *testing.T) {
			rows := map[string]any{}
			small := func(ctx context.Context, owner int64, w *NewWorkflow) (string, error) {
				id, _, err := f.s.createSmall(ctx, owner, w)
				return id, err
			}
			for path, create := range map[string]func(context.Context, int64, *NewWorkflow) (string, error){
				"small": small, "large": f.s.createLarge,
			} {
				w := tc.wf
				w.Name, w.Tasks = tc.name, dag(f)
				id, err := create(ctx, f.owner, &w)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				rows[path] = dump(t, f.s, id, true)
			}
			if !reflect.DeepEqual(rows["small"], rows["large"]) {
				t.Errorf("rows differ:\nsmall %v\nlarge %v", rows["small"], rows["large"])
			}
		})
	}
}

// The ready tasks a small submission returns are those Candidates reads
// back, field for field and in the same order: the dispatcher plans with
// them instead of reading them.
func TestSmallSubmissionReturnsItsCandidates(t *testing.T) {
	ctx := context.Background()
	for _, tc := range submissionCases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t) // an empty queue: Candidates reads only this workflow
			a, b := f.task("a"), f.task("b", NewInput{Name: "in", From: 0, Output: "out"})
			c := f.task("c")
			c.CkptMS = 1500
			w := tc.wf
			w.Name, w.Tasks = tc.name, []NewTask{a, b, c}
			_, got, err := f.s.CreateWorkflowReady(ctx, f.owner, &w)
			if err != nil {
				t.Fatal(err)
			}
			want, err := f.s.Candidates(ctx, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 {
				t.Fatalf("got %d ready tasks, want 2 (a and c): %+v", len(got), got)
			}
			for i := range want {
				if len(want[i].Exclude) == 0 {
					want[i].Exclude = nil // no replica claimed yet: nil or empty alike
				}
				if !want[i].ReadySince.Equal(got[i].ReadySince) {
					t.Errorf("task %s ready since %v, Candidates says %v", got[i].Name, got[i].ReadySince, want[i].ReadySince)
				}
				got[i].ReadySince = want[i].ReadySince
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("returned %+v\nCandidates %+v", got, want)
			}
		})
	}
}

// dump reads a workflow's rows as text, with ids replaced by positions and
// sort keys by their offset from the workflow's creation (with sortKeys;
// otherwise only whether there is one).
func dump(t *testing.T, s *Store, id string, sortKeys bool) []string {
	t.Helper()
	var out []string
	q := func(sql string) { out = append(out, queryRows(t, s, sql, id, sortKeys)...) }
	q(`SELECT priority, state, task_count, tasks_left, replicas, quorum, $2::bool FROM workflows WHERE id = $1`)
	q(`SELECT t.name, t.module_id, t.args, t.stdin, t.priority, t.state, t.deps_left, CASE WHEN $2 THEN extract(epoch FROM w.created_at - t.sort_key) END, t.sort_key IS NULL,
			t.attempts, t.max_attempts, t.timeout_ms, t.memory_pages, t.output_bytes, t.log_bytes, t.ckpt_ms, t.seed,
			t.pending, t.replicas, t.quorum, t.max_replicas, t.id - min(t.id) OVER ()
		FROM tasks t JOIN workflows w ON w.id = t.workflow_id WHERE t.workflow_id = $1 ORDER BY t.id`)
	q(`SELECT t.name, i.name, u.name, i.output FROM task_inputs i JOIN tasks t ON t.id = i.task_id JOIN tasks u ON u.id = i.from_task
		WHERE t.workflow_id = $1 AND $2::bool IS NOT NULL ORDER BY t.name, i.name`)
	return out
}

// queryRows runs a query and returns its rows, each printed as text.
func queryRows(t *testing.T, s *Store, sql string, args ...any) []string {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(vals...))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// BenchmarkCreateLargeWorkflow writes a 20,000-task workflow (the dispatch
// benchmark's) per iteration, through createLarge (COPY).
func BenchmarkCreateLargeWorkflow(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	tasks := make([]NewTask, 20000)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	b.ResetTimer()
	for range b.N {
		if _, err := f.s.createLarge(ctx, f.owner, &NewWorkflow{Name: "big", Priority: "batch", Tasks: tasks}); err != nil {
			b.Fatal(err)
		}
	}
}

// A task's workflow and module must exist, through the one foreign key a
// task row is checked against (workflow_modules): a submission naming an
// unknown module is refused whole on either path, a task row cannot name a
// module its workflow did not list, a module in use cannot be deleted, and
// deleting a workflow deletes its tasks.
func TestTasksReferenceTheirWorkflowAndModule(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	other := "sha256:" + fmt.Sprintf("%064x", 2)
	if _, _, err := f.s.PutModule(ctx, f.owner, other, []byte("\x00asm"), []string{}); err != nil {
		t.Fatal(err)
	}
	unused := "sha256:" + fmt.Sprintf("%064x", 3) // pushed, used by no workflow
	if _, _, err := f.s.PutModule(ctx, f.owner, unused, []byte("\x00asm"), []string{}); err != nil {
		t.Fatal(err)
	}
	unknown := "sha256:" + fmt.Sprintf("%064x", 4)
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := f.s.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, n := range []int{2, smallWorkflow + 1} {
		tasks := make([]NewTask, n)
		for i := range tasks {
			tasks[i] = f.task(fmt.Sprintf("t%d", i))
		}
		tasks[n-1].Module = other
		id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "ok", Priority: "batch", Tasks: tasks})
		if err != nil {
			t.Fatalf("%d tasks: %v", n, err)
		}
		if got := count(`SELECT count(*) FROM workflow_modules WHERE workflow_id = $1`, id); got != 2 {
			t.Errorf("%d tasks: %d modules listed, want 2", n, got)
		}
		tasks[0].Module = unknown
		before := count(`SELECT count(*) FROM workflows`)
		if _, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "bad", Priority: "batch", Tasks: tasks}); err == nil {
			t.Fatalf("%d tasks: a workflow with an unknown module was written", n)
		}
		if after := count(`SELECT count(*) FROM workflows`); after != before {
			t.Fatalf("%d tasks: a refused workflow left %d workflow rows", n, after-before)
		}

		// A task row alone cannot name a module its workflow did not list.
		_, err = f.s.pool.Exec(ctx, `INSERT INTO tasks (workflow_id, name, module_id, args, priority, state, deps_left,
			max_attempts, timeout_ms, memory_pages, output_bytes, log_bytes, ckpt_ms, seed)
			SELECT workflow_id, 'extra', $2, '{}', priority, 'ready', 0, 1, 1, 1, 1, 1, 1, 1 FROM tasks WHERE workflow_id = $1 LIMIT 1`,
			id, unused)
		if err == nil {
			t.Fatalf("%d tasks: a task row names a module outside its workflow's", n)
		}
		if _, err := f.s.pool.Exec(ctx, `DELETE FROM modules WHERE id = $1`, other); err == nil {
			t.Fatalf("%d tasks: a module in use was deleted", n)
		}
		if _, err := f.s.pool.Exec(ctx, `DELETE FROM workflows WHERE id = $1`, id); err != nil {
			t.Fatalf("%d tasks: delete the workflow: %v", n, err)
		}
		if got := count(`SELECT count(*) FROM tasks WHERE workflow_id = $1`, id) + count(`SELECT count(*) FROM workflow_modules WHERE workflow_id = $1`, id); got != 0 {
			t.Fatalf("%d tasks: %d rows left after deleting the workflow", n, got)
		}
	}
}
