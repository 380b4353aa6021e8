package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A batch of successes takes the one-round-trip path (completeFast) except
// for replicated tasks' attempts; its outcome in the database is the one
// the general path gives: fenced attempts refused, outputs stored, tasks
// done, dependents ready, workflows finished, replicas verified.
func TestFastCompletionMatchesTheGeneralPath(t *testing.T) {
	t.Parallel()
	type outcome struct {
		Accepted []bool
		Rows     []string
	}
	run := func(t *testing.T, general bool) outcome {
		ctx := context.Background()
		f := newFixture(t)
		plain := f.submit(t, "batch", f.task("a"), f.task("b", NewInput{Name: "in", From: 0, Output: "stdout"}), f.task("solo"))
		rep, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "rep", Priority: "batch", Tasks: []NewTask{f.task("r")},
			Replicas: 2, Quorum: 2, MaxReplicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		cs := f.claim(t, 10, time.Minute)
		if len(cs) != 3 {
			t.Fatalf("claimed %d, want a, solo and one replica of r", len(cs))
		}
		byName := claimedByName(cs)
		wrong := ok(byName["solo"], "out of solo")
		wrong.Worker = "00000000-0000-0000-0000-000000000000" // not the worker holding it: refused
		batch := []Completion{
			ok(byName["a"], "out of a"),
			wrong,
			ok(byName["r"], "out of r"), // a replica: verified by the general path
			{Attempt: byName["a"].Attempt + 1000, Worker: f.worker, OK: true}, // no such attempt
		}
		var acc []bool
		if general {
			acc, err = f.s.completeGeneral(ctx, batch)
		} else {
			acc, err = f.s.Complete(ctx, batch)
		}
		if err != nil {
			t.Fatal(err)
		}
		rows := append(dump(t, f.s, plain, false), dump(t, f.s, rep, false)...)
		for _, id := range []string{plain, rep} {
			rows = append(rows, queryRows(t, f.s, `SELECT t.name, a.state, coalesce(encode(a.log, 'escape'), ''), a.reason
				FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1 ORDER BY t.name, a.id`, id)...)
			rows = append(rows, queryRows(t, f.s, `SELECT t.name, o.name, encode(o.data, 'escape') FROM task_outputs o
				JOIN tasks t ON t.id = o.task_id WHERE t.workflow_id = $1 ORDER BY t.name, o.name`, id)...)
		}
		return outcome{acc, rows}
	}
	fast, general := run(t, false), run(t, true)
	if !reflect.DeepEqual(fast, general) {
		t.Fatalf("fast path:\n%v\ngeneral path:\n%v", fast, general)
	}
	// And the outcome is the right one.
	if want := []bool{true, false, true, false}; !reflect.DeepEqual(fast.Accepted, want) {
		t.Errorf("accepted = %v, want %v", fast.Accepted, want)
	}
}

// completeFast itself takes the plain task's success in its one statement
// and hands the replica back, untouched, for the general path.
func TestCompleteFastLeavesReplicasToTheGeneralPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	plain, cs := f.plainAndReplica(t)
	acc, rest, _, _, err := f.s.completeFast(ctx, []Completion{ok(cs[0], "A"), ok(cs[1], "R")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(acc, []bool{true, false}) || !reflect.DeepEqual(rest, []int{1}) {
		t.Fatalf("accepted %v, rest %v; want [true false], [1]", acc, rest)
	}
	if st := f.states(t, plain); st["a"] != StateDone || st[""] != StateDone {
		t.Errorf("after the fast path: %v, want a and its workflow done", st)
	}
	var state string
	if err := f.s.pool.QueryRow(ctx, `SELECT state FROM attempts WHERE id = $1`, cs[1].Attempt).Scan(&state); err != nil || state != "running" {
		t.Errorf("the replica's attempt is %q (%v), want still running", state, err)
	}
}

// A completion that finishes workflows returns their ids, and one that
// finishes none returns none.
func TestCompletionTellsOfFinishedWorkflows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	two := f.submit(t, "batch", f.task("a"), f.task("b"))
	one := f.submit(t, "batch", f.task("c"))
	cs := f.claim(t, 10, time.Minute)
	if len(cs) != 3 {
		t.Fatalf("claimed %d, want 3", len(cs))
	}
	byName := claimedByName(cs)
	for _, step := range []struct {
		complete []string
		want     []string
	}{
		{[]string{"a"}, nil}, // b still runs
		{[]string{"b", "c"}, []string{one, two}},
	} {
		var batch []Completion
		for _, n := range step.complete {
			batch = append(batch, ok(byName[n], "out"))
		}
		_, got, err := f.s.CompleteFinished(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		want := slices.Clone(step.want)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("completing %v told of %v, want %v", step.complete, got, want)
		}
	}
}

