package store

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// taskCounts reads what a task has been charged.
func (f *fixture) taskCounts(t *testing.T, id, name string) (state string, attempts, lost int, errText string) {
	t.Helper()
	if err := f.s.pool.QueryRow(context.Background(), `SELECT state, attempts, lost, error FROM tasks WHERE workflow_id = $1 AND name = $2`,
		id, name).Scan(&state, &attempts, &lost, &errText); err != nil {
		t.Fatal(err)
	}
	return state, attempts, lost, errText
}

// tasksLost reads the losses counted against a worker's standing.
func (f *fixture) tasksLost(t *testing.T, worker string) int {
	t.Helper()
	var n int
	if err := f.s.pool.QueryRow(context.Background(), `SELECT tasks_lost FROM workers WHERE id = $1`, worker).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// useWorker registers a new volunteer of slots slots, which the fixture's
// claims go to from now on.
func (f *fixture) useWorker(t *testing.T, slots int) Registration {
	t.Helper()
	reg, err := f.s.RegisterWorker(context.Background(), WorkerHello{Kind: "headless", Slots: slots}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f.worker = reg.ID
	return reg
}

// expire makes an attempt's lease lapse and sweeps.
func (f *fixture) expire(t *testing.T, c Claimed) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.s.pool.Exec(ctx, `UPDATE attempts SET lease_until = now() - interval '1 second' WHERE id = $1`, c.Attempt); err != nil {
		t.Fatal(err)
	}
	if n, err := f.s.ExpireLeases(ctx, 100); err != nil || n != 1 {
		t.Fatalf("expired %d: %v", n, err)
	}
}

// Each way an attempt ends charges whom Ending.Charges says, and nobody
// else: the task's attempts, its losses, the worker's standing, and the
// task's place in the queue.
func TestEachEndingChargesWhomItSays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type want struct {
		state    string
		attempts int // counted towards max_attempts
		lost     int
		workerLo int
		first    bool // the task is first in the queue again, ahead of one that became ready after it
	}
	fail := func(e Ending) func(*fixture, *testing.T, Claimed) {
		return func(f *fixture, t *testing.T, c Claimed) {
			if acc, err := f.s.Complete(ctx, []Completion{{Attempt: c.Attempt, Worker: c.Worker, Reason: "r", End: e}}); err != nil || !acc[0] {
				t.Fatalf("complete: %v %v", acc, err)
			}
		}
	}
	for _, tc := range []struct {
		name string
		end  func(*fixture, *testing.T, Claimed)
		want want
	}{
		{"task error", fail(EndTaskError), want{"ready", 1, 0, 0, true}},
		{"task cannot succeed", fail(EndTaskFinal), want{"failed", 1, 0, 0, false}},
		{"handed back", fail(EndHandedBack), want{"ready", 0, 0, 0, true}},
		{"never started", fail(EndUnstarted), want{"ready", 0, 0, 0, true}},
		{"server fault", fail(EndServerFault), want{"ready", 0, 0, 0, true}},
		{"worker vanished", func(f *fixture, t *testing.T, c Claimed) { f.expire(t, c) }, want{"ready", 0, 1, 1, true}},
		{"crashed", fail(EndCrashed), want{"ready", 0, 1, 0, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			id := f.submit(t, "batch", f.task("a"))
			c := f.claim(t, 1, time.Minute)[0]
			later := f.submit(t, "batch", f.task("b")) // ready after a
			tc.end(f, t, c)
			state, attempts, lost, _ := f.taskCounts(t, id, "a")
			if state != tc.want.state || attempts != tc.want.attempts || lost != tc.want.lost {
				t.Errorf("task is %s with %d attempts and %d losses counted, want %s, %d and %d",
					state, attempts, lost, tc.want.state, tc.want.attempts, tc.want.lost)
			}
			if n := f.tasksLost(t, f.worker); n != tc.want.workerLo {
				t.Errorf("worker charged %d losses, want %d", n, tc.want.workerLo)
			}
			if state != "ready" {
				return
			}
			cands, _, err := f.s.Candidates(ctx, 10, nil)
			if err != nil || len(cands) != 2 {
				t.Fatalf("candidates %+v, %v", cands, err)
			}
			if first := cands[0].WorkflowID == id; first != tc.want.first {
				t.Errorf("task a first in the queue: %v, want %v (b is %s)", first, tc.want.first, later)
			}
		})
	}
}

