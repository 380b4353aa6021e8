package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkCandidatesClaimPicksComplete measures the store's side of the
// dispatcher's round as the server runs it: read the candidates
// (Candidates), claim the plan's picks (ClaimPicks), complete them
// (Complete), in batches of 80 picks with the server's candidate limit. It
// reports the time of each step per batch.
func BenchmarkCandidatesClaimPicksComplete(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b)
	tasks := make([]NewTask, b.N)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	f.submit(b, "batch", tasks...)
	const batch = 80
	var cand, claim, complete time.Duration
	batches := 0
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		t0 := time.Now()
		cs, _, err := f.s.Candidates(ctx, 4*n+64, nil)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		picks := make([]Pick, 0, n)
		for _, c := range cs[:min(n, len(cs))] {
			picks = append(picks, Pick{TaskID: c.TaskID, Worker: f.worker})
		}
		claimed, err := f.s.ClaimPicks(ctx, picks, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		comps := make([]Completion, len(claimed))
		for i, c := range claimed {
			comps[i] = ok(c, "")
		}
		if _, err := f.s.Complete(ctx, comps); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		cand, claim, complete = cand+t1.Sub(t0), claim+t2.Sub(t1), complete+t3.Sub(t2)
		batches++
		done += len(claimed)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(batches) }
	b.ReportMetric(ms(cand), "candidates-ms/batch")
	b.ReportMetric(ms(claim), "claimpicks-ms/batch")
	b.ReportMetric(ms(complete), "complete-ms/batch")
}

// A claim's work grows with its picks, not with the queue, even when the
// planner's statistics of tasks were taken while the table was small (as
// autovacuum may leave them for a minute after a large submission). With
// such statistics, the claim used to read every ready task through
// tasks_active, and to run the replica window once per locked task.
func TestClaimReadsRowsInProportionToItsPicks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := staleQueue(t, 5000)
	cands, _, err := f.s.Candidates(ctx, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := f.s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const picks = 80
	for i, sql := range []string{claimPicksSQL, claimOnePerTaskSQL} {
		name := []string{"claimPicksSQL", "claimOnePerTaskSQL"}[i]
		if _, err := conn.Exec(ctx, `PREPARE claim(bigint[], uuid[], bigint[], bool[], bigint) AS `+sql); err != nil {
			t.Fatal(err)
		}
		// The first executions of a prepared statement may be planned
		// with the parameters' values; the store forces the generic
		// plan, as here.
		for round := range 3 {
			claimRound(t, conn, name, cands[(3*i+round)*picks:(3*i+round+1)*picks], f.worker, picks)
		}
		if _, err := conn.Exec(ctx, `DEALLOCATE claim`); err != nil {
			t.Fatal(err)
		}
	}
}