// A small batch asked to watch workflows reads, after its commit, the
// status of each watched one that has finished, the same as
// StatusAndSpans reads it; not of one still running, and never more than
// MaxWatched. A watched id that is no workflow's, or not even a UUID,
// changes nothing.
func TestCompletionReadsWatchedStatuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	two := f.submit(t, "batch", f.task("a"), f.task("b"))
	one := f.submit(t, "batch", f.task("c"))
	other := f.submit(t, "batch", f.task("d"))
	cs := f.claim(t, 10, time.Minute)
	if len(cs) != 4 {
		t.Fatalf("claimed %d, want 4", len(cs))
	}
	byName := claimedByName(cs)
	nobody, _ := newUUID()
	for _, step := range []struct {
		complete []string
		watch    []string
		want     []string // the statuses read
	}{
		{[]string{"a", "d"}, []string{two, "not-a-uuid", one}, nil}, // two and one still run
		{[]string{"b", "c"}, []string{"not-a-uuid", two, nobody.String(), one}, []string{one, two}},
		// Beyond MaxWatched ids: other, finished before, is the fifth.
		{nil, []string{nobody.String(), nobody.String(), nobody.String(), nobody.String(), other}, nil},
	} {
		var batch []Completion
		for _, n := range step.complete {
			batch = append(batch, ok(byName[n], "out"))
		}
		if batch == nil {
			batch = []Completion{ok(byName["a"], "again")} // refused: a is done
		}
		_, _, statuses, err := f.s.CompleteWatching(ctx, batch, step.watch)
		if err != nil {
			t.Fatal(err)
		}
		got := slices.Sorted(maps.Keys(statuses))
		want := slices.Sorted(slices.Values(step.want))
		if !slices.Equal(got, want) {
			t.Errorf("completing %v watching %v read the statuses of %v, want %v", step.complete, step.watch, got, want)
		}
		for id, st := range statuses {
			wantSt, wantSpans, err := f.s.StatusAndSpans(ctx, f.owner, id)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(st.Status, wantSt) || !reflect.DeepEqual(st.Spans, wantSpans) {
				t.Errorf("status of %s read with the completion:\n%+v %+v\nread after:\n%+v %+v", id, st.Status, st.Spans, wantSt, wantSpans)
			}
		}
	}
}

// A small batch of successes that holds an attempt of a replicated task
// commits in two transactions: the others first, then the replica through
// the general path. When the second fails, the first's completions are
// still reported accepted; sent again, they would be refused, and their
// worker told that results the owner has were lost.
func TestCompletionsCommittedBeforeAFailureStayAccepted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, sqlstate string
		wantErr        bool // a retryable failure is returned; another one refuses the culprit alone
	}{
		{"failure", "P0001", false},
		{"retryable failure", "40001", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t)
			plain, cs := f.plainAndReplica(t)
			byName := claimedByName(cs)
			// Only the general path writes a replica's outputs.
			if _, err := f.s.pool.Exec(ctx, `CREATE FUNCTION fail_on_purpose() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN RAISE EXCEPTION 'failed on purpose' USING ERRCODE = '`+tc.sqlstate+`'; END $$;
				CREATE TRIGGER fail_on_purpose BEFORE INSERT ON attempt_outputs FOR EACH ROW EXECUTE FUNCTION fail_on_purpose()`); err != nil {
				t.Fatal(err)
			}
			acc, _, err := f.s.CompleteFinished(ctx, []Completion{ok(byName["a"], "out of a"), ok(byName["r"], "out of r")})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want an error: %v", err, tc.wantErr)
			}
			if want := []bool{true, false}; !reflect.DeepEqual(acc, want) {
				t.Errorf("accepted = %v, want %v", acc, want)
			}
			if out, err := outputBytesOf(f.s.Output(ctx, f.owner, plain, "a", "stdout")); err != nil || string(out) != "out of a" {
				t.Errorf("a's output = %q, %v", out, err)
			}
			if st := f.states(t, plain); st["a"] != StateDone {
				t.Errorf("a is %s, want done", st["a"])
			}
		})
	}
}

// plainAndReplica submits a workflow of one task "a" and one of a task "r"
// run by two replicas with a quorum of two, and claims a and the replica
// of r the fixture's worker may run, in that order. It returns a's
// workflow.
func (f *fixture) plainAndReplica(t *testing.T) (plain string, cs []Claimed) {
	t.Helper()
	plain = f.submit(t, "batch", f.task("a"))
	if _, err := f.s.CreateWorkflow(context.Background(), f.owner, &NewWorkflow{Name: "rep", Priority: "batch",
		Tasks: []NewTask{f.task("r")}, Replicas: 2, Quorum: 2, MaxReplicas: 3}); err != nil {
		t.Fatal(err)
	}
	cs = f.claim(t, 10, time.Minute)
	if len(cs) != 2 || cs[0].Name != "a" || cs[1].Name != "r" {
		t.Fatalf("claimed %+v, want a then a replica of r", cs)
	}
	return plain, cs
}