// A task whose workers keep vanishing, or whose runs keep crashing them
// (reason crashed: the worker survives to say so), is never failed by
// max_attempts (1 here), only by the separate bound max_lost, with a
// message that says so. Only a worker that vanished is charged a loss.
func TestLostWorkersUseMaxLostNotMaxAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		lose    func(f *fixture, t *testing.T, c Claimed)
		charged int
	}{
		{"vanished", func(f *fixture, t *testing.T, c Claimed) { f.expire(t, c) }, 1},
		{"crashed", func(f *fixture, t *testing.T, c Claimed) {
			if acc, err := f.s.Complete(ctx, []Completion{{Attempt: c.Attempt, Worker: c.Worker, Reason: "crashed",
				Message: "the slot process running the attempt died: killed", End: EndCrashed}}); err != nil || !acc[0] {
				t.Fatalf("complete: %v %v", acc, err)
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			one := f.task("a")
			one.MaxAttempts = 1
			id := f.submit(t, "batch", one)
			var workers []string
			for i := 1; i <= DefaultMaxLost; i++ {
				// A new volunteer each time: the task avoids those that lost it.
				workers = append(workers, f.useWorker(t, 1).ID)
				c := f.claim(t, 1, time.Minute)
				if len(c) != 1 {
					t.Fatalf("loss %d: the task was not queued again", i)
				}
				tc.lose(f, t, c[0])
				state, attempts, lost, errText := f.taskCounts(t, id, "a")
				if lost != i || attempts != 0 {
					t.Fatalf("after %d losses: %d attempts and %d losses counted", i, attempts, lost)
				}
				if i < DefaultMaxLost && state != "ready" {
					t.Fatalf("after %d losses the task is %s (%s)", i, state, errText)
				}
				if i == DefaultMaxLost && (state != "failed" || !strings.Contains(errText, "vanished or crashed 10 times (max_lost)")) {
					t.Fatalf("after %d losses the task is %s: %q", i, state, errText)
				}
			}
			for _, w := range workers {
				if n := f.tasksLost(t, w); n != tc.charged {
					t.Errorf("worker %s charged %d losses, want %d", w, n, tc.charged)
				}
			}
		})
	}
}

// A sweep that comes long after the previous one renews the running leases
// instead of expiring them: they lapsed while no replica could sweep.
func TestSweepAfterAGapRenewsLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"))
	f.claim(t, 1, time.Minute)
	sw := Sweep{Limit: 100, Gap: time.Minute, Lease: time.Minute}
	if _, err := f.s.SweepLeases(ctx, sw); err != nil { // the sweep before the gap
		t.Fatal(err)
	}
	for _, q := range []string{`UPDATE attempts SET lease_until = now() - interval '1 second'`, `UPDATE lease_sweeps SET at = now() - interval '2 minutes'`} {
		if _, err := f.s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	res, err := f.s.SweepLeases(ctx, sw)
	if err != nil {
		t.Fatal(err)
	}
	if res.Expired != 0 || res.Renewed != 1 || res.Since < 2*time.Minute {
		t.Fatalf("sweep after a gap: %+v, want 1 lease renewed and none expired", res)
	}
	if state, attempts, lost, _ := f.taskCounts(t, id, "a"); state != "running" || attempts != 1 || lost != 0 {
		t.Fatalf("task is %s with %d attempts and %d losses", state, attempts, lost)
	}
	// The next sweep comes without a gap: leases that lapse now expire.
	if _, err := f.s.pool.Exec(ctx, `UPDATE attempts SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if res, err := f.s.SweepLeases(ctx, sw); err != nil || res.Expired != 1 {
		t.Fatalf("sweep without a gap: %+v, %v", res, err)
	}
}

// A worker that leaves gives back at once the attempts it held in its
// queue, charged to nobody; not while it has a newer connection.
func TestWorkerGoneReturnsItsQueuedAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"))
	reg := f.useWorker(t, 1)
	cs := claimedByName(f.claim(t, 3, time.Minute))
	// A newer connection holds them: nothing goes back.
	newer, err := f.s.RegisterWorker(ctx, WorkerHello{ID: f.worker, Token: reg.Token, Kind: "headless", Slots: 1}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.s.WorkerGone(ctx, Gone{Worker: f.worker, Session: reg.Session, Unstarted: []int64{cs["b"].Attempt, cs["c"].Attempt}}); err != nil || n != 0 {
		t.Fatalf("an old connection's end returned %d attempts (%v) while a newer one holds them", n, err)
	}
	if n, err := f.s.WorkerGone(ctx, Gone{Worker: f.worker, Session: newer.Session, Unstarted: []int64{cs["b"].Attempt, cs["c"].Attempt}}); err != nil || n != 2 {
		t.Fatalf("returned %d attempts: %v", n, err)
	}
	for name, want := range map[string]string{"a": "running", "b": "ready", "c": "ready"} {
		state, attempts, lost, _ := f.taskCounts(t, id, name)
		if state != want || lost != 0 || (want == "ready" && attempts != 0) {
			t.Errorf("task %s is %s with %d attempts and %d losses", name, state, attempts, lost)
		}
	}
	// The attempts themselves say the worker went away: lost, not failed.
	var states []string
	if err := f.s.pool.QueryRow(ctx, `SELECT array_agg(state ORDER BY id) FROM attempts WHERE id = ANY($1)`,
		[]int64{cs["b"].Attempt, cs["c"].Attempt}).Scan(&states); err != nil {
		t.Fatal(err)
	}
	if strings.Join(states, ",") != "lost,lost" {
		t.Errorf("returned attempts are %v, want lost", states)
	}
	if n := f.tasksLost(t, f.worker); n != 0 {
		t.Errorf("worker charged %d losses", n)
	}
}

// When PostgreSQL cannot write (here a disk that is full for the outputs'
// table), a batch of results is neither refused nor charged: the error
// says it is the server's fault, and the same results are accepted once
// the disk has room.
func TestResultsWaitOutAFullDisk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"))
	cs := f.claim(t, 3, time.Minute)
	if _, err := f.s.pool.Exec(ctx, `CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'could not extend file "base/1/2": No space left on device' USING ERRCODE = 'disk_full'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `CREATE TRIGGER disk_full BEFORE INSERT ON task_outputs FOR EACH ROW EXECUTE FUNCTION disk_full()`); err != nil {
		t.Fatal(err)
	}
	comps := []Completion{ok(cs[0], "A"), ok(cs[1], "B"), ok(cs[2], "C")}
	for _, batch := range [][]Completion{comps, comps[:1]} {
		acc, err := f.s.Complete(ctx, batch)
		if err == nil || !ServerFault(err) {
			t.Fatalf("%d results on a full disk: error %v, want a server fault", len(batch), err)
		}
		for i, a := range acc {
			if a {
				t.Errorf("result %d accepted on a full disk", i)
			}
		}
	}
	if _, err := f.s.pool.Exec(ctx, `DROP TRIGGER disk_full ON task_outputs`); err != nil {
		t.Fatal(err)
	}
	acc, err := f.s.Complete(ctx, comps)
	if err != nil || !acc[0] || !acc[1] || !acc[2] {
		t.Fatalf("results after the disk has room: %v %v", acc, err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if state, attempts, _, _ := f.taskCounts(t, id, name); state != "done" || attempts != 1 {
			t.Errorf("task %s is %s after %d attempts", name, state, attempts)
		}
	}
}

// ServerFault tells the database's own failures from the items'.
func TestServerFault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	for _, tc := range []struct {
		sql   string
		fault bool
	}{
		{`DO $$ BEGIN RAISE EXCEPTION 'full' USING ERRCODE = 'disk_full'; END $$`, true},
		{`DO $$ BEGIN RAISE EXCEPTION 'ro' USING ERRCODE = 'read_only_sql_transaction'; END $$`, true},
		{`DO $$ BEGIN RAISE EXCEPTION 'io' USING ERRCODE = 'io_error'; END $$`, true},
		{`DO $$ BEGIN RAISE EXCEPTION 'down' USING ERRCODE = 'admin_shutdown'; END $$`, true},
		{`SELECT 1/0`, false},
		{`SELECT '\x00'::text::int`, false},
		{`DO $$ BEGIN RAISE EXCEPTION 'oom' USING ERRCODE = 'out_of_memory'; END $$`, false},
	} {
		_, err := f.s.pool.Exec(ctx, tc.sql)
		if err == nil || ServerFault(err) != tc.fault {
			t.Errorf("%s: error %v, server fault %v, want %v", tc.sql, err, ServerFault(err), tc.fault)
		}
	}
	if ServerFault(context.Canceled) || !ServerFault(context.DeadlineExceeded) {
		t.Error("a cancelled context is nobody's fault; a deadline waiting for PostgreSQL is")
	}
}

