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