// A completion updates its attempts and tasks in place (HOT: no new index
// entries; nine in ten at least): no index of either table names a column the completion
// changes (migrations 00011 and 00012). An index on a state, as
// tasks_active and attempts_running were, fails this.
func TestCompletionUpdatesInPlace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	for _, n := range []int{smallWorkflow, 3 * smallWorkflow} { // both ways of writing tasks
		tasks := make([]NewTask, n)
		for i := range tasks {
			tasks[i] = f.task(fmt.Sprintf("t%d", i))
		}
		f.submit(t, "batch", tasks...)
		cs := f.claim(t, n, time.Minute)
		if len(cs) != n {
			t.Fatalf("%d claimed, want %d", len(cs), n)
		}
		slices.SortFunc(cs, func(a, b Claimed) int { return int(a.Attempt - b.Attempt) })
		attempts, workers, oks, logs, reasons := make([]int64, n), make([]string, n), make([]bool, n), make([][]byte, n), make([]string, n)
		states := make([]string, n)
		ids := make([]int64, n)
		for i, c := range cs {
			attempts[i], workers[i], oks[i], logs[i], states[i] = c.Attempt, c.Worker, true, []byte{}, "succeeded"
			ids[i] = c.TaskID
		}
		slices.Sort(ids)
		// The row versions the claim replaced go first, as pruning would
		// remove them on the way, but pruning skips a page another
		// process has pinned (under load it left no room, and 4 of 192
		// updates in place); an aggressive VACUUM waits for the pin.
		if _, err := f.s.pool.Exec(ctx, `VACUUM (FREEZE) tasks, attempts`); err != nil {
			t.Fatal(err)
		}
		tx, err := f.s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) // after a failure; the pool's Close waits for the connection
		if _, err := tx.Exec(ctx, hotPathSettingsSQL); err != nil {
			t.Fatal(err)
		}
		// This backend's counts not yet reported, before and after.
		counts := func(table string) (updated, hot int) {
			t.Helper()
			if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated($1::regclass),
				pg_stat_get_xact_tuples_hot_updated($1::regclass)`, table).Scan(&updated, &hot); err != nil {
				t.Fatal(err)
			}
			return updated, hot
		}
		for _, step := range []struct {
			table, sql string
			args       []any
		}{
			{"attempts", completeAttemptsSQL, []any{attempts, workers, oks, logs, reasons, states, make([]int64, n)}},
			{"tasks", doneSQL, []any{ids, int64(0), "cyclepool_test"}},
		} {
			updated0, hot0 := counts(step.table)
			if _, err := tx.Exec(ctx, step.sql, step.args...); err != nil {
				t.Fatal(err)
			}
			updated, hot := counts(step.table)
			// An ended attempt's row is a little longer than the running
			// one's, so a page full of them may lack room for its last few.
			if updated, hot = updated-updated0, hot-hot0; updated != n || hot < n*9/10 {
				t.Errorf("%d %s ended: %d rows updated, %d of them in place (HOT)", n, step.table, updated, hot)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The completions count the tasks they marked done and each worker's
// successes, on either path, and FlushTallies writes them once, even
// after a failed flush: Activity and WorkerTasks see them after it.
func TestCompletionsAreTallied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	few := f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"))
	var many []NewTask
	for i := range fastBatch + 2 {
		many = append(many, f.task(fmt.Sprintf("m%d", i)))
	}
	f.submit(t, "batch", many...)
	cs := f.claim(t, 3+len(many), time.Minute)
	if len(cs) != 3+len(many) {
		t.Fatalf("%d claimed", len(cs))
	}
	var fast, general []Completion
	for _, c := range cs {
		if c.WorkflowID == few {
			fast = append(fast, ok(c, "x"))
		} else {
			general = append(general, ok(c, "y"))
		}
	}
	general[0] = Completion{Attempt: general[0].Attempt, Worker: general[0].Worker, Reason: "exit", Message: "exit status 1"}
	for _, batch := range [][]Completion{fast, general} {
		if acc, err := f.s.Complete(ctx, batch); err != nil || slices.Contains(acc, false) {
			t.Fatalf("complete: %v %v", acc, err)
		}
	}
	want := int64(len(cs) - 1) // every success but the failure
	// A flush that fails keeps its counts for the next.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.s.FlushTallies(cancelled); err == nil {
		t.Fatal("a flush with a cancelled context succeeded")
	}
	for _, flush := range []int{1, 2} { // the second flush has nothing to add
		if err := f.s.FlushTallies(ctx); err != nil {
			t.Fatal(err)
		}
		wt, err := f.s.WorkerTasks(ctx, f.owner)
		if err != nil {
			t.Fatal(err)
		}
		act, err := f.s.Activity(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		done := int64(act[0].TasksDone + act[1].TasksDone) // the test may cross a minute
		if got := wt[f.worker].Succeeded; got != want || done != want {
			t.Errorf("flush %d: %d successes and %d tasks done counted, want %d of each", flush, got, done, want)
		}
	}
}

// An empty stdout is stored without a row (implied), through either
// completion path, and reads as an empty output everywhere: the status
// lists it with size 0, Output returns it, and a dependent gets it as an
// input and as stdin. Empty files keep their rows, and a task that is not
// done has no stdout.
func TestEmptyStdoutIsImplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		general bool // a failure in the batch takes the general path
	}{{"fast", false}, {"general", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			id := f.submit(t, "batch", f.task("a"), f.task("b"),
				f.task("c", NewInput{Name: "x", From: 0, Output: Stdout}, NewInput{Name: "", From: 0, Output: Stdout},
					NewInput{Name: "y", From: 0, Output: "empty.txt"}))
			cs := f.claim(t, 4, time.Minute)
			if len(cs) != 2 || cs[0].Name != "a" {
				t.Fatalf("claimed %+v, want a and b", cs)
			}
			a, b := cs[0], cs[1]
			comps := []Completion{{Attempt: a.Attempt, Worker: a.Worker, OK: true,
				Outputs: []Output{{Name: Stdout}, {Name: "empty.txt", Data: []byte{}}}}}
			if tc.general {
				comps = append(comps, Completion{Attempt: b.Attempt, Worker: b.Worker, Reason: "exit", Message: "exit status 1"})
			}
			if acc, err := f.s.Complete(ctx, comps); err != nil || !acc[0] {
				t.Fatalf("complete: %v %v", acc, err)
			}
			var rows []string
			r, err := f.s.pool.Query(ctx, `SELECT name FROM task_outputs WHERE task_id = $1 ORDER BY name`, a.TaskID)
			if err == nil {
				rows, err = pgx.CollectRows(r, pgx.RowTo[string])
			}
			if err != nil || !slices.Equal(rows, []string{"empty.txt"}) {
				t.Fatalf("rows of a's outputs = %v (%v), want empty.txt only", rows, err)
			}
			st, err := f.s.Status(ctx, f.owner, id)
			if err != nil {
				t.Fatal(err)
			}
			outs := map[string][]OutputInfo{}
			for _, ts := range st.Tasks {
				outs[ts.Name] = ts.Outputs
			}
			if want := []OutputInfo{{"empty.txt", 0}, {Stdout, 0}}; !slices.Equal(outs["a"], want) {
				t.Errorf("status lists a's outputs %v, want %v", outs["a"], want)
			}
			if len(outs["b"]) != 0 {
				t.Errorf("status lists outputs %v of b, which is not done", outs["b"])
			}
			if data, err := outputBytesOf(f.s.Output(ctx, f.owner, id, "a", Stdout)); err != nil || data == nil || len(data) != 0 {
				t.Errorf("Output(a, stdout) = %q, %v; want empty", data, err)
			}
			for _, tcase := range []struct{ task, output string }{{"a", "nope"}, {"b", Stdout}, {"c", Stdout}} {
				if _, err := outputBytesOf(f.s.Output(ctx, f.owner, id, tcase.task, tcase.output)); !errors.Is(err, ErrNotFound) {
					t.Errorf("Output(%s, %s): %v, want ErrNotFound", tcase.task, tcase.output, err)
				}
			}
			// (b, which failed, is claimed again in the general case.)
			c := slices.DeleteFunc(f.claim(t, 4, time.Minute), func(c Claimed) bool { return c.Name == "b" })
			if len(c) != 1 || c[0].Name != "c" {
				t.Fatalf("claimed %+v, want c", c)
			}
			if c[0].Missing != "" || c[0].Stdin == nil || len(c[0].Stdin) != 0 || len(c[0].Inputs) != 2 ||
				c[0].Inputs[0].Data == nil || len(c[0].Inputs[0].Data) != 0 || len(c[0].Inputs[1].Data) != 0 {
				t.Fatalf("c: inputs %+v, stdin %q, missing %q; want two empty inputs and an empty stdin", c[0].Inputs, c[0].Stdin, c[0].Missing)
			}
		})
	}
}