// When a worker's leases lapse (it went silent: its socket did not close),
// only its slots oldest attempts may have run: they are lost, charged to
// the worker and one loss to their tasks; the others waited in its queue
// and go back charged to nobody. An attempt keeps the rank it had when the
// worker went silent however the reaper's passes split the worker's
// attempts; a worker that came back and listed an attempt in its hello may
// have run it since.
func TestLapsedQueuedAttemptsChargeNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A step: the worker says hello listing the attempts of hello (if
	// any), the leases of lapse lapse, and the reaper sweeps them in
	// passes of at most limit attempts.
	type step struct {
		hello, lapse []string
		limit        int
	}
	abc := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name    string
		steps   []step // on a 1-slot worker running a, with b and c queued
		lost    map[string]int
		charged int
	}{
		{"at once", []step{{lapse: abc, limit: 100}}, map[string]int{"a": 1, "b": 0, "c": 0}, 1},
		// Many workers vanished at once (a dead replica's, after their
		// grace): a pass ends fewer attempts than one worker holds.
		{"split by the pass limit", []step{{lapse: abc, limit: 1}}, map[string]int{"a": 1, "b": 0, "c": 0}, 1},
		// b and c were assigned after the worker's last heartbeat: their
		// leases lapse a moment after a's, and a pass ends a alone first.
		{"queued leases lapse later", []step{{lapse: abc[:1], limit: 100}, {lapse: abc[1:], limit: 100}},
			map[string]int{"a": 1, "b": 0, "c": 0}, 1},
		// The worker came back after a was lost, listed b and c (and a,
		// which it learns is lost), and started b in a's place before it
		// went silent again.
		{"the worker came back between", []step{{lapse: abc[:1], limit: 100}, {hello: abc, lapse: abc[1:], limit: 100}},
			map[string]int{"a": 1, "b": 1, "c": 0}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			id := f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"))
			reg := f.useWorker(t, 1)
			cs := claimedByName(f.claim(t, 3, time.Minute))
			attempts := func(names []string) []int64 {
				var ids []int64
				for _, n := range names {
					ids = append(ids, cs[n].Attempt)
				}
				return ids
			}
			for _, st := range tc.steps {
				if st.hello != nil {
					if _, err := f.s.RegisterWorker(ctx, WorkerHello{ID: f.worker, Token: reg.Token, Kind: "headless", Slots: 1,
						Running: attempts(st.hello)}, time.Minute); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := f.s.pool.Exec(ctx, `UPDATE attempts SET lease_until = now() - interval '1 second' WHERE id = ANY($1)`,
					attempts(st.lapse)); err != nil {
					t.Fatal(err)
				}
				for {
					n, err := f.s.ExpireLeases(ctx, st.limit)
					if err != nil {
						t.Fatal(err)
					}
					if n == 0 {
						break
					}
				}
			}
			for name, lost := range tc.lost {
				state, attempts, l, errText := f.taskCounts(t, id, name)
				if state != "ready" || attempts != 0 || l != lost {
					t.Errorf("task %s is %s with %d attempts and %d losses (%q), want ready, 0 and %d", name, state, attempts, l, errText, lost)
				}
			}
			if n := f.tasksLost(t, f.worker); n != tc.charged {
				t.Errorf("worker charged %d losses, want %d", n, tc.charged)
			}
		})
	}
}

