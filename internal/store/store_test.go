package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fixture is a fresh database with one owner, one module and one worker.
type fixture struct {
	s      *Store
	owner  int64
	module string
	worker string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureAt(t, migratedURL(t))
}

// migratedURL is the URL of a fresh database with every migration applied:
// a copy of a template migrated once per test binary.
func migratedURL(t testing.TB) string {
	t.Helper()
	return pgtest.Template(t, "store", func(ctx context.Context, url string) error {
		s, err := Open(ctx, url)
		if err != nil {
			return err
		}
		s.Close()
		return nil
	})
}

// closeStore closes s, and fails the test, rather than hang the package,
// when its pool cannot close: a connection acquired and never released
// (pgxpool.Close waits for every connection). Once, a full run hung there
// for minutes in one test's cleanup, with no goroutine left holding one.
func closeStore(t testing.TB, s *Store) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Close()
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Errorf("the store did not close: %d of its pool's connections are still acquired (one was never released)",
			s.pool.Stat().AcquiredConns())
	}
}

// newFixtureAt is newFixture on the database at url, its store opened
// with opts.
func newFixtureAt(t testing.TB, url string, opts ...Option) *fixture {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(t, s) })
	tok, err := s.CreateOwner(ctx, "owner")
	if err != nil {
		t.Fatal(err)
	}
	o, err := s.OwnerByToken(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	mod := "sha256:" + fmt.Sprintf("%064x", 1)
	if _, _, err := s.PutModule(ctx, o.ID, 1<<30, mod, []byte("\x00asm"), []string{}); err != nil {
		t.Fatal(err)
	}
	// One of the operator's workers: a task goes back to it after it
	// failed or lost it (fixture.useWorker registers volunteers).
	reg, err := s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 4, Operator: true}, time.Minute)
	w := reg.ID
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{s: s, owner: o.ID, module: mod, worker: w}
}