// claimRound runs the prepared claim on the picks cands and checks that
// no node of its plan read more than a few rows per pick.
func claimRound(t *testing.T, conn *pgxpool.Conn, name string, cands []Candidate, worker string, picks int) {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	var workers []string
	for _, c := range cands {
		ids, workers = append(ids, c.TaskID), append(workers, worker)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`); err != nil {
		t.Fatal(err)
	}
	var plan []struct{ Plan planNode }
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim($1, $2, $3, $4, $5)`, pgx.QueryExecModeSimpleProtocol,
		ids, workers, make([]int64, picks), make([]bool, picks), int64(60000)).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := plan[0].Plan.ActualRows; got != float64(picks) {
		t.Fatalf("%s claimed %v tasks, want %d", name, got, picks)
	}
	// A node may read each pick a few times (the picks, the locked
	// tasks, their attempts); the queue holds 5,000 tasks, and the
	// window run once per locked task gave 80 × 80 rows.
	plan[0].Plan.walk(func(n *planNode) {
		if rows := n.ActualRows * n.ActualLoops; rows > float64(4*picks) {
			t.Errorf("%s: %s%s returned %v rows over %v loops for %d picks", name, n.NodeType, n.on(), n.ActualRows, n.ActualLoops, picks)
		}
	})
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan.
type planNode struct {
	NodeType    string     `json:"Node Type"`
	Relation    string     `json:"Relation Name"`
	Index       string     `json:"Index Name"`
	CTE         string     `json:"CTE Name"`
	ActualRows  float64    `json:"Actual Rows"`
	ActualLoops float64    `json:"Actual Loops"`
	Removed     float64    `json:"Rows Removed by Filter"`
	Plans       []planNode `json:"Plans"`
}

func (n *planNode) walk(f func(*planNode)) {
	f(n)
	for i := range n.Plans {
		n.Plans[i].walk(f)
	}
}

// on names what the node reads, if anything.
func (n *planNode) on() string {
	for _, s := range []string{n.Index, n.Relation, n.CTE} {
		if s != "" {
			return " on " + s
		}
	}
	return ""
}

// The completion's statements read rows in proportion to their batch
// whatever the statistics, as the claim does: with tasks analyzed while
// empty and 5,000 tasks active, storing outputs (insertOutputsSQL, and
// within completeFastSQL) and queueing tasks again (requeueSQL) find the
// batch's tasks by id instead of reading every active task, and ending
// attempts (completeAttemptsSQL) unnests its arrays once.
func TestCompletionReadsRowsInProportionToItsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := staleQueue(t, 5000)
	const batch = 80
	claimed := f.claim(t, 2000, time.Minute)
	var taskIDs, attemptIDs []int64
	var workers, reasons, states, names []string
	for _, c := range claimed[:batch] {
		taskIDs, attemptIDs = append(taskIDs, c.TaskID), append(attemptIDs, c.Attempt)
		workers, reasons, names = append(workers, f.worker), append(reasons, "worker"), append(names, "stdout")
		states = append(states, "failed")
	}
	data := make([][]byte, batch)
	for i := range data {
		data[i] = []byte{}
	}
	for _, st := range []struct {
		name string
		sql  string
		args []any
	}{
		{"insertOutputsSQL", insertOutputsSQL, []any{taskIDs, names, data}},
		{"requeueSQL", requeueSQL, []any{taskIDs, reasons, make([]bool, batch), make([]bool, batch), make([]bool, batch), make([]bool, batch), int64(0),
			workers, make([]bool, batch), make([]bool, batch)}},
		{"completeFastSQL", completeFastSQL, []any{attemptIDs, workers, data, attemptIDs, names, data, int64(0), ChannelReady, make([]int64, batch)}},
		{"completeAttemptsSQL", completeAttemptsSQL, []any{attemptIDs, workers, make([]bool, batch), data, reasons, states, make([]int64, batch)}},
	} {
		// As the store runs them: prepared, after queueBegin's settings
		// (a generic plan), several times. Each run is rolled back.
		conn, err := f.s.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `PREPARE stmt AS `+st.sql); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		params := make([]string, len(st.args))
		for i := range params {
			params[i] = fmt.Sprintf("$%d", i+1)
		}
		for round := range 3 {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, hotPathSettingsSQL); err != nil {
				t.Fatal(err)
			}
			var plan []struct{ Plan planNode }
			err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE stmt(`+strings.Join(params, ", ")+`)`,
				append([]any{pgx.QueryExecModeSimpleProtocol}, st.args...)...).Scan(&plan)
			_ = tx.Rollback(ctx)
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			// The reads of tables and indexes, and of the arrays
			// (unnested once, not once per row they join): only
			// completeFastSQL, which takes batches of at most fastBatch,
			// may join its arrays in a nested loop.
			plan[0].Plan.walk(func(n *planNode) {
				arrays := n.NodeType == "Function Scan" && st.name != "completeFastSQL"
				if rows := n.ActualRows * n.ActualLoops; rows > 4*batch && (n.Relation != "" || n.Index != "" || arrays) {
					t.Errorf("%s, run %d: %s%s returned %v rows over %v loops for a batch of %d", st.name, round, n.NodeType, n.on(), n.ActualRows, n.ActualLoops, batch)
				}
			})
		}
		if _, err := conn.Exec(ctx, `DEALLOCATE stmt`); err != nil {
			t.Fatal(err)
		}
		conn.Release()
	}
}

// staleQueue is a fixture with n ready tasks in one workflow and the
// planner's statistics of tasks and attempts taken while they were (nearly)
// empty, as autovacuum can leave them for a minute after a large
// submission.
func staleQueue(t *testing.T, n int) *fixture {
	t.Helper()
	ctx := context.Background()
	f := newFixture(t)
	if _, err := f.s.pool.Exec(ctx, `ANALYZE tasks, attempts`); err != nil {
		t.Fatal(err)
	}
	tasks := make([]NewTask, n)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	// createLarge does not refresh the statistics; CreateWorkflow would.
	if _, err := f.s.createLarge(ctx, f.owner, &NewWorkflow{Name: "big", Priority: "batch", Tasks: tasks}); err != nil {
		t.Fatal(err)
	}
	return f
}

// For picks of distinct tasks, claimOnePerTaskSQL does what claimPicksSQL
// does, and claimNewOnePerTaskSQL what claimNewSQL does: the same attempts (but their ids) and the same tasks afterwards,
// over tasks with one and with several pending replicas, solo picks, picks
// whose worker already ran a replica, and tasks no longer ready.
func TestClaimOnePerTaskMatchesTheGeneralClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 4}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	other := reg.ID
	plain := f.submit(t, "batch", f.task("p0"), f.task("p1"), f.task("p2"), f.task("p3"))
	if _, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "rep", Priority: "batch",
		Tasks: []NewTask{f.task("r0"), f.task("r1"), f.task("r2")}, Replicas: 2, Quorum: 2, MaxReplicas: 4}); err != nil {
		t.Fatal(err)
	}
	cands, _, err := f.s.Candidates(ctx, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]int64{}
	for _, c := range cands {
		byName[c.Name] = c.TaskID
	}
	// other runs a replica of r0 already, and p3 is no longer ready.
	if cs, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: byName["r0"], Worker: other}, {TaskID: byName["p3"], Worker: other}}, time.Minute); err != nil || len(cs) != 2 {
		t.Fatalf("claim r0 and p3 for the other worker: %+v, %v", cs, err)
	}
	picks := []Pick{
		{TaskID: byName["p0"], Worker: f.worker},
		{TaskID: byName["p1"], Worker: other, CkptMS: 500},
		{TaskID: byName["p2"], Worker: f.worker, Solo: true},
		{TaskID: byName["p3"], Worker: f.worker},
		{TaskID: byName["r0"], Worker: other},
		{TaskID: byName["r1"], Worker: f.worker},
		{TaskID: byName["r2"], Worker: other, Solo: true},
	}
	var tasks, ckpts []int64
	var workers []string
	var solos []bool
	for _, p := range picks {
		tasks, workers, ckpts, solos = append(tasks, p.TaskID), append(workers, p.Worker), append(ckpts, p.CkptMS), append(solos, p.Solo)
	}
	run := func(sql string, args ...any) (claimed []string, after []string) {
		tx, err := f.s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		vals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			v, err := r.Values()
			return fmt.Sprint(v[1:]), err // all but the attempt id
		})
		if err != nil {
			t.Fatal(err)
		}
		rows, err = tx.Query(ctx, `SELECT name, state, pending, attempts FROM tasks ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		after, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			v, err := r.Values()
			return fmt.Sprint(v), err
		})
		if err != nil {
			t.Fatal(err)
		}
		return vals, after
	}
	byID := []any{tasks, uuidParams(workers), ckpts, solos, int64(60000)}
	// The claim at submission names the tasks of one workflow: the first
	// four picks, in the plain workflow.
	byNames := []any{[]string{"p0", "p1", "p2", "p3"}, uuidParams(workers[:4]), ckpts[:4], solos[:4], int64(60000), plain}
	for _, tc := range []struct {
		general, one string
		args         []any
		want         int
	}{
		{"claimPicksSQL", "claimOnePerTaskSQL", byID, 5},
		{"claimNewSQL", "claimNewOnePerTaskSQL", byNames, 3},
	} {
		sqls := map[string]string{"claimPicksSQL": claimPicksSQL, "claimOnePerTaskSQL": claimOnePerTaskSQL,
			"claimNewSQL": claimNewSQL, "claimNewOnePerTaskSQL": claimNewOnePerTaskSQL}
		general, generalAfter := run(sqls[tc.general], tc.args...)
		one, oneAfter := run(sqls[tc.one], tc.args...)
		if len(general) != tc.want {
			t.Errorf("%s took %d attempts, want %d (not p3, not r0 again for the other worker):\n%s", tc.general, len(general), tc.want,
				strings.Join(general, "\n"))
		}
		if strings.Join(general, "\n") != strings.Join(one, "\n") {
			t.Errorf("attempts claimed by %s:\n%s\nwant, as %s:\n%s", tc.one, strings.Join(one, "\n"), tc.general, strings.Join(general, "\n"))
		}
		if strings.Join(generalAfter, "\n") != strings.Join(oneAfter, "\n") {
			t.Errorf("tasks after %s:\n%s\nwant, as %s:\n%s", tc.one, strings.Join(oneAfter, "\n"), tc.general, strings.Join(generalAfter, "\n"))
		}
	}
}