// An attempt assigned before a worker's hello that said it listed every
// attempt it held (hello.running_complete), and that the hello did not
// list, never reached the worker (its frame died with the old socket, or
// with the replica that claimed it): when its lease lapses it ends charged
// to nobody, and does not take a rank among the attempts the worker held.
// Without that word, or once the worker renewed it, the attempt is judged
// by rank as before.
func TestUnreachedAttemptsChargeNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A step: claim attempts of the named tasks for the 1-slot worker,
	// or say hello listing hello (complete: running_complete), or renew
	// renew with a lease of a millisecond (an old connection's heartbeat
	// that arrives late), or save a checkpoint with such a lease (an old
	// connection's checkpoint that arrives late), or let every lease
	// lapse and sweep in passes of at most lapse attempts.
	type step struct {
		claim, hello, renew, checkpoint []string
		complete                        bool
		lapse                           int
	}
	for _, tc := range []struct {
		name    string
		steps   []step
		lost    map[string]int // the tasks' losses
		charged int            // the worker's
		reason  map[string]string
	}{
		{"unlisted in a complete list", []step{{claim: []string{"a"}}, {hello: []string{}, complete: true}, {lapse: 100}},
			map[string]int{"a": 0}, 0, map[string]string{"a": "never reached"}},
		{"unlisted in a list that may be cut", []step{{claim: []string{"a"}}, {hello: []string{}}, {lapse: 100}},
			map[string]int{"a": 1}, 1, map[string]string{"a": "vanished while running"}},
		{"listed", []step{{claim: []string{"a"}}, {hello: []string{"a"}, complete: true}, {lapse: 100}},
			map[string]int{"a": 1}, 1, map[string]string{"a": "vanished while running"}},
		// A late renewal of the old connection does not shorten the lease
		// the hello gave.
		{"listed, then renewed late", []step{{claim: []string{"a"}}, {hello: []string{"a"}, complete: true}, {renew: []string{"a"}}, {lapse: 100}},
			map[string]int{"a": 1}, 1, map[string]string{"a": "vanished while running"}},
		// Nor does a late checkpoint of the old connection (or one saved
		// by a replica with a shorter lease); the checkpoint moved the
		// task on, so the loss is the worker's alone.
		{"listed, then checkpointed late", []step{{claim: []string{"a"}}, {hello: []string{"a"}, complete: true}, {checkpoint: []string{"a"}}, {lapse: 100}},
			map[string]int{"a": 0}, 1, map[string]string{"a": "vanished while running"}},
		// b was assigned after the hello and ran in the worker's one slot:
		// a, which never reached it, does not push b into the queue.
		{"unreached ahead of a running attempt", []step{{claim: []string{"a"}}, {hello: []string{}, complete: true}, {claim: []string{"b"}}, {lapse: 100}},
			map[string]int{"a": 0, "b": 1}, 1, map[string]string{"a": "never reached", "b": "vanished while running"}},
		{"the same, one attempt a pass", []step{{claim: []string{"a"}}, {hello: []string{}, complete: true}, {claim: []string{"b"}}, {lapse: 1}},
			map[string]int{"a": 0, "b": 1}, 1, map[string]string{"a": "never reached", "b": "vanished while running"}},
		// Assigned after the hello: judged by rank (here queued behind b).
		{"assigned after the hello", []step{{hello: []string{}, complete: true}, {claim: []string{"b", "c"}}, {lapse: 100}},
			map[string]int{"b": 1, "c": 0}, 1, map[string]string{"b": "vanished while running", "c": "before it started"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			id := f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"))
			reg := f.useWorker(t, 1)
			cs := map[string]Claimed{}
			names := func(ns []string) []int64 {
				ids := []int64{}
				for _, n := range ns {
					ids = append(ids, cs[n].Attempt)
				}
				return ids
			}
			for _, st := range tc.steps {
				switch {
				case st.claim != nil:
					cands, _, err := f.s.Candidates(ctx, 10, nil)
					if err != nil {
						t.Fatal(err)
					}
					var picks []Pick
					for _, c := range cands {
						for _, n := range st.claim {
							if c.Name == n {
								picks = append(picks, Pick{TaskID: c.TaskID, Worker: f.worker})
							}
						}
					}
					got, err := f.s.ClaimPicks(ctx, picks, time.Minute)
					if err != nil || len(got) != len(st.claim) {
						t.Fatalf("claimed %d of %v: %v", len(got), st.claim, err)
					}
					for n, c := range claimedByName(got) {
						cs[n] = c
					}
				case st.hello != nil:
					if _, err := f.s.RegisterWorker(ctx, WorkerHello{ID: f.worker, Token: reg.Token, Kind: "headless", Slots: 1,
						Running: names(st.hello), RunningComplete: st.complete}, time.Minute); err != nil {
						t.Fatal(err)
					}
				case st.renew != nil:
					var rs []Renewal
					for _, a := range names(st.renew) {
						rs = append(rs, Renewal{Attempt: a, Worker: f.worker})
					}
					if lost, err := f.s.Renew(ctx, rs, time.Millisecond); err != nil || len(lost) != 0 {
						t.Fatalf("renew: lost %v: %v", lost, err)
					}
				case st.checkpoint != nil:
					for _, a := range names(st.checkpoint) {
						if ok, err := f.s.SaveCheckpoint(ctx, a, f.worker, []byte("state"), time.Millisecond); err != nil || !ok {
							t.Fatalf("checkpoint of attempt %d: saved %v: %v", a, ok, err)
						}
					}
				default:
					// An hour passes for every time the worker and its
					// attempts hold: every lease lapses, in its order.
					for _, sql := range []string{
						`UPDATE attempts SET started_at = started_at - interval '1 hour', lease_until = lease_until - interval '1 hour'`,
						`UPDATE workers SET connected_at = connected_at - interval '1 hour', listed_until = listed_until - interval '1 hour'`,
					} {
						if _, err := f.s.pool.Exec(ctx, sql); err != nil {
							t.Fatal(err)
						}
					}
					for {
						n, err := f.s.ExpireLeases(ctx, st.lapse)
						if err != nil {
							t.Fatal(err)
						}
						if n == 0 {
							break
						}
					}
				}
			}
			for name, lost := range tc.lost {
				state, attempts, l, _ := f.taskCounts(t, id, name)
				if state != "ready" || attempts != 0 || l != lost {
					t.Errorf("task %s is %s with %d attempts and %d losses, want ready, 0 and %d", name, state, attempts, l, lost)
				}
			}
			if n := f.tasksLost(t, f.worker); n != tc.charged {
				t.Errorf("worker charged %d losses, want %d", n, tc.charged)
			}
			for name, want := range tc.reason {
				var reason string
				if err := f.s.pool.QueryRow(ctx, `SELECT reason FROM attempts WHERE id = $1`, cs[name].Attempt).Scan(&reason); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(reason, want) {
					t.Errorf("attempt of %s ended %q, want %q in it", name, reason, want)
				}
			}
		})
	}
}

