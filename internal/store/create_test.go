package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
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
	t.Parallel()
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
				uid, _ := newUUID()
				id, _, err := f.s.createSmall(ctx, owner, w, uid, nil, 0, 0, nil)
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

// The candidates a plan made before a submission is written sees
// (SubmissionCandidates) are those Candidates reads back once it is:
// field for field, in the same order, the task's index standing for its id
// and the sort key taken by the server's clock instead of the database's.
func TestSubmissionCandidatesAreThoseReadBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range submissionCases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t) // an empty queue: Candidates reads only this workflow
			a, b := f.task("a"), f.task("b", NewInput{Name: "in", From: 0, Output: "out"})
			c := f.task("c")
			c.CkptMS = 1500
			w := tc.wf
			w.Name, w.Tasks = tc.name, []NewTask{a, b, c}
			now := time.Now()
			got := f.s.SubmissionCandidates(f.owner, &w, now)
			id, err := f.s.CreateWorkflow(ctx, f.owner, &w)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := f.s.Candidates(ctx, 100, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || len(want) != 2 {
				t.Fatalf("got %d ready tasks, Candidates %d, want 2 (a and c): %+v", len(got), len(want), got)
			}
			ids := taskIDs(t, f.s, id)
			for i := range want {
				if len(want[i].Exclude) == 0 {
					want[i].Exclude = nil // no replica claimed yet: nil or empty alike
				}
				if ids[w.Tasks[got[i].TaskID].Name] != want[i].TaskID {
					t.Errorf("candidate %d stands for task %s, Candidates reads %s", i, w.Tasks[got[i].TaskID].Name, want[i].Name)
				}
				if d := want[i].ReadySince.Sub(got[i].ReadySince); d < -time.Second || d > time.Second {
					t.Errorf("task %s ready since %v, Candidates says %v", got[i].Name, got[i].ReadySince, want[i].ReadySince)
				}
				got[i].TaskID, got[i].WorkflowID, got[i].ReadySince = want[i].TaskID, want[i].WorkflowID, want[i].ReadySince
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("before %+v\nread back %+v", got, want)
			}
		})
	}
}

// taskIDs maps a workflow's task names to their ids.
func taskIDs(t *testing.T, s *Store, workflow string) map[string]int64 {
	t.Helper()
	return queryMap[string, int64](t, s, `SELECT name, id FROM tasks WHERE workflow_id = $1`, workflow)
}