// otherOwner creates a second owner and returns its id.
func (f *fixture) otherOwner(t *testing.T, name string) int64 {
	t.Helper()
	ctx := context.Background()
	tok, err := f.s.CreateOwner(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.s.OwnerByToken(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	return o.ID
}

func (f *fixture) task(name string, inputs ...NewInput) NewTask {
	return NewTask{Name: name, Module: f.module, Inputs: inputs, MaxAttempts: 2, TimeoutMS: 1000, MemoryPages: 16,
		OutputBytes: 1 << 20, LogBytes: 1 << 10}
}

func (f *fixture) submit(t testing.TB, priority string, tasks ...NewTask) string {
	t.Helper()
	id, err := f.s.CreateWorkflow(context.Background(), f.owner, &NewWorkflow{Name: "wf", Priority: priority, Tasks: tasks})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// claim claims up to n ready tasks for the fixture's worker, in dispatch
// order, the way the server does (Candidates, then ClaimPicks).
func (f *fixture) claim(t testing.TB, n int, lease time.Duration) []Claimed {
	t.Helper()
	ctx := context.Background()
	cands, _, err := f.s.Candidates(ctx, n, nil)
	if err != nil {
		t.Fatal(err)
	}
	var picks []Pick
	for _, c := range cands[:min(n, len(cands))] {
		picks = append(picks, Pick{TaskID: c.TaskID, Worker: f.worker})
	}
	if len(picks) == 0 {
		return nil
	}
	cs, err := f.s.ClaimPicks(ctx, picks, lease)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func (f *fixture) states(t testing.TB, id string) map[string]string {
	t.Helper()
	st, err := f.s.Status(context.Background(), f.owner, id)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{"": st.State}
	for _, tk := range st.Tasks {
		m[tk.Name] = tk.State
	}
	return m
}

// claimedByName indexes claimed attempts by their task's name.
func claimedByName(cs []Claimed) map[string]Claimed {
	m := make(map[string]Claimed, len(cs))
	for _, c := range cs {
		m[c.Name] = c
	}
	return m
}

func ok(c Claimed, out string) Completion {
	return Completion{Attempt: c.Attempt, Worker: c.Worker, OK: true, Outputs: []Output{{Name: "stdout", Data: []byte(out)}}}
}

// A task runs only when every task it takes input from is done, and sees
// their outputs under the names it gave them.
func TestDependentsBecomeReadyWithTheirInputs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b"),
		f.task("c", NewInput{Name: "x", From: 0, Output: "stdout"}, NewInput{Name: "y", From: 1, Output: "stdout"}, NewInput{Name: "", From: 0, Output: "stdout"}))
	cs := f.claim(t, 4, time.Minute)
	if len(cs) != 2 {
		t.Fatalf("claimed %d tasks, want a and b only", len(cs))
	}
	if acc, err := f.s.Complete(ctx, []Completion{ok(cs[0], "A")}); err != nil || !acc[0] {
		t.Fatalf("complete a: %v %v", acc, err)
	}
	if got := f.claim(t, 4, time.Minute); len(got) != 0 {
		t.Fatalf("c claimed before b was done")
	}
	if _, err := f.s.Complete(ctx, []Completion{ok(cs[1], "B")}); err != nil {
		t.Fatal(err)
	}
	c := f.claim(t, 4, time.Minute)
	if len(c) != 1 || c[0].Name != "c" {
		t.Fatalf("claimed %+v, want c", c)
	}
	if len(c[0].Inputs) != 2 || c[0].Inputs[0].Name != "x" || string(c[0].Inputs[0].Data) != "A" || string(c[0].Inputs[1].Data) != "B" || string(c[0].Stdin) != "A" {
		t.Fatalf("inputs of c = %+v, stdin %q", c[0].Inputs, c[0].Stdin)
	}
	if _, err := f.s.Complete(ctx, []Completion{ok(c[0], "C")}); err != nil {
		t.Fatal(err)
	}
	if st := f.states(t, id); st[""] != "done" {
		t.Fatalf("workflow %v", st)
	}
}

// Interactive work goes first; batch work that has waited longer than the
// head start goes before it (ageing).
func TestPriorityAndAgeing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	batch := f.submit(t, "batch", f.task("b"))
	inter := f.submit(t, "interactive", f.task("i"))
	cs := f.claim(t, 1, time.Minute)
	if len(cs) != 1 || cs[0].WorkflowID != inter {
		t.Fatalf("first claim went to %+v, want the interactive task", cs)
	}
	// Age the batch task past the head start.
	if _, err := f.s.pool.Exec(ctx, `UPDATE tasks SET sort_key = sort_key - interval '10 minutes' WHERE workflow_id = $1`, batch); err != nil {
		t.Fatal(err)
	}
	f.submit(t, "interactive", f.task("i2"))
	cs = f.claim(t, 1, time.Minute)
	if len(cs) != 1 || cs[0].WorkflowID != batch {
		t.Fatalf("aged batch task not first: %+v", cs)
	}
}

// A completion from an attempt that no longer holds its lease is refused;
// the task runs again from its latest checkpoint and ends with exactly one
// result.
func TestFencingAndResumeAfterLostLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"))
	first := f.claim(t, 1, 50*time.Millisecond)[0]
	if saved, err := f.s.SaveCheckpoint(ctx, first.Attempt, first.Worker, []byte("state-1"), 50*time.Millisecond); err != nil || !saved {
		t.Fatalf("checkpoint: %v %v", saved, err)
	}
	time.Sleep(100 * time.Millisecond)
	if n, err := f.s.ExpireLeases(ctx, 100); err != nil || n != 1 {
		t.Fatalf("expired %d: %v", n, err)
	}
	if saved, _ := f.s.SaveCheckpoint(ctx, first.Attempt, first.Worker, []byte("late"), time.Minute); saved {
		t.Fatal("a lost attempt saved a checkpoint")
	}
	second := f.claim(t, 1, time.Minute)
	if len(second) != 1 || string(second[0].Restore) != "state-1" {
		t.Fatalf("second attempt %+v does not restore the checkpoint", second)
	}
	acc, err := f.s.Complete(ctx, []Completion{ok(first, "stale"), ok(second[0], "fresh")})
	if err != nil {
		t.Fatal(err)
	}
	if acc[0] || !acc[1] {
		t.Fatalf("accepted = %v, want stale refused and fresh accepted", acc)
	}
	if again, _ := f.s.Complete(ctx, []Completion{ok(second[0], "twice")}); again[0] {
		t.Fatal("a second result for the same attempt was accepted")
	}
	out, err := outputBytesOf(f.s.Output(ctx, f.owner, id, "a", "stdout"))
	if err != nil || string(out) != "fresh" {
		t.Fatalf("output = %q, %v", out, err)
	}
}

