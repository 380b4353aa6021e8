package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A replica says it is alive once for all its workers, whose rows it does
// not write: they count as seen when it was. When it falls silent, the
// leader marks them disconnected as of that moment; a worker whose replica
// has yet to say so, but that connected a moment ago, stays.
func TestReplicaVouchesForItsWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	register := func(replica string) string { return f.registerOn(t, replica) }
	alive, silent, never := register("alive"), register("silent"), register("never")
	for _, r := range []string{"alive", "silent"} {
		if err := f.s.TouchReplica(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// Two minutes pass: the workers' own rows are old, and "silent" said
	// nothing since; "alive" says it is alive now.
	if _, err := f.s.pool.Exec(ctx, `UPDATE workers SET last_seen = now() - interval '2 minutes', connected_at = now() - interval '2 minutes'`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `UPDATE replicas SET seen = now() - interval '90 seconds' WHERE name = 'silent'`); err != nil {
		t.Fatal(err)
	}
	if err := f.s.TouchReplica(ctx, "alive"); err != nil {
		t.Fatal(err)
	}
	fresh := register("never") // just connected, to a replica yet to say it is alive
	if err := f.s.ForgetReplicaWorkers(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	recs, err := f.s.Workers(ctx, []string{alive, silent, never, fresh})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{alive: true, silent: false, never: false, fresh: true}
	for _, r := range recs {
		if r.Connected != want[r.ID] {
			t.Errorf("worker of replica %q connected = %v, want %v", r.Replica, r.Connected, want[r.ID])
		}
		age := time.Since(r.LastSeen)
		switch r.ID {
		case alive:
			if age > 30*time.Second {
				t.Errorf("the worker of a replica alive now was last seen %v ago", age.Round(time.Second))
			}
		case silent:
			if age < 80*time.Second || age > 100*time.Second {
				t.Errorf("the worker of a replica silent for 90 s was last seen %v ago, want when its replica was", age.Round(time.Second))
			}
		}
	}
	var open int
	if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM worker_sessions WHERE disconnected_at IS NULL AND worker_id = ANY($1::uuid[])`,
		[]string{silent, never}).Scan(&open); err != nil || open != 0 {
		t.Errorf("%d sessions of forgotten workers still open (%v)", open, err)
	}
}

// A replica that died and came back under its name at once (its row says
// it is alive) still gives the workers of its previous process time to
// come back: they connected before its latest start. A worker that
// connected to the new process does not get that time.
func TestRestartedReplicasWorkersGetTimeToComeBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submit(t, "batch", f.task("a"), f.task("b"))
	old, oldAttempt := f.holdOn(t, "r")
	if _, err := f.s.pool.Exec(ctx, `UPDATE workers SET connected_at = now() - interval '1 minute' WHERE id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.s.StartReplica(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	_, newAttempt := f.holdOn(t, "r")
	if _, err := f.s.pool.Exec(ctx, `UPDATE attempts SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	res, err := f.s.SweepLeases(ctx, Sweep{Limit: 100, ReplicaSilence: 12 * time.Second, ReplicaGrace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Expired != 1 {
		t.Errorf("the sweep ended %d attempts, want 1: that of the worker connected to the new process", res.Expired)
	}
	states := f.attemptStates(t)
	if states[oldAttempt] != "running" || states[newAttempt] != "lost" {
		t.Errorf("attempts: previous process's worker %s, new process's worker %s; want running, lost", states[oldAttempt], states[newAttempt])
	}
	if n := f.tasksLost(t, old.ID); n != 0 {
		t.Errorf("the previous process's worker was charged %d losses", n)
	}
}

// The workers of a replica that died get time to come back to another
// before their attempts are lost: a lapsed lease of such a worker is left
// alone for ReplicaGrace, and the hello that brings the worker back (its
// attempts listed) renews it. A worker of a live replica, or one that
// stays away past the grace, loses its attempt as before.
func TestDeadReplicasWorkersGetTimeToComeBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"))
	type held struct {
		reg     Registration
		attempt int64
	}
	hold := func(replica string) held {
		t.Helper()
		reg, attempt := f.holdOn(t, replica)
		return held{reg, attempt}
	}
	back, away, live := hold("dead"), hold("dead"), hold("live")
	for _, r := range []string{"dead", "live"} {
		if err := f.s.TouchReplica(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// "dead" said it was alive 30 s ago; every lease lapsed a second ago,
	// but away's 3 minutes ago.
	for _, q := range []string{
		`UPDATE replicas SET seen = now() - interval '30 seconds' WHERE name = 'dead'`,
		`UPDATE attempts SET lease_until = now() - interval '1 second'`,
		`UPDATE attempts SET lease_until = now() - interval '3 minutes' WHERE id = ` + fmt.Sprint(away.attempt),
	} {
		if _, err := f.s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	sw := Sweep{Limit: 100, ReplicaSilence: 12 * time.Second, ReplicaGrace: time.Minute}
	res, err := f.s.SweepLeases(ctx, sw)
	if err != nil {
		t.Fatal(err)
	}
	if res.Expired != 2 {
		t.Errorf("the sweep ended %d attempts, want 2: the live replica's worker's and the one away past the grace", res.Expired)
	}
	// The worker that was left alone comes back to the live replica.
	reg, err := f.s.RegisterWorker(ctx, WorkerHello{ID: back.reg.ID, Token: back.reg.Token, Kind: "headless", Slots: 1,
		Replica: "live", Operator: true, Running: []int64{back.attempt}}, time.Minute)
	if err != nil || len(reg.Lost) != 0 {
		t.Fatalf("the returning worker's hello: lost %v, %v", reg.Lost, err)
	}
	states := f.attemptStates(t)
	want := map[int64]string{back.attempt: "running", away.attempt: "lost", live.attempt: "lost"}
	for id, st := range want {
		if states[id] != st {
			t.Errorf("attempt %d is %s, want %s (all: %v)", id, states[id], st, states)
		}
	}
	if n := f.tasksLost(t, back.reg.ID); n != 0 {
		t.Errorf("the worker that came back was charged %d losses", n)
	}
}

// A replica marks gone the workers recorded as connected to it that it does
// not hold (their end went unrecorded), but not one that connected a
// moment ago, nor those of other replicas. It marks connected again, with
// their connection's history row open, the workers it holds that the
// leader took for gone while it could not say it was alive
// (ForgetReplicaWorkers), but not one that has since connected elsewhere.
func TestReplicaReconcilesItsWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	register := func(replica string) Registration {
		reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 1, Replica: replica}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	held, ghost, other, forgotten, moved := register("r"), register("r"), register("elsewhere"), register("r"), register("r")
	// The replica r could not touch for two minutes: the leader marks its
	// workers gone (forgotten and moved; held and ghost are connected
	// again below, as the test's starting point).
	for _, sql := range []string{
		`UPDATE workers SET connected_at = now() - interval '2 minutes', last_seen = now() - interval '2 minutes'`,
		`INSERT INTO replicas (name, seen) VALUES ('r', now() - interval '2 minutes'), ('elsewhere', now())`,
	} {
		if _, err := f.s.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.ForgetReplicaWorkers(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `UPDATE workers SET connected = true WHERE id = ANY($1::uuid[])`, []string{held.ID, ghost.ID}); err != nil {
		t.Fatal(err)
	}
	// moved connected to another replica meanwhile (its hello there).
	if _, err := f.s.RegisterWorker(ctx, WorkerHello{ID: moved.ID, Token: moved.Token, Kind: "headless", Slots: 1, Replica: "elsewhere"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	fresh := register("r")
	hold := []Registration{held, forgotten, moved}
	var ids []string
	var sessions []int64
	for _, r := range hold {
		ids, sessions = append(ids, r.ID), append(sessions, r.Session)
	}
	if err := f.s.ReconcileWorkers(ctx, "r", ids, sessions); err != nil {
		t.Fatal(err)
	}
	all := []Registration{held, ghost, other, forgotten, moved, fresh}
	ids = nil
	for _, r := range all {
		ids = append(ids, r.ID)
	}
	recs, err := f.s.Workers(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{held.ID: true, ghost.ID: false, other.ID: true, forgotten.ID: true, moved.ID: true, fresh.ID: true}
	for _, r := range recs {
		if r.Connected != want[r.ID] {
			t.Errorf("worker %s of %q: connected = %v, want %v", r.ID[:8], r.Replica, r.Connected, want[r.ID])
		}
	}
	// Open connections in the history: one per connected worker, the
	// forgotten one's reopened, moved's only at its new replica.
	open := map[string]int64{}
	rows, err := f.s.pool.Query(ctx, `SELECT worker_id::text, id FROM worker_sessions WHERE disconnected_at IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	var w string
	var sess int64
	if _, err := pgx.ForEachRow(rows, []any{&w, &sess}, func() error {
		if _, dup := open[w]; dup {
			t.Errorf("worker %s has two open connections", w[:8])
		}
		open[w] = sess
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if open[forgotten.ID] != forgotten.Session {
		t.Errorf("the forgotten worker's open connection is %d, want its own %d reopened", open[forgotten.ID], forgotten.Session)
	}
	if s, ok := open[moved.ID]; !ok || s == moved.Session {
		t.Errorf("the moved worker's open connection is %d (%v), want its new one", s, ok)
	}
	if _, ok := open[ghost.ID]; ok {
		t.Error("the ghost has an open connection")
	}
}

// attemptStates returns the state of every attempt, by id.
func (f *fixture) attemptStates(t *testing.T) map[int64]string {
	t.Helper()
	return queryMap[int64, string](t, f.s, `SELECT id, state FROM attempts`)
}

// holdOn registers a new operator's worker connected to replica, makes it
// the fixture's worker and claims one attempt for it.
func (f *fixture) holdOn(t *testing.T, replica string) (Registration, int64) {
	t.Helper()
	reg, err := f.s.RegisterWorker(context.Background(), WorkerHello{Kind: "headless", Slots: 1, Replica: replica, Operator: true}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f.worker = reg.ID
	cs := f.claim(t, 1, time.Minute)
	if len(cs) != 1 {
		t.Fatalf("claimed %d attempts for the worker of %s", len(cs), replica)
	}
	return reg, cs[0].Attempt
}

// registerOn registers a new worker connected to replica and returns its id.
func (f *fixture) registerOn(t *testing.T, replica string) string {
	t.Helper()
	reg, err := f.s.RegisterWorker(context.Background(), WorkerHello{Kind: "headless", Slots: 1, Replica: replica}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return reg.ID
}

// RegisterWorkers registers a batch of hellos as RegisterWorker would one
// at a time: reconnections keep their identities and the attempts they
// still hold, a wrong token or none gets a new identity (if its address
// may make one), and a worker named twice in a batch is registered twice
// in order, its first connection's history row closed by the second.
func TestRegisterWorkersInABatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	back, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "browser", Slots: 2, Replica: "r"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f.worker = back.ID
	f.submit(t, "batch", f.task("held"), f.task("done"))
	cs := f.claim(t, 2, time.Minute)
	if len(cs) != 2 {
		t.Fatalf("%d claimed", len(cs))
	}
	if _, err := f.s.Complete(ctx, []Completion{ok(cs[1], "D")}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `UPDATE attempts SET lease_until = now() + interval '5 seconds' WHERE id = $1`, cs[0].Attempt); err != nil {
		t.Fatal(err)
	}
	hello := func(id, token string, running ...int64) WorkerHello {
		return WorkerHello{ID: id, Token: token, Kind: "browser", Slots: 2, Replica: "r", Device: map[string]any{"battery": 0.5}, Running: running}
	}
	refused := hello("", "")
	refused.AllowNew = func() bool { return false }
	hs := []WorkerHello{
		hello("", ""), // new
		hello(back.ID, back.Token, cs[0].Attempt, cs[1].Attempt), // back: one attempt held, one over
		hello(back.ID, "cw_wrong", cs[0].Attempt),                // a wrong token: a new identity, nothing held
		refused,
		hello(strings.ToUpper(back.ID), back.Token), // back again, on a second connection
	}
	regs, errs := f.s.RegisterWorkers(ctx, hs, time.Minute)
	for i, e := range errs {
		if (e != nil) != (i == 3) {
			t.Fatalf("hello %d: error %v", i, e)
		}
	}
	if !errors.Is(errs[3], ErrTooManyIdentities) {
		t.Errorf("a refused new identity: %v", errs[3])
	}
	if regs[1].ID != back.ID || regs[1].Token != back.Token || regs[4].ID != back.ID {
		t.Errorf("the reconnections got %s and %s, want %s", regs[1].ID, regs[4].ID, back.ID)
	}
	for _, i := range []int{0, 2} {
		if regs[i].ID == back.ID || regs[i].ID == "" || !strings.HasPrefix(regs[i].Token, "cw_") {
			t.Errorf("hello %d: id %q token %q, want a new identity", i, regs[i].ID, regs[i].Token)
		}
	}
	if regs[0].ID == regs[2].ID {
		t.Error("two new workers got one identity")
	}
	// Each registration comes with the worker's record.
	for i, want := range map[int]int64{0: 0, 1: 2, 2: 0, 4: 2} {
		if r := regs[i].Record; r.ID != regs[i].ID || !r.Connected || r.Attempts != want {
			t.Errorf("hello %d: record %+v, want worker %s connected with %d attempts", i, r, regs[i].ID, want)
		}
	}
	if m := regs[1].Kept; len(m) != 1 || m[cs[0].Attempt].Module != f.module || !slices.Equal(regs[1].Lost, []int64{cs[1].Attempt}) {
		t.Errorf("the reconnection kept %v and lost %v, want %d kept and %d lost", m, regs[1].Lost, cs[0].Attempt, cs[1].Attempt)
	}
	if len(regs[2].Kept) != 0 || !slices.Equal(regs[2].Lost, []int64{cs[0].Attempt}) {
		t.Errorf("a wrong token kept %v and lost %v, want nothing kept", regs[2].Kept, regs[2].Lost)
	}
	sessions := map[int64]bool{back.Session: true}
	for _, i := range []int{0, 1, 2, 4} {
		if sessions[regs[i].Session] || regs[i].Session == 0 {
			t.Errorf("hello %d: session %d, not a new one", i, regs[i].Session)
		}
		sessions[regs[i].Session] = true
	}
	var open []int64
	rows, err := f.s.pool.Query(ctx, `SELECT id FROM worker_sessions WHERE worker_id = $1 AND disconnected_at IS NULL`, back.ID)
	if err == nil {
		open, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil || !slices.Equal(open, []int64{regs[4].Session}) {
		t.Errorf("open sessions of the worker that came back twice: %v (%v), want only the last, %d", open, err, regs[4].Session)
	}
	recs, err := f.s.Workers(ctx, []string{regs[0].ID, back.ID, regs[2].ID})
	if err != nil || len(recs) != 3 {
		t.Fatalf("%d records (%v)", len(recs), err)
	}
	for _, r := range recs {
		if !r.Connected || r.Kind != "browser" || r.Replica != "r" {
			t.Errorf("record %+v", r)
		}
	}
	// A new connection with a proved identity renews what it holds.
	var lease time.Time
	if err := f.s.pool.QueryRow(ctx, `SELECT lease_until FROM attempts WHERE id = $1`, cs[0].Attempt).Scan(&lease); err != nil || time.Until(lease) < 30*time.Second {
		t.Errorf("the held attempt's lease ends in %v (%v), want about a minute", time.Until(lease).Round(time.Second), err)
	}
}

// A lone hello's registration reads the rows of its worker by key, not
// every worker's and every connection's, with statistics taken while the
// tables were empty (the volunteers of a project arrive within minutes,
// long before autovacuum analyzes their tables).
func TestRegistrationReadsByKeyWithStaleStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	const n = 3000
	hs := make([]WorkerHello, n)
	for i := range hs {
		hs[i] = WorkerHello{Kind: "browser", Slots: 1, Replica: "r"}
	}
	var regs []Registration
	// Analyzed when 30 workers were connected, among many connections
	// that ended; then the others come.
	for _, part := range [][]WorkerHello{hs[:30], hs[30:]} {
		rs, errs := f.s.RegisterWorkers(ctx, part, time.Minute)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("hello %d: %v", i, err)
			}
		}
		regs = append(regs, rs...)
		if len(regs) == 30 {
			// And after a day of connections that ended.
			if _, err := f.s.pool.Exec(ctx, `INSERT INTO worker_sessions (worker_id, connected_at, disconnected_at)
				SELECT gen_random_uuid(), now() - interval '2 hours', now() - interval '1 hour' FROM generate_series(1, 3000)`); err != nil {
				t.Fatal(err)
			}
			if _, err := f.s.pool.Exec(ctx, `ANALYZE workers, worker_sessions, attempts`); err != nil {
				t.Fatal(err)
			}
		}
	}
	one := regs[n/2]
	f.worker = one.ID
	f.submit(t, "batch", f.task("a"))
	cs := f.claim(t, 1, time.Minute)
	if len(cs) != 1 {
		t.Fatalf("%d claimed", len(cs))
	}
	dev := `{}`
	// Each statement reads its worker's rows by key whatever the join the
	// planner picks (nested loops off: the join PostgreSQL chose with the
	// statistics of a real run).
	for _, q := range []struct {
		name     string
		sql      string
		args     []any
		anyJoins bool
	}{
		{"reconnection", registerProvedSQL, []any{[]string{one.ID}, [][]byte{HashToken(one.Token)}, []string{"browser"}, []int32{1},
			[]string{""}, []string{dev}, []string{"r"}, []bool{false}, []string{""}, []bool{true}, int64(60000)}, true},
		{"history", registerSessionsSQL, []any{[]string{one.ID}}, true},
		{"record", workerRecordsSQL + ` WHERE w.id = ANY($1::uuid[])`, []any{[]string{one.ID}}, true},
		{"held attempts", renewHeldSQL, []any{[]int64{cs[0].Attempt}, []string{one.ID}, int64(60000), []bool{true}, int64(60000)}, false},
		{"gone", workerGoneSQL, []any{one.ID, one.Session, []int64{cs[0].Attempt}, int64(5000)}, false},
	} {
		for _, nestloop := range []bool{true, !q.anyJoins} {
			nl := map[bool]string{true: "on", false: "off"}[nestloop]
			plan := f.explainHot(t, q.sql, q.args, "enable_nestloop", nl)
			plan.walk(func(p *planNode) {
				switch p.Relation {
				case "workers", "worker_sessions", "attempts", "tasks":
					if p.NodeType == "Seq Scan" || (p.ActualRows+p.Removed)*p.ActualLoops > 2 {
						t.Errorf("%s (nested loops %v): %s on %s read %v rows over %v loops for one worker among %d", q.name, nestloop,
							p.NodeType, p.Relation, p.ActualRows+p.Removed, p.ActualLoops, n+1)
					}
				}
			})
		}
	}
}

// A hello whose texts PostgreSQL cannot store (a NUL character, bytes
// that are not UTF-8) fails alone: the others of its batch register.
func TestRegisterWorkersRefusesUnstorableHellosAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	good := WorkerHello{Kind: "browser", Slots: 1, Replica: "r", Device: map[string]any{"user_agent": "ok"}}
	nul, bad, dev := good, good, good
	nul.Volunteer = "v\x00"
	bad.Build = "\xff\xfe"
	dev.Device = map[string]any{"user_agent": "a\x00b"}
	regs, errs := f.s.RegisterWorkers(ctx, []WorkerHello{good, nul, good, bad, dev, good}, time.Minute)
	for i, err := range errs {
		refused := i == 1 || i == 3 || i == 4
		if (err != nil) != refused || (!refused && regs[i].Session == 0) {
			t.Errorf("hello %d: %+v, error %v; want refused %v", i, regs[i], err, refused)
		}
	}
	var n int
	if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM workers WHERE replica = 'r'`).Scan(&n); err != nil || n != 3 {
		t.Errorf("%d workers registered (%v), want the 3 good ones", n, err)
	}
}

// A batch that names a worker twice answers the hellos of its first
// transaction before it runs the second.
func TestRegisterWorkersEachAnswersEachTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	back, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "browser", Slots: 1}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	again := WorkerHello{ID: back.ID, Token: back.Token, Kind: "browser", Slots: 1}
	var order []int
	f.s.RegisterWorkersEach(ctx, []WorkerHello{again, again, {Kind: "browser", Slots: 1}, again}, time.Minute,
		func(i int, r Registration, err error) {
			if err != nil || r.Session == 0 {
				t.Errorf("hello %d: %+v, %v", i, r, err)
			}
			order = append(order, i)
		})
	if !slices.Equal(order, []int{0, 2, 1, 3}) {
		t.Errorf("answered in the order %v, want 0 and 2 (the first transaction), then 1, then 3", order)
	}
}

// waitForLockWaits waits until n of the database's backends wait for a
// lock.
func (f *fixture) waitForLockWaits(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var k int
		if err := f.s.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&k); err != nil {
			t.Fatal(err)
		}
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends wait for a lock, want %d", k, n)
		}
	}
}

// The end of a worker's old connection (on replica A), recorded while its
// new connection's hello (on B) holds the worker's row, sees the new
// connection: the worker stays connected, and the queued attempt the
// hello listed and kept is not ended as never started.
func TestWorkerGoneWaitsForARacingRegistration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submit(t, "batch", f.task("x"), f.task("q"))
	reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 1, Replica: "A"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f.worker = reg.ID
	cs := f.claim(t, 2, time.Minute)
	x, q := cs[0].Attempt, cs[1].Attempt
	// Hold the hello after it locked the worker's row: it waits for x's.
	lock, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `SELECT 1 FROM attempts WHERE id = $1 FOR UPDATE`, x); err != nil {
		t.Fatal(err)
	}
	type registered struct {
		reg Registration
		err error
	}
	hello := make(chan registered, 1)
	go func() {
		r, err := f.s.RegisterWorker(ctx, WorkerHello{ID: reg.ID, Token: reg.Token, Kind: "headless", Slots: 1, Replica: "B",
			Running: []int64{x, q}}, time.Minute)
		hello <- registered{r, err}
	}()
	f.waitForLockWaits(t, 1)
	type ended struct {
		n   int
		err error
	}
	gone := make(chan ended, 1)
	go func() {
		n, err := f.s.WorkerGone(ctx, Gone{Worker: reg.ID, Session: reg.Session, Unstarted: []int64{q}})
		gone <- ended{n, err}
	}()
	f.waitForLockWaits(t, 2)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h, g := <-hello, <-gone
	if h.err != nil || g.err != nil {
		t.Fatalf("hello: %v; old connection's end: %v", h.err, g.err)
	}
	if len(h.reg.Lost) != 0 {
		t.Fatalf("the hello lost %v", h.reg.Lost)
	}
	if g.n != 0 {
		t.Errorf("the old connection's end ended %d queued attempts, want 0", g.n)
	}
	recs, err := f.s.Workers(ctx, []string{reg.ID})
	if err != nil || len(recs) != 1 {
		t.Fatalf("worker records %v: %v", recs, err)
	}
	if !recs[0].Connected {
		t.Error("the worker is disconnected while its new connection is open")
	}
	if st := f.attemptStates(t); st[x] != "running" || st[q] != "running" {
		t.Errorf("attempts x and q are %s and %s, want running", st[x], st[q])
	}
}

// The end of a worker's last connection ends the leases of the attempts it
// may have been running within the grace, and its queued ones at once;
// a connection that is not its last changes nothing, a lease shorter than
// the grace stays as it was, and a worker that comes back after the cut
// renews the leases of the attempts it lists.
func TestWorkerGoneCutsTheLeasesOfWhatItMayHaveRun(t *testing.T) {
	t.Parallel()
	const lease, grace = time.Minute, 2 * time.Second
	for _, tc := range []struct {
		name string
		// claimLease is the lease the attempts were claimed with.
		claimLease time.Duration
		// newer: the worker reconnected before its old connection's end.
		newer bool
		// back: the worker reconnects after it, listing the attempt.
		back bool
		// wantCut: the running attempt's lease ends within the grace.
		wantCut, wantQueuedEnded bool
	}{
		{name: "last connection", claimLease: lease, wantCut: true, wantQueuedEnded: true},
		{name: "a newer connection is open", claimLease: lease, newer: true},
		{name: "lease shorter than the grace", claimLease: time.Second, wantQueuedEnded: true},
		{name: "back after the cut", claimLease: lease, back: true, wantCut: true, wantQueuedEnded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newFixture(t)
			f.submit(t, "batch", f.task("x"), f.task("q"))
			reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 1, Replica: "A"}, lease)
			if err != nil {
				t.Fatal(err)
			}
			f.worker = reg.ID
			cs := f.claim(t, 2, tc.claimLease)
			if len(cs) != 2 {
				t.Fatalf("%d claimed, want 2", len(cs))
			}
			x, q := cs[0].Attempt, cs[1].Attempt
			leaseLeft := func() time.Duration {
				t.Helper()
				var ms float64
				if err := f.s.pool.QueryRow(ctx, `SELECT extract(epoch FROM lease_until - now()) * 1000 FROM attempts WHERE id = $1`, x).Scan(&ms); err != nil {
					t.Fatal(err)
				}
				return time.Duration(ms) * time.Millisecond
			}
			before := leaseLeft()
			if tc.newer {
				if _, err := f.s.RegisterWorker(ctx, WorkerHello{ID: reg.ID, Token: reg.Token, Kind: "headless", Slots: 1, Replica: "B",
					Running: []int64{x, q}}, lease); err != nil {
					t.Fatal(err)
				}
			}
			n, err := f.s.WorkerGone(ctx, Gone{Worker: reg.ID, Session: reg.Session, Unstarted: []int64{q}, MayHaveRun: []int64{x}, Grace: grace})
			if err != nil {
				t.Fatal(err)
			}
			if got := n == 1; got != tc.wantQueuedEnded {
				t.Errorf("%d queued attempts ended, want the queued one ended: %v", n, tc.wantQueuedEnded)
			}
			left := leaseLeft()
			switch {
			case tc.wantCut && left > grace:
				t.Errorf("the running attempt's lease ends in %v, want at most the grace (%v)", left, grace)
			case !tc.wantCut && left < before-grace:
				t.Errorf("the running attempt's lease ends in %v, %v before the connection ended: want it untouched", left, before)
			case !tc.newer && left > before: // a newer connection's hello renewed it
				t.Errorf("the running attempt's lease ends in %v, later than before the connection ended (%v)", left, before)
			}
			if st := f.attemptStates(t)[x]; st != "running" {
				t.Errorf("the attempt that may have run is %s, want running until its lease lapses", st)
			}
			if tc.back {
				if _, err := f.s.RegisterWorker(ctx, WorkerHello{ID: reg.ID, Token: reg.Token, Kind: "headless", Slots: 1, Replica: "B",
					Running: []int64{x}}, lease); err != nil {
					t.Fatal(err)
				}
				if left := leaseLeft(); left <= grace {
					t.Errorf("after the worker came back listing it, the attempt's lease ends in %v, want renewed (%v)", left, lease)
				}
			}
		})
	}
}