// queryMap runs a query of two columns and maps the first to the second.
func queryMap[K comparable, V any](t *testing.T, s *Store, sql string, args ...any) map[K]V {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[K]V{}
	for rows.Next() {
		var k K
		var v V
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		m[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
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

// A submission that claims its own ready tasks (CreateWorkflowClaiming)
// leaves the same rows as a submission followed by ClaimPicks of the same
// picks: tasks, edges, attempts and the workers' counts, replicated or
// not; it returns the same attempts. Picks of blocked tasks and unknown
// indexes are ignored, and a ready task left unclaimed is reported. With
// send, it sends the attempts it returns: picks of distinct tasks before
// anything is written, with their ids drawn ahead and task ids 0 (the
// early send), other picks once the claim has run.
func TestSubmissionClaimsItsReadyTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range submissionCases {
		for _, v := range []struct {
			name        string
			distinct    bool // no pick of a on the other worker
			send, early bool
		}{
			{name: "no send"},
			{name: "sent after the claim", send: true},
			{name: "distinct tasks", distinct: true},
			{name: "distinct tasks sent early", distinct: true, send: true, early: true},
		} {
			t.Run(tc.name+"/"+v.name, func(t *testing.T) {
				submissionClaims(t, ctx, tc.wf, v.distinct, v.send, v.early)
			})
		}
	}
}

// submissionClaims is one case of TestSubmissionClaimsItsReadyTasks: a
// submission of wf's kind, its picks of distinct tasks or not, sent or not.
func submissionClaims(t *testing.T, ctx context.Context, wf NewWorkflow, distinctTasks, send, early bool) {
	t.Parallel()
	f := newFixture(t)
	other, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "browser", Slots: 2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dag := func() []NewTask {
		a, c, d := f.task("a"), f.task("c"), f.task("d")
		a.Args, a.Stdin, a.Seed, c.CkptMS = []string{"1", "2"}, []byte("in"), 7, 1500
		b := f.task("b", NewInput{Name: "in", From: 0, Output: "stdout"})
		return []NewTask{a, b, c, d}
	}
	// a on both workers (a second replica, or refused) unless
	// distinctTasks, c on the other with its own checkpoint interval, b
	// blocked, d left.
	picks := []SubmitPick{{Task: 0, Worker: f.worker}, {Task: 2, Worker: other.ID, CkptMS: 4000, Solo: true},
		{Task: 1, Worker: f.worker}, {Task: 0, Worker: other.ID}, {Task: 9, Worker: f.worker}, {Task: -1, Worker: f.worker}}
	if distinctTasks {
		picks = slices.Delete(picks, 3, 4)
	}

	// A workflow of the same task names, which no claim may touch.
	decoy := wf
	decoy.Name, decoy.Tasks = "decoy", dag()
	decoyID, err := f.s.CreateWorkflow(ctx, f.owner, &decoy)
	if err != nil {
		t.Fatal(err)
	}
	before := dump(t, f.s, decoyID, true)

	// The reference: submitted, then claimed by id.
	ref := wf
	ref.Name, ref.Tasks = "wf", dag()
	refID, err := f.s.CreateWorkflow(ctx, f.owner, &ref)
	if err != nil {
		t.Fatal(err)
	}
	ids := taskIDs(t, f.s, refID)
	var byID []Pick
	for _, p := range picks {
		if p.Task >= 0 && p.Task < len(ref.Tasks) {
			byID = append(byID, Pick{TaskID: ids[ref.Tasks[p.Task].Name], Worker: p.Worker, CkptMS: p.CkptMS, Solo: p.Solo})
		}
	}
	want, err := f.s.ClaimPicks(ctx, byID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	w := wf
	w.Name, w.Tasks = "wf", dag()
	var sent []Claimed
	var sendFn func([]Claimed)
	if send {
		sendFn = func(cl []Claimed) {
			sent = slices.Clone(cl)
			if !early {
				return // the claim ran; its COMMIT may have ended or not
			}
			var n int
			if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE workflow_id = $1`, cl[0].WorkflowID).Scan(&n); err != nil {
				t.Error(err)
			}
			if n != 0 {
				t.Errorf("%d tasks of the workflow when its attempts were sent early: want none, not written yet", n)
			}
		}
	}
	id, got, err := f.s.CreateWorkflowClaiming(ctx, f.owner, &w, picks, time.Minute, want[len(want)-1].Attempt, sendFn)
	if err != nil {
		t.Fatal(err)
	}
	if send {
		if len(sent) != len(got) {
			t.Fatalf("sent %d attempts, claimed %d: want the same", len(sent), len(got))
		}
		for i := range sent {
			if early {
				if sent[i].TaskID != 0 {
					t.Errorf("attempt %d sent early with task id %d: want 0, not drawn yet", sent[i].Attempt, sent[i].TaskID)
				}
				sent[i].TaskID = got[i].TaskID
			}
		}
		if !reflect.DeepEqual(sent, got) {
			t.Errorf("sent %+v\nclaimed %+v", sent, got)
		}
	}
	if len(got) < 2 || len(got) != len(want) {
		t.Fatalf("claimed %d attempts at submission, %d after: want the same, at least a and c", len(got), len(want))
	}
	perWorker := map[string]int64{}
	for i := range got {
		if got[i].WorkflowID != id || got[i].Attempt <= want[len(want)-1].Attempt {
			t.Errorf("attempt %d of workflow %s: want workflow %s and a new attempt id", got[i].Attempt, got[i].WorkflowID, id)
		}
		got[i].Attempt, got[i].TaskID, got[i].WorkflowID = want[i].Attempt, want[i].TaskID, want[i].WorkflowID
		perWorker[got[i].Worker]++
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("claimed at submission %+v\nclaimed after %+v", got, want)
	}
	rows := func(id string) []string {
		r := dump(t, f.s, id, true)
		return append(r, queryRows(t, f.s, `SELECT t.name, a.state, a.restored_seq, a.ckpt_ms, a.worker_id = $2,
			a.lease_until - a.started_at, $3::bool FROM attempts a JOIN tasks t ON t.id = a.task_id
			WHERE t.workflow_id = $1 ORDER BY t.name, a.worker_id = $2`, id, f.worker, false)...)
	}
	if g, w := rows(id), rows(refID); !reflect.DeepEqual(g, w) {
		t.Errorf("rows differ:\nclaimed at submission %v\nclaimed after %v", g, w)
	}
	if after := dump(t, f.s, decoyID, true); !reflect.DeepEqual(after, before) {
		t.Errorf("another workflow's tasks of the same names changed:\nbefore %v\nafter %v", before, after)
	}
	for _, wk := range []string{f.worker, other.ID} {
		var n int64
		if err := f.s.pool.QueryRow(ctx, `SELECT attempts FROM workers WHERE id = $1`, wk).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2*perWorker[wk] {
			t.Errorf("worker has %d attempts, want %d: as many claimed after its submission as at it", n, 2*perWorker[wk])
		}
	}
}

// A submission whose ready tasks are all claimed in its transaction sends
// no notification: no dispatcher has anything to do for it. One that leaves
// a ready task does.
func TestSubmissionClaimingAllNotifiesNobody(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	conn, err := f.s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+ChannelReady); err != nil {
		t.Fatal(err)
	}
	all := NewWorkflow{Name: "all", Priority: "batch", Tasks: []NewTask{f.task("a"), f.task("b", NewInput{From: 0, Output: "stdout"})}}
	if _, claimed, err := f.s.CreateWorkflowClaiming(ctx, f.owner, &all, []SubmitPick{{Task: 0, Worker: f.worker}}, time.Minute, 0, nil); err != nil || len(claimed) != 1 {
		t.Fatalf("%d claimed, err %v: want a", len(claimed), err)
	}
	if _, err := f.s.pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, ChannelReady); err != nil {
		t.Fatal(err)
	}
	some := NewWorkflow{Name: "some", Priority: "batch", Tasks: []NewTask{f.task("a"), f.task("c")}}
	if _, claimed, err := f.s.CreateWorkflowClaiming(ctx, f.owner, &some, []SubmitPick{{Task: 0, Worker: f.worker}}, time.Minute, 0, nil); err != nil || len(claimed) != 1 {
		t.Fatalf("%d claimed, err %v: want a, and c left", len(claimed), err)
	}
	for _, want := range []string{"marker", ""} {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := conn.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for %q: %v", want, err)
		}
		if n.Payload != want {
			t.Errorf("notification %q, want %q (the submission that claimed all its ready tasks notified)", n.Payload, want)
		}
	}
}

// Only small workflows are claimed at submission; a larger one is refused
// whole, with nothing written.
func TestSubmissionClaimsOnlySmallWorkflows(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	many := make([]NewTask, smallWorkflow+1)
	for i := range many {
		many[i] = f.task(fmt.Sprint("t", i))
	}
	w := NewWorkflow{Name: "large", Priority: "batch", Tasks: many}
	if w.Claimable() {
		t.Errorf("%d tasks: claimable", len(many))
	}
	if _, _, err := f.s.CreateWorkflowClaiming(ctx, f.owner, &w, []SubmitPick{{Task: 0, Worker: f.worker}}, time.Minute, 0, nil); err == nil {
		t.Errorf("%d tasks: claimed at submission", len(many))
	}
	var n int
	if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM workflows`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d workflows written", n)
	}
}

// A task's workflow and module must exist: a submission naming an unknown
// module is refused whole on either path (workflow_modules keeps its keys
// to modules), every module of a workflow's tasks is listed in
// workflow_modules, a module in use cannot be deleted, and deleting a
// workflow deletes its tasks. Task rows themselves are no longer checked
// against workflow_modules (migrations/00013_tasks_without_keys.sql): the
// store writes both from the same tasks.
func TestTasksReferenceTheirWorkflowAndModule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	other := "sha256:" + fmt.Sprintf("%064x", 2)
	if _, _, err := f.s.PutModule(ctx, f.owner, 1<<30, other, []byte("\x00asm"), []string{}); err != nil {
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
		if got := count(`SELECT count(*) FROM tasks t WHERE t.workflow_id = $1 AND NOT EXISTS (SELECT 1 FROM workflow_modules m
			WHERE m.workflow_id = t.workflow_id AND m.module_id = t.module_id)`, id); got != 0 {
			t.Errorf("%d tasks: %d tasks name a module their workflow does not list", n, got)
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

// Deleting a workflow deletes its tasks' attempts, outputs and entries in
// running_attempts too (attempts and task_outputs carry no foreign key
// since migration 00010; a statement trigger on tasks cascades instead),
// and nothing of another workflow.
func TestDeletingAWorkflowDeletesItsAttemptsAndOutputs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	gone := f.submit(t, "batch", f.task("a"), f.task("b"))
	kept := f.submit(t, "batch", f.task("a"), f.task("b"))
	cs := f.claim(t, 4, time.Minute)
	if len(cs) != 4 {
		t.Fatalf("%d claimed, want 4", len(cs))
	}
	if cs[0].WorkflowID != gone {
		t.Fatalf("the first claimed task is of workflow %s, want %s", cs[0].WorkflowID, gone)
	}
	var done []Completion
	for _, c := range cs[1:] { // the first runs on
		done = append(done, Completion{Attempt: c.Attempt, Worker: c.Worker, OK: true, Outputs: []Output{{Name: "out", Data: []byte(c.Name)}}})
	}
	if acc, err := f.s.Complete(ctx, done); err != nil || slices.Contains(acc, false) {
		t.Fatalf("complete: %v %v", acc, err)
	}
	count := func(table, workflow string) int {
		t.Helper()
		var n int
		if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` x JOIN tasks t ON t.id = x.task_id WHERE t.workflow_id = $1`,
			workflow).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := map[string]int{}
	for _, table := range []string{"attempts", "task_outputs"} {
		before[table] = count(table, kept)
	}
	var total int
	if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM attempts) + (SELECT count(*) FROM task_outputs)`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 7 || before["attempts"]+before["task_outputs"] == 0 {
		t.Fatalf("%d attempts and outputs in all, %v of the kept workflow: want 7, some of them kept", total, before)
	}
	if _, err := f.s.pool.Exec(ctx, `DELETE FROM workflows WHERE id = $1`, gone); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM attempts) + (SELECT count(*) FROM task_outputs)`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if want := before["attempts"] + before["task_outputs"]; left != want {
		t.Errorf("%d attempts and outputs left, want the kept workflow's %d", left, want)
	}
	var listed int // entries of running_attempts without an attempt
	if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM running_attempts r
		WHERE NOT EXISTS (SELECT 1 FROM attempts a WHERE a.id = r.attempt_id)`).Scan(&listed); err != nil {
		t.Fatal(err)
	}
	if listed != 0 {
		t.Errorf("%d deleted attempts still listed as running, want none", listed)
	}
	for _, table := range []string{"attempts", "task_outputs"} {
		if n := count(table, kept); n != before[table] {
			t.Errorf("the kept workflow has %d rows in %s, had %d", n, table, before[table])
		}
	}
}

// Deleting a workflow deletes its tasks and their edges, and nothing of
// another workflow: foreign keys did this until statement triggers took
// over (migrations/00013_tasks_without_keys.sql).
func TestDeletingAWorkflowDeletesItsTasksAndEdges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	chain := func() string {
		return f.submit(t, "batch", f.task("a"), f.task("b", NewInput{Name: "in", From: 0, Output: "stdout"}),
			f.task("c", NewInput{Name: "in", From: 1, Output: "stdout"}, NewInput{Name: "", From: 0, Output: "stdout"}))
	}
	gone, kept := chain(), chain()
	count := func(workflow string) (tasks, edges int) {
		t.Helper()
		if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tasks WHERE workflow_id = $1),
			(SELECT count(*) FROM task_inputs i WHERE i.task_id IN (SELECT id FROM tasks WHERE workflow_id = $1)
				OR i.from_task IN (SELECT id FROM tasks WHERE workflow_id = $1))`, workflow).Scan(&tasks, &edges); err != nil {
			t.Fatal(err)
		}
		return tasks, edges
	}
	if tk, e := count(gone); tk != 3 || e != 3 {
		t.Fatalf("the workflow has %d tasks and %d edges, want 3 and 3", tk, e)
	}
	if _, err := f.s.pool.Exec(ctx, `DELETE FROM workflows WHERE id = $1`, gone); err != nil {
		t.Fatal(err)
	}
	var tasks, edges int
	if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM task_inputs)`).Scan(&tasks, &edges); err != nil {
		t.Fatal(err)
	}
	if tasks != 3 || edges != 3 {
		t.Errorf("%d tasks and %d edges left, want the kept workflow's 3 and 3", tasks, edges)
	}
	if tk, e := count(kept); tk != 3 || e != 3 {
		t.Errorf("the kept workflow has %d tasks and %d edges, want 3 and 3", tk, e)
	}
}

// A claiming submission whose answer was lost (recoverSubmission): when the
// workflow was written after all, its attempts, never sent, are ended
// without counting against the task, which is ready again, and its id comes
// back; a workflow that was not written gives no id.
func TestLostSubmissionAnswerRequeuesItsAttempts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	w := NewWorkflow{Name: "wf", Priority: "batch", Tasks: []NewTask{f.task("a")}}
	id, claimed, err := f.s.CreateWorkflowClaiming(ctx, f.owner, &w, []SubmitPick{{Task: 0, Worker: f.worker}}, time.Minute, 0, nil)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("%d claimed, err %v", len(claimed), err)
	}
	var uid pgtype.UUID
	if err := uid.Scan(id); err != nil {
		t.Fatal(err)
	}
	got, err := f.s.recoverSubmission(ctx, uid, 0)
	if err != nil || got != id {
		t.Fatalf("recovered %q, err %v: want %s", got, err, id)
	}
	var state string
	var attempts int
	if err := f.s.pool.QueryRow(ctx, `SELECT state, attempts FROM tasks WHERE workflow_id = $1`, id).Scan(&state, &attempts); err != nil {
		t.Fatal(err)
	}
	if state != StateReady || attempts != 0 {
		t.Errorf("task %s after %d counted attempts, want ready after none", state, attempts)
	}
	if n := f.claim(t, 1, time.Minute); len(n) != 1 {
		t.Errorf("the task was not claimable again")
	}
	other, _ := newUUID()
	if got, err := f.s.recoverSubmission(ctx, other, 0); err != nil || got != "" {
		t.Errorf("a workflow never written: recovered %q, err %v", got, err)
	}
}

// atCommitSQL adds to a test's database a check that runs at the COMMIT
// of a transaction that wrote a workflow: one named held-at-commit waits
// for advisory lock 4242, one named refused-at-commit fails, one named
// stuck-at-commit waits for the lock and goes on waiting when its client
// cancels it (as a WAL flush or a synchronous standby keeps a COMMIT).
// Real PostgreSQL behaviour at the moment a claiming submission's attempts
// are already out.
const atCommitSQL = `CREATE SEQUENCE test_deadlocks;
CREATE FUNCTION test_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.name = 'held-at-commit' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
	IF NEW.name = 'refused-at-commit' THEN RAISE EXCEPTION 'refused at commit'; END IF;
	IF NEW.name = 'deadlocked-once' AND nextval('test_deadlocks') = 1 THEN
		RAISE EXCEPTION 'deadlock detected at commit' USING ERRCODE = '40P01';
	END IF;
	IF NEW.name = 'stuck-at-commit' THEN
		LOOP
			BEGIN
				PERFORM pg_advisory_xact_lock(4242);
				EXIT;
			EXCEPTION WHEN query_canceled THEN
				-- waits on, however many cancel requests come
			END;
		END LOOP;
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_at_commit AFTER INSERT ON workflows DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION test_at_commit()`

// A submission sends its attempts early only once it has a connection:
// the workers' gates stay shut from the send to the commit, and must not
// while the pool has no connection free.
func TestEarlySendWaitsForAConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.s.attemptIDs.take(ctx, f.s.pool, 1, 0); err != nil { // ids at hand: none need a connection
		t.Fatal(err)
	}
	var held []*pgxpool.Conn
	for range f.s.pool.Config().MaxConns {
		c, err := f.s.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// No connection comes free: the submission gives up when its
	// context ends, having sent nothing.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	sent := false
	w := NewWorkflow{Name: "waits", Priority: "interactive", Tasks: []NewTask{f.task("a")}}
	_, _, err := f.s.CreateWorkflowClaiming(cctx, f.owner, &w, []SubmitPick{{Task: 0, Worker: f.worker}}, time.Minute, 0,
		func([]Claimed) { sent = true })
	for _, c := range held {
		c.Release()
	}
	if err == nil || sent {
		t.Errorf("submission without a connection: err %v, sent %v; want an error, nothing sent", err, sent)
	}
}

// A submission whose attempts went out before it ran, rolled back by a
// deadlock (here at its COMMIT), runs again under the same attempt ids:
// the attempts the workers got are the ones written, sent once.
func TestEarlySentSubmissionRetriesADeadlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.s.pool.Exec(ctx, atCommitSQL); err != nil {
		t.Fatal(err)
	}
	w := NewWorkflow{Name: "deadlocked-once", Priority: "interactive", Tasks: []NewTask{f.task("a"), f.task("b")}}
	var sent [][]Claimed
	id, claimed, err := f.s.CreateWorkflowClaiming(ctx, f.owner, &w, []SubmitPick{{Task: 0, Worker: f.worker}, {Task: 1, Worker: f.worker}},
		time.Minute, 0, func(cl []Claimed) { sent = append(sent, cl) })
	if err != nil {
		t.Fatal(err)
	}
	var tries int64
	if err := f.s.pool.QueryRow(ctx, `SELECT last_value FROM test_deadlocks`).Scan(&tries); err != nil || tries != 2 {
		t.Fatalf("committed at try %d (%v), want the second", tries, err)
	}
	if len(sent) != 1 || len(claimed) != 2 || claimed[0].Attempt != sent[0][0].Attempt || claimed[1].Attempt != sent[0][1].Attempt {
		t.Fatalf("sent %d times, claimed %+v: want the attempts sent once, written", len(sent), claimed)
	}
	if st := f.states(t, id); st["a"] != StateRunning || st["b"] != StateRunning {
		t.Errorf("tasks %v, want both running", st)
	}
}

// A claiming submission with send gives its attempts out before its COMMIT
// has ended (before its transaction, or while its COMMIT is held: both
// sendPaths), the attempts visible to nobody else, and they are there once
// it returns. A COMMIT that fails after send returns an error, with
// nothing written, so that the caller takes the attempts back.
func TestClaimingSubmissionSendsBeforeItsCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.s.pool.Exec(ctx, atCommitSQL); err != nil {
		t.Fatal(err)
	}
	admin, err := f.s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Release()
	visible := func(attempt int64) bool {
		var n int
		if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM attempts WHERE id = $1`, attempt).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	for _, path := range sendPaths(t, f) {
		for _, name := range []string{"held-at-commit", "refused-at-commit"} {
			t.Run(path.name+"/"+name, func(t *testing.T) {
				if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
					t.Fatal(err)
				}
				// Bounded: with the attempts read only after the COMMIT, send
				// would never run while the lock is held.
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				w := path.workflow(name, f.task("a"))
				var sent []Claimed
				id, claimed, err := f.s.CreateWorkflowClaiming(cctx, f.owner, &w, path.picks, time.Minute, 0,
					func(cl []Claimed) {
						sent = cl
						if len(cl) == 1 && visible(cl[0].Attempt) {
							t.Errorf("attempt %d visible to another connection before the commit", cl[0].Attempt)
						}
						if _, err := admin.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
							t.Error(err)
						}
					})
				if len(sent) != len(path.picks) {
					t.Fatalf("send got %d attempts (err %v), want %d", len(sent), err, len(path.picks))
				}
				if name == "refused-at-commit" {
					if err == nil || claimed != nil || id != "" {
						t.Errorf("got id %q, %d attempts, err %v: want an error and nothing", id, len(claimed), err)
					}
					var n int
					if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE name = $1`, w.Name).Scan(&n); err != nil || n != 0 {
						t.Errorf("%d workflows named %s written (err %v), want none", n, w.Name, err)
					}
					if visible(sent[0].Attempt) {
						t.Errorf("attempt %d written without its commit", sent[0].Attempt)
					}
					return
				}
				if err != nil || len(claimed) != len(sent) || claimed[0].Attempt != sent[0].Attempt {
					t.Fatalf("got %d attempts, err %v: want those sent", len(claimed), err)
				}
				if !visible(sent[0].Attempt) {
					t.Errorf("attempt %d not visible after the commit", sent[0].Attempt)
				}
			})
		}
	}
}

// sendPath is one of the ways a claiming submission with send sends its
// attempts: picks of distinct tasks go before its transaction, replicas of
// one task on two workers once its claim has run (createSending).
type sendPath struct {
	name     string
	picks    []SubmitPick
	replicas int
}

// sendPaths returns both, with a second worker registered for the
// replicas.
func sendPaths(t *testing.T, f *fixture) []sendPath {
	t.Helper()
	other, err := f.s.RegisterWorker(context.Background(), WorkerHello{Kind: "browser", Slots: 2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return []sendPath{
		{"early", []SubmitPick{{Task: 0, Worker: f.worker}}, 1},
		{"after the claim", []SubmitPick{{Task: 0, Worker: f.worker}, {Task: 0, Worker: other.ID}}, 2},
	}
}

// workflow is an interactive workflow named name of tasks, replicated as
// p's picks need.
func (p sendPath) workflow(name string, tasks ...NewTask) NewWorkflow {
	return NewWorkflow{Name: name, Priority: "interactive", Tasks: tasks, Replicas: p.replicas, Quorum: p.replicas, MaxReplicas: p.replicas}
}

// A claiming submission whose COMMIT's answer is lost while the COMMIT is
// still in flight (its client gave up; the COMMIT waits on) is looked up
// only once its backend has ended. When the COMMIT then commits, the
// workflow is found, its attempt ended without counting against its task
// or worker, and its id returned, rather than "not written" and an attempt
// left running that no worker holds. A backend that does not end within
// backendGrace is terminated (a COMMIT held here by a lock rolls back;
// one waiting for a synchronous standby would be visible): nothing
// written, an error.
func TestLostAnswerOfACommitInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.s.pool.Exec(ctx, atCommitSQL); err != nil {
		t.Fatal(err)
	}
	for _, path := range sendPaths(t, f) {
		for _, tt := range []struct {
			name    string
			release bool // the COMMIT goes on, some time after the client gave up
		}{{"committed", true}, {"terminated", false}} {
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				// Once the COMMIT waits (for the lock), the client gives up on
				// it; the lock is let go a while after that, or never.
				cctx, cancel := context.WithCancel(ctx)
				defer cancel()
				sentC := make(chan struct{})
				released := giveUpAtCommit(t, f, sentC, cancel, tt.release)
				w := path.workflow("stuck-at-commit", f.task("a"))
				var sent []Claimed
				id, claimed, err := f.s.CreateWorkflowClaiming(cctx, f.owner, &w, path.picks, time.Minute, 0,
					func(cl []Claimed) {
						sent = cl
						close(sentC)
					})
				if len(sent) != len(path.picks) {
					t.Fatalf("send got %d attempts (err %v), want %d", len(sent), err, len(path.picks))
				}
				if rerr := <-released; rerr != nil {
					t.Fatal(rerr)
				}
				var state, task string
				var attempts int
				row := f.s.pool.QueryRow(ctx, `SELECT a.state, t.state, t.attempts FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE a.id = $1`,
					sent[0].Attempt)
				if !tt.release {
					if err == nil || id != "" {
						t.Errorf("got id %q, err %v: want an error", id, err)
					}
					if err := row.Scan(&state, &task, &attempts); !errors.Is(err, pgx.ErrNoRows) {
						t.Errorf("attempt %s written (err %v), want nothing", state, err)
					}
					return
				}
				if err != nil || claimed != nil || id == "" {
					t.Fatalf("got id %q, %d attempts, err %v: want the workflow's id, its attempt taken back", id, len(claimed), err)
				}
				if err := row.Scan(&state, &task, &attempts); err != nil {
					t.Fatal(err)
				}
				if state == "running" || task != StateReady || attempts != 0 {
					t.Errorf("attempt %s, task %s after %d counted attempts: want the attempt ended, the task ready after none", state, task, attempts)
				}
			})
		}
	}
}

// giveUpAtCommit takes advisory lock 4242 (let go when the test ends),
// waits for start, then until a COMMIT waits for the lock (atCommitSQL's
// stuck-at-commit), then gives up on it (cancel), and when release, lets go
// of the lock half a second later (a look for the workflow made at once
// would find nothing). Its channel says when it is done, or what went
// wrong.
func giveUpAtCommit(t *testing.T, f *fixture, start <-chan struct{}, cancel func(), release bool) <-chan error {
	t.Helper()
	// A COMMIT let go goes on however long a loaded machine makes it
	// wait for its turn; one never let go is terminated soon.
	f.s.backendGrace = time.Second
	if release {
		f.s.backendGrace = time.Minute
	}
	ctx := context.Background()
	lock, err := f.s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		lock.Release()
		t.Fatal(err)
	}
	released, stop, finished := make(chan error, 1), make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-finished
		lock.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		lock.Release()
	})
	go func() {
		defer close(finished)
		select {
		case <-start:
		case <-stop: // the test ended first
			return
		}
		for try := 0; ; try++ {
			var n int
			if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()`).Scan(&n); err != nil {
				released <- err
				return
			}
			if n > 0 {
				break
			}
			select {
			case <-stop:
				return
			default:
			}
			if try == 3000 {
				released <- errors.New("the COMMIT never waited for the lock")
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if !release {
			released <- nil
			return
		}
		time.Sleep(500 * time.Millisecond)
		_, err := lock.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
		released <- err
	}()
	return released
}

// A submission without claims (small, or large: its own transaction)
// whose COMMIT's answer is lost while the COMMIT is in flight is looked up
// once its backend has ended: its id comes back, not an error that would
// have its owner submit it again. The client's giving up may cancel the
// COMMIT after all: pgx sends a cancel request as it closes the
// connection, which a loaded machine can deliver after the lock was let
// go, when nothing catches it. So each try asserts that the answer is
// what the database holds (the id, or an error and nothing written), and
// the test that the COMMIT went through, and its id came back, at least
// once in a few tries.
func TestLostAnswerOfAWorkflowsCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.s.pool.Exec(ctx, atCommitSQL); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, smallWorkflow + 1} {
		t.Run(fmt.Sprintf("%d tasks", n), func(t *testing.T) {
			found := false
			for try := 0; try < 5 && !found; try++ {
				cctx, cancel := context.WithCancel(ctx)
				start := make(chan struct{})
				close(start)
				released := giveUpAtCommit(t, f, start, cancel, true)
				w := NewWorkflow{Name: "stuck-at-commit", Priority: "batch"}
				var err error
				if w.ID, err = NewWorkflowID(); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					w.Tasks = append(w.Tasks, f.task(fmt.Sprintf("t%d", i)))
				}
				id, err := f.s.CreateWorkflow(cctx, f.owner, &w)
				cancel()
				if rerr := <-released; rerr != nil {
					t.Fatal(rerr)
				}
				var tasks int
				if qerr := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE workflow_id = $1`, w.ID).Scan(&tasks); qerr != nil {
					t.Fatal(qerr)
				}
				switch {
				case tasks == n && id == w.ID && err == nil:
					found = true
				case tasks == 0 && id == "" && err != nil:
					t.Logf("try %d: the COMMIT was cancelled after all (%v)", try, err)
				default:
					t.Fatalf("got id %q, err %v, with %d of the workflow's %d tasks written: want its id with all of them, or an error with none",
						id, err, tasks, n)
				}
			}
			if !found {
				t.Error("no COMMIT went through in 5 tries: want the workflow's id back")
			}
		})
	}
}

// notSent is an error before anything was sent (pgconn.SafeToRetry).
type notSent struct{}

func (notSent) Error() string     { return "not sent" }
func (notSent) SafeToRetry() bool { return true }

// uncertain takes an error after a COMMIT was sent as maybe committed,
// with the backend to wait for only when the connection is closed (its
// backend may still be committing); an error PostgreSQL reported, or one
// before anything was sent, says the transaction did not commit.
func TestUncertain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	pc, err := f.s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	open := pc.Conn().PgConn()
	closed, err := pgconn.Connect(ctx, f.s.pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	pid := closed.PID()
	closed.Close(ctx)
	lost := errors.New("connection lost")
	for _, tt := range []struct {
		name  string
		conn  *pgconn.PgConn
		err   error
		maybe bool
		pid   uint32
	}{
		{"reported error", closed, &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505"}, false, 0},
		{"fatal error", closed, &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, true, pid},
		{"nothing sent", closed, notSent{}, false, 0},
		{"lost, connection closed", closed, lost, true, pid},
		{"lost, connection open", open, lost, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mc *maybeCommitted
			got := uncertain(tt.conn, tt.err)
			if errors.As(got, &mc) != tt.maybe || !errors.Is(got, tt.err) {
				t.Fatalf("uncertain = %v, want maybe committed %v", got, tt.maybe)
			}
			if tt.maybe && mc.pid != tt.pid {
				t.Errorf("pid %d, want %d", mc.pid, tt.pid)
			}
		})
	}
}