// A task that fails max_attempts times ends failed with its reasons, its
// descendants end upstream_failed, the workflow fails; an uncounted failure
// (the volunteer paused) does not use up an attempt.
func TestFailuresEndTheWorkflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b", NewInput{Name: "x", From: 0, Output: "stdout"}),
		f.task("c", NewInput{Name: "x", From: 1, Output: "stdout"}), f.task("d"))
	cs := f.claim(t, 2, time.Minute)
	byName := claimedByName(cs)
	if _, err := f.s.Complete(ctx, []Completion{
		{Attempt: byName["a"].Attempt, Worker: f.worker, Reason: "worker", Message: "paused", End: EndHandedBack},
		ok(byName["d"], "D"),
	}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		a := f.claim(t, 1, time.Minute)
		if len(a) != 1 {
			t.Fatalf("a not requeued")
		}
		if _, err := f.s.Complete(ctx, []Completion{{Attempt: a[0].Attempt, Worker: f.worker, Reason: "exit", Message: "exit code 3"}}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := f.s.Status(ctx, f.owner, id)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "failed", "b": "upstream_failed", "c": "upstream_failed", "d": "done"}
	for _, tk := range st.Tasks {
		if tk.State != want[tk.Name] {
			t.Errorf("task %s is %s, want %s", tk.Name, tk.State, want[tk.Name])
		}
		if tk.Name == "a" && (tk.Attempts != 2 || tk.Error == "") {
			t.Errorf("task a: %d attempts, error %q", tk.Attempts, tk.Error)
		}
	}
	if st.State != "failed" {
		t.Errorf("workflow is %s, want failed", st.State)
	}
}

// Cancel ends the unfinished tasks and returns the running attempts, whose
// results are refused afterwards.
func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b", NewInput{Name: "x", From: 0, Output: "stdout"}))
	a := f.claim(t, 1, time.Minute)[0]
	attempts, err := f.s.Cancel(ctx, f.owner, id)
	if err != nil || len(attempts) != 1 || attempts[0] != a.Attempt {
		t.Fatalf("cancel returned %v, %v", attempts, err)
	}
	if acc, _ := f.s.Complete(ctx, []Completion{ok(a, "late")}); acc[0] {
		t.Fatal("a cancelled attempt's result was accepted")
	}
	st := f.states(t, id)
	if st[""] != "cancelled" || st["a"] != "cancelled" || st["b"] != "cancelled" {
		t.Fatalf("after cancel: %v", st)
	}
	if _, err := f.s.Cancel(ctx, f.owner+1, id); err != ErrNotFound {
		t.Fatalf("another owner's cancel: %v", err)
	}
}

// BenchmarkClaimComplete measures the store alone: claim and complete
// no-op tasks in batches of 100.
func BenchmarkClaimComplete(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b)
	tasks := make([]NewTask, b.N)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	f.submit(b, "batch", tasks...)
	b.ResetTimer()
	for done := 0; done < b.N; {
		cs := f.claim(b, min(100, b.N-done), time.Minute)
		comps := make([]Completion, len(cs))
		for i, c := range cs {
			comps[i] = ok(c, "")
		}
		if _, err := f.s.Complete(ctx, comps); err != nil {
			b.Fatal(err)
		}
		done += len(cs)
	}
}