// Candidates and claims give every row its own workflow, module, priority
// and worker, though these repeat from row to row (interned).
func TestClaimedRowsKeepTheirOwnValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	mod2 := "sha256:" + fmt.Sprintf("%064x", 2)
	if _, _, err := f.s.PutModule(ctx, f.owner, 1<<30, mod2, []byte("\x00asm"), []string{}); err != nil {
		t.Fatal(err)
	}
	other, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 4}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	type want struct{ wf, module, priority string }
	byName := map[string]want{}
	for _, wf := range []struct {
		priority string
		modules  []string
	}{
		{"batch", []string{f.module, mod2, mod2, f.module}},
		{"interactive", []string{mod2, f.module, f.module}},
	} {
		var tasks []NewTask
		for i, m := range wf.modules {
			tk := f.task(fmt.Sprintf("%s-%d", wf.priority, i))
			tk.Module = m
			tasks = append(tasks, tk)
		}
		id := f.submit(t, wf.priority, tasks...)
		for _, tk := range tasks {
			byName[tk.Name] = want{id, tk.Module, wf.priority}
		}
	}
	cands, _, err := f.s.Candidates(ctx, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != len(byName) {
		t.Fatalf("%d candidates, want %d", len(cands), len(byName))
	}
	var picks []Pick
	workerOf := map[int64]string{}
	for i, c := range cands {
		if w := byName[c.Name]; c.WorkflowID != w.wf || c.Module != w.module || c.Priority != w.priority {
			t.Errorf("candidate %s: %s %s %s, want %v", c.Name, c.WorkflowID, c.Module, c.Priority, w)
		}
		w := f.worker
		if i%3 == 1 {
			w = other.ID
		}
		workerOf[c.TaskID] = w
		picks = append(picks, Pick{TaskID: c.TaskID, Worker: w})
	}
	claimed, err := f.s.ClaimPicks(ctx, picks, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != len(picks) {
		t.Fatalf("%d claimed, want %d", len(claimed), len(picks))
	}
	for _, c := range claimed {
		w := byName[c.Name]
		if c.WorkflowID != w.wf || c.Module != w.module || c.Priority != w.priority || c.Worker != workerOf[c.TaskID] {
			t.Errorf("claimed %s: %s %s %s on %s, want %v on %s", c.Name, c.WorkflowID, c.Module, c.Priority, c.Worker, w, workerOf[c.TaskID])
		}
	}
}

// A worker that reconnects keeps the attempts it names that still hold
// their lease, with their modules, and is told the others are lost.
func TestReconnectKeepsHeldAttemptsWithTheirModules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 2}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f.submit(t, "batch", f.task("a"))
	cands, _, err := f.s.Candidates(ctx, 1, nil)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v: %v", cands, err)
	}
	claimed, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: cands[0].TaskID, Worker: reg.ID}}, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claimed %v: %v", claimed, err)
	}
	held, bogus := claimed[0].Attempt, claimed[0].Attempt+1000
	again, err := f.s.RegisterWorker(ctx, WorkerHello{ID: reg.ID, Token: reg.Token, Kind: "headless", Slots: 2,
		Running: []int64{held, bogus}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != reg.ID {
		t.Fatalf("reconnected as %s, want %s", again.ID, reg.ID)
	}
	if len(again.Lost) != 1 || again.Lost[0] != bogus {
		t.Errorf("lost %v, want [%d]", again.Lost, bogus)
	}
	if len(again.Kept) != 1 || again.Kept[held].Module != f.module || again.Kept[held].Owner != f.owner {
		t.Errorf("kept %v, want %d: module %s of owner %d", again.Kept, held, f.module, f.owner)
	}
}

// A candidate says whether its task has a setup, and which data blobs its
// files read (for the plan's worker choice and locality).
func TestCandidatesCarrySetupAndData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	withFiles := f.task("files")
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	withFiles.Setup = []byte(`{"env": ["A=1"], "files": [{"path": "/x", "blob": "` + a + `", "size": 1}, {"path": "/y", "data": "z"}, {"path": "/z", "blob": "` + b + `", "archive": true}]}`)
	f.submit(t, "batch", f.task("plain"), withFiles)
	cs, _, err := f.s.Candidates(ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Candidate{}
	for _, c := range cs {
		got[c.Name] = c
	}
	if c := got["plain"]; c.Setup || c.Blobs != nil {
		t.Errorf("plain task: setup %v, blobs %v", c.Setup, c.Blobs)
	}
	if c := got["files"]; !c.Setup || fmt.Sprint(c.Blobs) != fmt.Sprint([]string{a, b}) {
		t.Errorf("task with files: setup %v, blobs %v, want true and [%s %s]", c.Setup, c.Blobs, a, b)
	}
}