// FaultSummary says what went wrong in plain words, never the database's
// own message.
func TestFaultSummary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code, want string
	}{
		{"53100", "the server's storage is full"},
		{"25006", "the database is read-only"},
		{"57P01", "the database is shutting down or starting up"},
		{"53300", "the database is out of resources"},
		{"08006", "the database is unavailable"},
	} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: tc.code, Message: `could not extend file "base/1/2" for user cyclepool at 10.0.0.1`})
		if got := FaultSummary(err); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.code, got, tc.want)
		}
	}
	if got := FaultSummary(errors.New("dial tcp 10.0.0.1:5432: connection refused")); got != "the database does not answer" {
		t.Errorf("no answer: %q", got)
	}
}

// A result that breaks its task's rules is refused, whatever a worker
// claims: outputs or a log over the task's limits, an output name the
// workflow could not name. Its attempt ends charged to the worker (an
// invalid result), the task goes back to the queue, nothing it carried is
// stored; a failure's log is cut to the task's limit, and the log of one
// charged to nobody to a few KiB.
func TestResultsBreakingTheTasksRulesAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	big := func(n int) []byte { return make([]byte, n) }
	for _, tc := range []struct {
		name    string
		comp    func(c Claimed) Completion
		refused string // substring of Refused; "" when the result is kept
		state   string // the task's state after
		logLen  int    // the attempt's log kept
	}{
		{"outputs over the limit", func(c Claimed) Completion {
			return Completion{Attempt: c.Attempt, Worker: c.Worker, OK: true,
				Outputs: []Output{{Name: "stdout", Data: big(600 << 10)}, {Name: "big", Data: big(600 << 10)}}}
		}, "outputs of 1228800 bytes (at most 1048576)", "ready", 0},
		{"log over the limit", func(c Claimed) Completion {
			return Completion{Attempt: c.Attempt, Worker: c.Worker, OK: true, Outputs: []Output{{Name: "stdout"}}, Log: big(2 << 10)}
		}, "a log of 2048 bytes (at most 1024)", "ready", 0},
		{"an output name that climbs out", func(c Claimed) Completion {
			return Completion{Attempt: c.Attempt, Worker: c.Worker, OK: true, Outputs: []Output{{Name: "../../pwned", Data: []byte("x")}}}
		}, "must be a clean relative path", "ready", 0},
		{"an absolute output name under /in", func(c Claimed) Completion {
			return Completion{Attempt: c.Attempt, Worker: c.Worker, OK: true, Outputs: []Output{{Name: "/in/abs", Data: []byte("x")}}}
		}, "must be a clean path outside /in and /out", "ready", 0},
		{"a result within the limits", func(c Claimed) Completion {
			return Completion{Attempt: c.Attempt, Worker: c.Worker, OK: true, Outputs: []Output{{Name: "stdout", Data: big(1 << 20)}}, Log: big(1 << 10)}
		}, "", "done", 1 << 10},
		{"a failure's long log", func(c Claimed) Completion {
			return Completion{Attempt: c.Attempt, Worker: c.Worker, Reason: "exit", Log: big(8 << 20)}
		}, "", "ready", 1 << 10},
		{"a hand-back's long log", func(c Claimed) Completion {
			return Completion{Attempt: c.Attempt, Worker: c.Worker, Reason: "worker", End: EndHandedBack, Log: big(8 << 20)}
		}, "", "ready", 1 << 10},
	} {
		for _, crowd := range []int{1, fastBatch + 2} { // the one-round-trip path, and the general one
			t.Run(fmt.Sprintf("%s/%d", tc.name, crowd), func(t *testing.T) {
				f := newFixture(t)
				var tasks []NewTask
				for i := range crowd {
					tasks = append(tasks, f.task(fmt.Sprintf("t%02d", i)))
				}
				id := f.submit(t, "batch", tasks...)
				cs := f.claim(t, crowd, time.Minute)
				byName := claimedByName(cs)
				var batch []Completion
				for _, c := range cs {
					if c.Name == "t00" {
						batch = append(batch, tc.comp(c))
					} else {
						batch = append(batch, ok(c, "fine"))
					}
				}
				acc, err := f.s.Complete(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				for i, c := range batch {
					if !acc[i] {
						t.Errorf("item %d not committed", i)
					}
					if c.Attempt == byName["t00"].Attempt && !strings.Contains(c.Refused, tc.refused) || tc.refused == "" && c.Refused != "" {
						t.Errorf("refused %q, want %q", c.Refused, tc.refused)
					}
				}
				state, attempts, lost, errText := f.taskCounts(t, id, "t00")
				if state != tc.state || lost != 0 {
					t.Errorf("task is %s (%q) with %d losses, want %s", state, errText, lost, tc.state)
				}
				var outputs, logLen, invalid int
				if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM task_outputs o JOIN tasks t ON t.id = o.task_id
						WHERE t.workflow_id = $1 AND t.name = 't00'),
					(SELECT coalesce(octet_length(log), 0) FROM attempts WHERE id = $2),
					(SELECT results_invalid FROM workers WHERE id = $3)`, id, byName["t00"].Attempt, f.worker).Scan(&outputs, &logLen, &invalid); err != nil {
					t.Fatal(err)
				}
				if tc.refused != "" && (outputs != 0 || invalid != 1 || attempts != 0) {
					t.Errorf("refused, yet %d outputs stored, %d invalid results charged to the worker, %d attempts to the task", outputs, invalid, attempts)
				}
				if want := min(tc.logLen, uncountedLogBytesIf(tc.name)); logLen != want {
					t.Errorf("log of %d bytes kept, want %d", logLen, want)
				}
			})
		}
	}
}

// uncountedLogBytesIf is the log a test case of
// TestResultsBreakingTheTasksRulesAreRefused keeps at most.
func uncountedLogBytesIf(name string) int {
	if strings.Contains(name, "hand-back") {
		return uncountedLogBytes
	}
	return 1 << 30
}

// A checkpoint larger than its task's memory limit is refused with an error
// that says so, and not stored; the attempt keeps its lease.
func TestCheckpointOverTheMemoryLimitIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a")) // 16 pages: 1 MiB
	c := f.claim(t, 1, time.Minute)[0]
	saved, err := f.s.SaveCheckpoint(ctx, c.Attempt, c.Worker, make([]byte, 1<<20+1), time.Minute)
	var refused *RefusedError
	if saved || !errors.As(err, &refused) || !strings.Contains(refused.Why, "larger than the task's memory limit of 1048576 bytes") {
		t.Fatalf("a checkpoint over the limit: saved %v, error %v", saved, err)
	}
	if ServerFault(err) {
		t.Error("a refused checkpoint is taken for a server fault (it would be sent again)")
	}
	if saved, err := f.s.SaveCheckpoint(ctx, c.Attempt, c.Worker, make([]byte, 1<<20), time.Minute); !saved || err != nil {
		t.Fatalf("a checkpoint at the limit: saved %v, error %v", saved, err)
	}
	var seq, size int
	if err := f.s.pool.QueryRow(ctx, `SELECT checkpoint_seq, octet_length(checkpoint) FROM tasks WHERE workflow_id = $1`, id).Scan(&seq, &size); err != nil {
		t.Fatal(err)
	}
	if seq != 1 || size != 1<<20 {
		t.Errorf("checkpoints saved %d, the latest of %d bytes; want 1 of 1048576", seq, size)
	}
}

// A loss whose attempt saved a checkpoint first does not count towards
// max_lost: the task moved on, however often its workers go. The worker is
// charged all the same.
func TestLossAfterACheckpointIsNotCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	id := f.submit(t, "batch", f.task("a"))
	for i := 1; i <= DefaultMaxLost+2; i++ {
		c := f.claim(t, 1, time.Minute)
		if len(c) != 1 {
			t.Fatalf("loss %d: the task was not queued again", i)
		}
		if saved, err := f.s.SaveCheckpoint(ctx, c[0].Attempt, c[0].Worker, []byte{byte(i)}, time.Minute); !saved || err != nil {
			t.Fatalf("checkpoint: %v %v", saved, err)
		}
		f.expire(t, c[0])
	}
	// Then one that saved nothing counts.
	f.expire(t, f.claim(t, 1, time.Minute)[0])
	state, attempts, lost, errText := f.taskCounts(t, id, "a")
	if state != "ready" || attempts != 0 || lost != 1 {
		t.Errorf("task is %s (%q) with %d attempts and %d losses, want ready, 0 and 1", state, errText, attempts, lost)
	}
	if n := f.tasksLost(t, f.worker); n != DefaultMaxLost+3 {
		t.Errorf("worker charged %d losses, want %d", n, DefaultMaxLost+3)
	}
}

// A task reading a big output under many names is given Missing (one
// assignment could not carry its inputs) without the store loading those
// bytes even once.
//
// Not in parallel: it counts the whole process's allocations.
func TestHugeInputsAreNotLoaded(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	up := f.task("up")
	up.OutputBytes = 64 << 20
	var inputs []NewInput
	for _, n := range []string{"a", "b", "c"} {
		inputs = append(inputs, NewInput{Name: n, From: 0, Output: "big"})
	}
	f.submit(t, "batch", up, f.task("down", inputs...))
	c := f.claim(t, 1, time.Minute)[0]
	if acc, err := f.s.Complete(ctx, []Completion{{Attempt: c.Attempt, Worker: c.Worker, OK: true,
		Outputs: []Output{{Name: "stdout"}, {Name: "big", Data: make([]byte, 40<<20)}}}}); err != nil || !acc[0] {
		t.Fatalf("complete up: %v %v", acc, err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	down := f.claim(t, 1, time.Minute)
	runtime.ReadMemStats(&after)
	if len(down) != 1 || !strings.Contains(down[0].Missing, "inputs take 120 MiB, more than the 80 MiB one assignment can carry") {
		missing := ""
		if len(down) == 1 {
			missing = down[0].Missing
		}
		t.Fatalf("claimed %d attempts, missing %q", len(down), missing) // not the inputs: 120 MiB
	}
	if len(down[0].Inputs) != 0 {
		t.Errorf("%d inputs loaded", len(down[0].Inputs))
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("claiming it allocated %d MiB: the inputs were read", alloc>>20)
	}
}

// strikes reads a worker's strikes as of now, and whether the task avoids
// it.
func (f *fixture) strikes(t *testing.T, worker string) float64 {
	t.Helper()
	recs, err := f.s.Workers(context.Background(), []string{worker})
	if err != nil || len(recs) != 1 {
		t.Fatalf("worker record: %v %v", recs, err)
	}
	return recs[0].Strikes
}

// A failure a volunteer reports is evidence, not a verdict: the task never
// goes back to that volunteer, fails for good only when a second, distinct
// worker fails it too (or one of the operator's own workers does), and a
// failure another worker's result disproves is a strike against the
// volunteer that reported it.
func TestFailuresAreEvidence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fail := func(f *fixture, t *testing.T, c Claimed, e Ending) {
		t.Helper()
		if acc, err := f.s.Complete(ctx, []Completion{{Attempt: c.Attempt, Worker: c.Worker, Reason: "exit", Message: "status 1", End: e}}); err != nil || !acc[0] {
			t.Fatalf("complete: %v %v", acc, err)
		}
	}
	succeed := func(f *fixture, t *testing.T, c Claimed) {
		t.Helper()
		if acc, err := f.s.Complete(ctx, []Completion{{Attempt: c.Attempt, Worker: c.Worker, OK: true}}); err != nil || !acc[0] {
			t.Fatalf("complete: %v %v", acc, err)
		}
	}
	operator := func(f *fixture, t *testing.T) string {
		t.Helper()
		reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 1, Operator: true}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		f.worker = reg.ID
		return reg.ID
	}
	type step struct {
		worker string // "v1", "v2": volunteers; "op": an operator's worker
		end    string // "fail", "ok", "vanish", "refuse"
		// claims: whether the worker may claim the task now
		claims bool
	}
	for _, tc := range []struct {
		name      string
		steps     []step
		state     string
		errHas    string
		strikesV1 float64
	}{
		{"one volunteer's failure waits for a second worker",
			[]step{{"v1", "fail", true}, {"v1", "", false}}, "ready", "waiting for another worker to confirm it", 0},
		{"two volunteers' failures fail the task",
			[]step{{"v1", "fail", true}, {"v2", "fail", true}}, "failed", "failed after 2 attempts", 0},
		{"a failure another worker's result disproves is a strike",
			[]step{{"v1", "fail", true}, {"v2", "ok", true}}, "done", "", 1},
		{"an operator's worker's failure is a verdict",
			[]step{{"op", "fail", true}}, "failed", "failed after 1 attempt; last:", 0},
		{"the operator's worker may take a task again",
			[]step{{"op", "vanish", true}, {"op", "ok", true}}, "done", "", 0},
		{"a volunteer that lost the task does not get it again while it alone is avoided",
			[]step{{"v1", "vanish", true}, {"v1", "", false}, {"v2", "ok", true}}, "done", "", 0},
		{"once two are avoided a loser may take the task again, but a lone failer may not",
			[]step{{"v1", "fail", true}, {"v2", "vanish", true}, {"v1", "", false}, {"v2", "ok", true}}, "done", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			task := f.task("a")
			task.MaxAttempts = 1
			id := f.submit(t, "batch", task)
			ids := map[string]string{}
			for i, st := range tc.steps {
				w, ok := ids[st.worker]
				switch {
				case ok:
					f.worker = w
				case st.worker == "op":
					ids[st.worker] = operator(f, t)
				default:
					ids[st.worker] = f.useWorker(t, 1).ID
				}
				cs := f.claim(t, 1, time.Minute)
				if (len(cs) == 1) != st.claims {
					t.Fatalf("step %d: %s claimed %d attempts, want the task: %v", i, st.worker, len(cs), st.claims)
				}
				if len(cs) == 0 {
					continue
				}
				switch st.end {
				case "fail":
					fail(f, t, cs[0], EndTaskError)
				case "ok":
					succeed(f, t, cs[0])
				case "vanish":
					f.expire(t, cs[0])
				}
			}
			state, _, _, errText := f.taskCounts(t, id, "a")
			if state != tc.state || !strings.Contains(errText, tc.errHas) {
				t.Errorf("task is %s (%q), want %s with %q", state, errText, tc.state, tc.errHas)
			}
			if v1, ok := ids["v1"]; ok {
				if got := f.strikes(t, v1); got < tc.strikesV1-0.01 || got > tc.strikesV1+0.01 {
					t.Errorf("v1 has %.2f strikes, want %v", got, tc.strikesV1)
				}
			}
		})
	}
}

// List finds an owner's workflows by the start of their id, and only that
// owner's.
func TestListByIDPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	a := f.submit(t, "batch", f.task("a"))
	b := f.submit(t, "batch", f.task("b"))
	for _, tc := range []struct {
		prefix string
		owner  int64
		want   int
	}{
		{a[:8], f.owner, 1},
		{a, f.owner, 1},
		{"", f.owner, 2},
		{a[:8], f.owner + 1000, 0},
	} {
		ws, total, err := f.s.List(ctx, tc.owner, ListOptions{Prefix: tc.prefix})
		if err != nil || total != tc.want || len(ws) != tc.want {
			t.Errorf("prefix %q, owner %d: %d of %d listed (%v), want %d", tc.prefix, tc.owner, len(ws), total, err, tc.want)
		}
		if tc.want == 1 && ws[0].ID != a {
			t.Errorf("prefix %q listed %s, want %s (not %s)", tc.prefix, ws[0].ID, a, b)
		}
	}
	for _, p := range []string{"6B0C", "6b0c%", "", strings.Repeat("a", 37), "6b0c'"} {
		if ValidIDPrefix(p) {
			t.Errorf("ValidIDPrefix(%q) = true", p)
		}
	}
}

// With fewer volunteers than a task has attempts, the task does not wait
// for ever: once two workers failed it, any worker may take it again, and
// it fails when its attempts are used up.
func TestTwoVolunteersUseUpATasksAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	three := f.task("a")
	three.MaxAttempts = 3
	id := f.submit(t, "batch", three)
	v1 := f.useWorker(t, 1).ID
	v2 := f.useWorker(t, 1).ID
	for i, w := range []string{v1, v2, v1} {
		f.worker = w
		cs := f.claim(t, 1, time.Minute)
		if len(cs) != 1 {
			t.Fatalf("failure %d: worker %d could not take the task", i+1, i%2+1)
		}
		if acc, err := f.s.Complete(ctx, []Completion{{Attempt: cs[0].Attempt, Worker: w, Reason: "exit", End: EndTaskError}}); err != nil || !acc[0] {
			t.Fatalf("complete: %v %v", acc, err)
		}
	}
	if state, attempts, _, errText := f.taskCounts(t, id, "a"); state != StateFailed || attempts != 3 {
		t.Errorf("task %s after %d attempts (%s), want failed after 3", state, attempts, errText)
	}
}

// Two replicas of a task that fail in one batch are both counted: each
// worker is avoided and each failure counts (an UPDATE … FROM applies one
// row per task, so they go in separate rounds).
func TestReplicasFailingTogetherAreBothCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	t1 := f.task("a")
	t1.MaxAttempts = 5
	if _, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch", Tasks: []NewTask{t1},
		Replicas: 2, Quorum: 2, MaxReplicas: 5}); err != nil {
		t.Fatal(err)
	}
	cands, _, err := f.s.Candidates(ctx, 10, nil)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %+v %v", cands, err)
	}
	w1, w2 := f.useWorker(t, 1).ID, f.useWorker(t, 1).ID
	cs, err := f.s.ClaimPicks(ctx, []Pick{{TaskID: cands[0].TaskID, Worker: w1}, {TaskID: cands[0].TaskID, Worker: w2}}, time.Minute)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claimed %+v %v, want both replicas", cs, err)
	}
	if acc, err := f.s.Complete(ctx, []Completion{
		{Attempt: cs[0].Attempt, Worker: cs[0].Worker, Reason: "exit", End: EndTaskError},
		{Attempt: cs[1].Attempt, Worker: cs[1].Worker, Reason: "exit", End: EndTaskError},
	}); err != nil || !acc[0] || !acc[1] {
		t.Fatalf("complete: %v %v", acc, err)
	}
	var avoid, failedBy, pending int
	if err := f.s.pool.QueryRow(ctx, `SELECT coalesce(cardinality(avoid), 0), coalesce(cardinality(failed_by), 0), pending
		FROM tasks WHERE id = $1`, cands[0].TaskID).Scan(&avoid, &failedBy, &pending); err != nil {
		t.Fatal(err)
	}
	if avoid != 2 || failedBy != 2 || pending != 2 {
		t.Errorf("after two replicas failed together: %d avoided, %d failers, %d pending; want 2, 2, 2", avoid, failedBy, pending)
	}
}