// A worker may send anything: a batch holding a repeated attempt, repeated
// output names or text PostgreSQL cannot store refuses those items alone and
// commits the others. The result with repeated output names ends its
// attempt as refused (the task queued again), saying why.
func TestBadCompletionsAreRefusedAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"), f.task("d"))
	cs := f.claim(t, 4, time.Minute)
	byName := claimedByName(cs)
	batch := []Completion{
		ok(byName["a"], "A"),
		ok(byName["a"], "again"), // the same attempt twice
		{Attempt: byName["b"].Attempt, Worker: f.worker, OK: true, Outputs: []Output{{Name: "x", Data: []byte("1")}, {Name: "x", Data: []byte("2")}}},
		{Attempt: byName["c"].Attempt, Worker: f.worker, Reason: "exit", Message: "bad \x00 text \xff"},
		ok(byName["d"], "D"),
	}
	acc, err := f.s.Complete(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, true, true, true}; fmt.Sprint(acc) != fmt.Sprint(want) {
		t.Fatalf("accepted = %v, want %v", acc, want)
	}
	if !strings.Contains(batch[2].Refused, `output "x" appears twice`) {
		t.Errorf("b's result refused with %q", batch[2].Refused)
	}
	if out, _ := outputBytesOf(f.s.Output(ctx, f.owner, id, "a", "stdout")); string(out) != "A" {
		t.Errorf("a's output = %q", out)
	}
	if st := f.states(t, id); st["b"] != "ready" || st["c"] != "ready" || st["d"] != "done" {
		t.Errorf("states after the batch: %v", st)
	}
}

// Cancelling a workflow that has just finished leaves it finished.
func TestCancelAfterDoneChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"))
	if _, err := f.s.Complete(ctx, []Completion{ok(f.claim(t, 1, time.Minute)[0], "A")}); err != nil {
		t.Fatal(err)
	}
	if attempts, err := f.s.Cancel(ctx, f.owner, id); err != nil || len(attempts) != 0 {
		t.Fatalf("cancel: %v %v", attempts, err)
	}
	if st := f.states(t, id); st[""] != "done" || st["a"] != "done" {
		t.Fatalf("after cancel: %v", st)
	}
}

// The hot path's transactions run with their settings: sequential scans
// off, generic plans, and for the claim an asynchronous commit; the
// settings end with the transaction.
func TestHotPathTransactionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	for _, async := range []bool{false, true} {
		b := &pgx.Batch{}
		queueBegin(b, async)
		b.Queue(`SELECT current_setting('enable_seqscan') || ' ' || current_setting('plan_cache_mode') || ' ' || current_setting('synchronous_commit')`)
		b.Queue("COMMIT")
		conn, err := f.s.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The test cluster commits asynchronously: this session does not.
		if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
			t.Fatal(err)
		}
		base := "auto on"
		br := conn.SendBatch(ctx, b)
		var got string
		if err := execBegin(br); err != nil {
			t.Fatal(err)
		}
		if err := br.QueryRow().Scan(&got); err != nil {
			t.Fatal(err)
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		want := "off force_generic_plan on"
		if async {
			want = "off force_generic_plan off"
		}
		if got != want {
			t.Errorf("async %v: settings %q, want %q", async, got, want)
		}
		var after string
		if err := conn.QueryRow(ctx, `SELECT current_setting('plan_cache_mode') || ' ' || current_setting('synchronous_commit')`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `RESET synchronous_commit`); err != nil {
			t.Fatal(err)
		}
		conn.Release()
		if after != base {
			t.Errorf("after the transaction: %q, want %q as before it", after, base)
		}
	}
}

// The general completion path and the lease reaper run with queueBegin's
// settings (no sequential scans, generic plans), on which their statements'
// plans depend when the statistics are stale
// (TestCompletionReadsRowsInProportionToItsBatch). A trigger records the
// settings in force whenever tasks are updated.
func TestRequeuesRunWithTheHotPathSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := f.s.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TABLE seen_settings (what text)`)
	exec(`CREATE FUNCTION record_settings() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO seen_settings VALUES (current_setting('enable_seqscan') || ' ' || current_setting('plan_cache_mode'));
			RETURN NULL;
		END $$`)
	exec(`CREATE TRIGGER record_settings AFTER UPDATE ON tasks FOR EACH STATEMENT EXECUTE FUNCTION record_settings()`)
	f.submit(t, "batch", f.task("a"), f.task("b"))
	cl := f.claim(t, 2, time.Minute)
	if len(cl) != 2 {
		t.Fatalf("claimed %d", len(cl))
	}
	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"a failure (completeOnce)", func() error {
			_, err := f.s.Complete(ctx, []Completion{{Attempt: cl[0].Attempt, Worker: f.worker, Reason: "exit", Message: "status 1"}})
			return err
		}},
		{"a lapsed lease (ExpireLeases)", func() error {
			exec(`UPDATE attempts SET lease_until = now() - interval '1 second' WHERE id = $1`, cl[1].Attempt)
			n, err := f.s.ExpireLeases(ctx, 10)
			if err == nil && n != 1 {
				err = fmt.Errorf("%d leases expired, want 1", n)
			}
			return err
		}},
	} {
		exec(`DELETE FROM seen_settings`)
		if err := step.run(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		seen := queryRows(t, f.s, `SELECT what FROM seen_settings`)
		if len(seen) == 0 {
			t.Fatalf("%s updated no task", step.name)
		}
		for _, s := range seen {
			if s != "off force_generic_plan" {
				t.Errorf("%s: tasks updated with settings %s, want off force_generic_plan", step.name, s)
			}
		}
	}
}

// A uuid[] parameter reaches PostgreSQL as the ids it was made of, each
// run of one id included, and NULL for what is not a UUID.
func TestUUIDParamsReachPostgreSQL(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := "0b7c7a5e-4a3b-4c1a-9d7e-1b2c3d4e5f60", "1c8d8b6f-5b4c-4d2b-8e8f-2c3d4e5f6071"
	ids := []string{a, a, "bad", "bad", b, "", a}
	var got []*string
	if err := f.s.pool.QueryRow(context.Background(), "SELECT $1::uuid[]::text[]", uuidParams(ids)).Scan(&got); err != nil {
		t.Fatal(err)
	}
	want := []string{a, a, "NULL", "NULL", b, "NULL", a}
	if len(got) != len(want) {
		t.Fatalf("got %d ids, want %d", len(got), len(want))
	}
	for i, g := range got {
		s := "NULL"
		if g != nil {
			s = *g
		}
		if s != want[i] {
			t.Errorf("id %d (%q): got %s, want %s", i, ids[i], s, want[i])
		}
	}
}

// uuidParams passes UUIDs through and makes anything else NULL.
func TestUUIDParams(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		valid bool
	}{
		{"0b7c7a5e-4a3b-4c1a-9d7e-1b2c3d4e5f60", true},
		{"0B7C7A5E-4A3B-4C1A-9D7E-1B2C3D4E5F60", true},
		{"0b7c7a5e4a3b4c1a9d7e1b2c3d4e5f60", true},
		{"", false},
		{"not a uuid", false},
		{"0b7c7a5e-4a3b-4c1a-9d7e-1b2c3d4e5f6", false},
	} {
		got := uuidParams([]string{tc.in})[0]
		if got.Valid != tc.valid {
			t.Errorf("%q: valid %v, want %v", tc.in, got.Valid, tc.valid)
		}
		if tc.valid && !strings.EqualFold(strings.ReplaceAll(got.String(), "-", ""), strings.ReplaceAll(tc.in, "-", "")) {
			t.Errorf("%q: became %s", tc.in, got.String())
		}
	}
}

// outputBytesOf drops the blob id of Output's answer, for tests of inline
// outputs.
func outputBytesOf(data []byte, _ string, err error) ([]byte, error) { return data, err }
