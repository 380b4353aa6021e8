package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// deadlineOf reads an attempt's deadline and lease; a NULL deadline is
// the zero time.
func (f *fixture) deadlineOf(t *testing.T, attempt int64) (deadline, lease time.Time) {
	t.Helper()
	var d *time.Time
	if err := f.s.pool.QueryRow(context.Background(), `SELECT deadline, lease_until FROM attempts WHERE id = $1`, attempt).Scan(&d, &lease); err != nil {
		t.Fatal(err)
	}
	if d != nil {
		deadline = *d
	}
	return deadline, lease
}

// A worker that heartbeats an attempt and never ends it loses it: its
// renewals stop at the attempt's deadline (the task's wall time and the
// grace after the heartbeat that found it running), the lease lapses, and
// the reaper ends it as vanished, charged to the worker, its task queued
// again. Its heartbeats for it are then answered as for any lapsed lease.
func TestAttemptHeldPastItsDeadlineLapses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixtureAt(t, migratedURL(t), WithWallGrace(100*time.Millisecond))
	f.useWorker(t, 1)
	task := f.task("a")
	task.TimeoutMS = 100
	id := f.submit(t, "batch", task)
	// A claim's lease shorter than the deadline: renewals alone could
	// carry it further.
	cs := f.claim(t, 1, 10*time.Millisecond)
	if len(cs) != 1 {
		t.Fatalf("claimed %d", len(cs))
	}
	a := cs[0].Attempt
	if d, _ := f.deadlineOf(t, a); !d.IsZero() {
		t.Fatalf("a claimed attempt has a deadline (%v) before a renewal says it runs", d)
	}
	renew := func() []int64 {
		t.Helper()
		lost, err := f.s.Renew(ctx, []Renewal{{Attempt: a, Worker: f.worker, Slots: 1}}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return lost
	}
	renew()
	d, lease := f.deadlineOf(t, a)
	if d.IsZero() || !lease.Equal(d) {
		t.Fatalf("after a heartbeat of a running attempt: deadline %v, lease until %v; want a deadline that bounds the lease", d, lease)
	}
	// The hostile worker heartbeats every few milliseconds, with leases of
	// a minute, and never reports.
	expired := false
	for give := time.Now().Add(30 * time.Second); !expired && time.Now().Before(give); time.Sleep(20 * time.Millisecond) {
		if lost := renew(); len(lost) != 0 {
			t.Fatalf("attempt %d lost before the reaper ended it", a)
		}
		n, err := f.s.ExpireLeases(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		expired = n == 1
	}
	if !expired {
		t.Fatal("the attempt still holds its lease long after its deadline")
	}
	if d2, lease := f.deadlineOf(t, a); !d2.Equal(d) || lease.After(d) {
		t.Errorf("renewals moved the deadline to %v (from %v) or the lease past it (%v)", d2, d, lease)
	}
	var state, reason string
	if err := f.s.pool.QueryRow(ctx, `SELECT state, reason FROM attempts WHERE id = $1`, a).Scan(&state, &reason); err != nil {
		t.Fatal(err)
	}
	if state != "lost" || !strings.Contains(reason, "vanished while running") {
		t.Errorf("attempt ended %s (%q), want lost as vanished while running", state, reason)
	}
	if n := f.tasksLost(t, f.worker); n != 1 {
		t.Errorf("the worker has %d losses, want 1", n)
	}
	if st, attempts, lost, _ := f.taskCounts(t, id, "a"); st != "ready" || attempts != 0 || lost != 1 {
		t.Errorf("task is %s with %d attempts and %d losses, want ready again with 1 loss and no attempt used up", st, attempts, lost)
	}
	if lost := renew(); len(lost) != 1 || lost[0] != a {
		t.Errorf("a heartbeat after the end got lost %v, want [%d]", lost, a)
	}
}

// An attempt that waits in its worker's queue (behind its slots lowest
// ids, whatever the order of the worker's list) gets no deadline until it
// may run: when the attempts ahead of it are no longer listed. A hello that
// lists the attempts ranks them the same way, and keeps the deadlines
// they have.
func TestQueuedAttemptGetsNoDeadlineUntilItMayRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	reg := f.useWorker(t, 1)
	f.submit(t, "batch", f.task("a"), f.task("b"), f.task("c"))
	cs := f.claim(t, 3, time.Minute)
	if len(cs) != 3 {
		t.Fatalf("claimed %d", len(cs))
	}
	first, second, third := cs[0].Attempt, cs[1].Attempt, cs[2].Attempt
	if first > second || second > third {
		t.Fatalf("attempt ids %d, %d, %d not in the order of assignment", first, second, third)
	}
	has := func(a int64) bool {
		d, _ := f.deadlineOf(t, a)
		return !d.IsZero()
	}
	// Listed last by the worker, the lowest id is still the one that runs.
	if lost, err := f.s.Renew(ctx, []Renewal{{Attempt: third, Worker: f.worker, Slots: 1}, {Attempt: second, Worker: f.worker, Slots: 1},
		{Attempt: first, Worker: f.worker, Slots: 1}}, time.Minute); err != nil || len(lost) != 0 {
		t.Fatalf("renew: lost %v, %v", lost, err)
	}
	if !has(first) || has(second) || has(third) {
		t.Fatalf("deadlines: %v %v %v, want only the first attempt's", has(first), has(second), has(third))
	}
	if _, lease := f.deadlineOf(t, second); time.Until(lease) < 30*time.Second {
		t.Errorf("a queued attempt's lease runs until %v, want a minute's renewal", lease)
	}
	firstDeadline, _ := f.deadlineOf(t, first)
	// A reconnection lists them all: the first keeps its deadline, the
	// others wait.
	if _, err := f.s.RegisterWorker(ctx, WorkerHello{ID: f.worker, Token: reg.Token, Kind: "headless", Slots: 1,
		Running: []int64{third, first, second}, RunningComplete: true}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if d, _ := f.deadlineOf(t, first); !d.Equal(firstDeadline) || has(second) || has(third) {
		t.Fatalf("after the hello: first deadline %v (was %v), second %v, third %v", d, firstDeadline, has(second), has(third))
	}
	// The first ended: the second starts, the third still waits.
	if acc, err := f.s.Complete(ctx, []Completion{ok(cs[0], "A")}); err != nil || !acc[0] {
		t.Fatalf("complete: %v, %v", acc, err)
	}
	if _, err := f.s.Renew(ctx, []Renewal{{Attempt: second, Worker: f.worker, Slots: 1}, {Attempt: third, Worker: f.worker, Slots: 1}},
		time.Minute); err != nil {
		t.Fatal(err)
	}
	if !has(second) || has(third) {
		t.Fatalf("deadlines of the second and third: %v %v, want the second's alone", has(second), has(third))
	}
	// An outcome the server holds does not take a slot: the third may run.
	if _, err := f.s.Renew(ctx, []Renewal{{Attempt: second, Worker: f.worker, Slots: 1, Reported: true}, {Attempt: third, Worker: f.worker, Slots: 1}},
		time.Minute); err != nil {
		t.Fatal(err)
	}
	if !has(third) {
		t.Fatal("the third attempt has no deadline once the second's outcome arrived")
	}
}

// An attempt that a renewal found running reached its worker: a worker
// that reconnects without it (saying its list is complete) does not make
// it end charged to nobody.
func TestAttemptWithADeadlineReachedItsWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	reg := f.useWorker(t, 1)
	f.submit(t, "batch", f.task("a"))
	cs := f.claim(t, 1, time.Minute)
	if len(cs) != 1 {
		t.Fatalf("claimed %d", len(cs))
	}
	if _, err := f.s.Renew(ctx, []Renewal{{Attempt: cs[0].Attempt, Worker: f.worker, Slots: 1}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.RegisterWorker(ctx, WorkerHello{ID: f.worker, Token: reg.Token, Kind: "headless", Slots: 1, RunningComplete: true},
		time.Minute); err != nil {
		t.Fatal(err)
	}
	f.expire(t, cs[0])
	if n := f.tasksLost(t, f.worker); n != 1 {
		t.Errorf("the worker has %d losses, want 1: it ran the attempt it left out of its hello", n)
	}
}

// A sweep after a gap (the server could not record renewals, nor commit
// outcomes) moves the deadlines on by the gap: an honest worker whose
// outcome was held back meanwhile still delivers it, uncharged, though
// the deadline passed during the outage.
func TestGapMovesDeadlinesOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixtureAt(t, migratedURL(t), WithWallGrace(time.Second))
	f.useWorker(t, 1)
	id := f.submit(t, "batch", f.task("a"))
	cs := f.claim(t, 1, time.Minute)
	if len(cs) != 1 {
		t.Fatalf("claimed %d", len(cs))
	}
	a := cs[0].Attempt
	if _, err := f.s.Renew(ctx, []Renewal{{Attempt: a, Worker: f.worker, Slots: 1}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	sw := Sweep{Limit: 100, Gap: time.Minute, Lease: 2 * time.Second}
	if _, err := f.s.SweepLeases(ctx, sw); err != nil { // the sweep before the gap
		t.Fatal(err)
	}
	// Two minutes of outage: the sweep before it was then, and the
	// attempt's deadline (and its lease) passed meanwhile, a few seconds
	// after the outage began.
	for _, q := range []string{
		`UPDATE lease_sweeps SET at = now() - interval '2 minutes'`,
		`UPDATE attempts SET deadline = now() - interval '110 seconds', lease_until = now() - interval '110 seconds' WHERE id = $1`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = []any{a}
		}
		if _, err := f.s.pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	res, err := f.s.SweepLeases(ctx, sw)
	if err != nil || res.Renewed != 1 || res.Expired != 0 {
		t.Fatalf("sweep after the gap: %+v, %v", res, err)
	}
	d, lease := f.deadlineOf(t, a)
	if time.Until(d) < 5*time.Second {
		t.Fatalf("after a gap of %v the deadline is %v from now, want the 10 s it had left", res.Since, time.Until(d).Round(time.Millisecond))
	}
	// The worker's heartbeats go on, the sweeps too, and its outcome
	// (limit_wall_time, sent again until the server can commit) lands.
	if lost, err := f.s.Renew(ctx, []Renewal{{Attempt: a, Worker: f.worker, Slots: 1}}, time.Minute); err != nil || len(lost) != 0 {
		t.Fatalf("renew after the gap: lost %v, %v", lost, err)
	}
	if _, l2 := f.deadlineOf(t, a); l2.Before(lease) || l2.After(d) {
		t.Errorf("renewal after the gap: lease until %v, want between %v and the deadline %v", l2, lease, d)
	}
	if res, err := f.s.SweepLeases(ctx, sw); err != nil || res.Expired != 0 {
		t.Fatalf("sweep after the gap's: %+v, %v", res, err)
	}
	acc, err := f.s.Complete(ctx, []Completion{{Attempt: a, Worker: f.worker, Reason: "limit_wall_time", Message: "wall time limit exceeded"}})
	if err != nil || !acc[0] {
		t.Fatalf("the honest worker's outcome: %v, %v", acc, err)
	}
	if n := f.tasksLost(t, f.worker); n != 0 {
		t.Errorf("the honest worker has %d losses", n)
	}
	if _, _, lost, _ := f.taskCounts(t, id, "a"); lost != 0 {
		t.Errorf("the task counts %d losses", lost)
	}
}

// A worker that leaves its lower attempt out of its heartbeats, so that
// the higher one ranks first and gets a deadline, loses both: the one
// left out when its lease lapses, the other at its deadline, and both are
// charged to it. The one left out does not push the other down the ranks
// the reaper judges by, to end charged to nobody (and go back to it).
func TestAttemptWithADeadlineMayHaveRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixtureAt(t, migratedURL(t), WithWallGrace(100*time.Millisecond))
	f.useWorker(t, 1)
	first, second := f.task("a"), f.task("b")
	second.TimeoutMS = 100
	f.submit(t, "batch", first, second)
	cs := f.claim(t, 2, 10*time.Millisecond)
	if len(cs) != 2 {
		t.Fatalf("claimed %d", len(cs))
	}
	byName := claimedByName(cs)
	a, b := byName["a"], byName["b"]
	if a.Attempt > b.Attempt {
		t.Fatalf("attempt ids %d, %d not in the order of assignment", a.Attempt, b.Attempt)
	}
	ended := 0
	for give := time.Now().Add(30 * time.Second); ended < 2 && time.Now().Before(give); time.Sleep(20 * time.Millisecond) {
		if _, err := f.s.Renew(ctx, []Renewal{{Attempt: b.Attempt, Worker: f.worker, Slots: 1}}, time.Minute); err != nil {
			t.Fatal(err)
		}
		n, err := f.s.ExpireLeases(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		ended += n
	}
	if ended != 2 {
		t.Fatalf("%d of the 2 attempts ended", ended)
	}
	if n := f.tasksLost(t, f.worker); n != 2 {
		t.Errorf("the worker has %d losses, want 2", n)
	}
}

// An attempt carries, besides its task's wall time, the time its data
// takes to download at DataAllowanceBytesPerSecond: a volunteer that
// fetches a large setup before the task's clock starts is not taken for
// one that holds the attempt. Blobs its setup names that are not stored
// add nothing.
func TestAttemptWallTimeAllowsForItsData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	u, err := f.s.BeginBlobUpload(ctx, f.owner, 1<<30, -1)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("d"), 3*DataAllowanceBytesPerSecond/2) // 1.5 s of download
	if _, err := u.ReadFrom(ctx, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	b, _, err := u.Commit(ctx, "data", false)
	if err != nil {
		t.Fatal(err)
	}
	plain, withData := f.task("plain"), f.task("data")
	plain.TimeoutMS, withData.TimeoutMS = 1000, 1000
	absent := "sha256:" + strings.Repeat("a", 64)
	withData.Setup = []byte(`{"files": [{"path": "/x", "blob": "` + b.ID + `"}, {"path": "/y", "data": "z"}, {"path": "/z", "blob": "` + absent + `"}]}`)
	f.submit(t, "batch", plain, withData)
	got := map[string]int64{}
	for _, c := range f.claim(t, 2, time.Minute) {
		var ms int64
		if err := f.s.pool.QueryRow(ctx, `SELECT timeout_ms FROM attempts WHERE id = $1`, c.Attempt).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		got[c.Name] = ms
	}
	// Each with its outputs' upload, by their limit.
	out := plain.OutputBytes * 1000 / DataAllowanceBytesPerSecond
	if want := map[string]int64{"plain": 1000 + out, "data": 2500 + out}; got["plain"] != want["plain"] || got["data"] != want["data"] {
		t.Errorf("the attempts carry wall times (ms) %v, want %v", got, want)
	}
}

// An input from an upstream task's output uploaded over HTTP is a blob
// the worker downloads before the task starts, as it does the blobs a
// setup mounts: the attempt of the task that reads it carries its download
// time too, or an honest volunteer on a slow link that fetches a large
// upstream output would be charged for the time it took.
func TestAttemptWallTimeAllowsForItsUploadedInputs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	up, down := f.task("up"), f.task("down", NewInput{Name: "in", From: 0, Output: "big"})
	down.TimeoutMS = 1000
	f.submit(t, "batch", up, down)
	cs := f.claim(t, 2, time.Minute)
	if len(cs) != 1 || cs[0].Name != "up" {
		t.Fatalf("claimed %+v, want the upstream task alone", cs)
	}
	out := bytes.Repeat([]byte("o"), 3*DataAllowanceBytesPerSecond/2) // 1.5 s of download
	if err := uploadOutput(ctx, f.s, cs[0], "big", out); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(out)
	if acc, err := f.s.Complete(ctx, []Completion{{Attempt: cs[0].Attempt, Worker: cs[0].Worker, OK: true,
		Outputs: []Output{{Name: "big", Blob: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(out))}}}}); err != nil || !acc[0] {
		t.Fatalf("result: %v %v", acc, err)
	}
	cs = f.claim(t, 1, time.Minute)
	if len(cs) != 1 || cs[0].Name != "down" || len(cs[0].Inputs) != 1 || cs[0].Inputs[0].Blob == "" {
		t.Fatalf("claimed %+v, want the downstream task with its input as a blob", cs)
	}
	var ms int64
	if err := f.s.pool.QueryRow(ctx, `SELECT timeout_ms FROM attempts WHERE id = $1`, cs[0].Attempt).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	if want := 2500 + down.OutputBytes*1000/DataAllowanceBytesPerSecond; ms != want {
		t.Errorf("the attempt carries a wall time of %d ms, want %d: 1000, 1500 for its input's download and its outputs' upload", ms, want)
	}
}

// An attempt's deadline allows for the other attempts its worker lists as
// held, each within its own wall time: an honest worker need not run its
// attempts in the order of their ids (a browser page runs first one whose
// module it has compiled, and reports the attempts of a batch together),
// so the one that may be running by its rank can wait for the others.
// Those whose outcome the server holds are not waited for.
func TestDeadlineAllowsForTheWorkersOtherAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const grace = 7 * time.Second
	f := newFixtureAt(t, migratedURL(t), WithWallGrace(grace))
	f.useWorker(t, 1)
	a, b, c := f.task("a"), f.task("b"), f.task("c")
	a.TimeoutMS, b.TimeoutMS, c.TimeoutMS = 10_000, 600_000, 3_000_000
	f.submit(t, "batch", a, b, c)
	cs := f.claim(t, 3, time.Minute)
	if len(cs) != 3 {
		t.Fatalf("claimed %d", len(cs))
	}
	wall := func(a int64) time.Duration {
		t.Helper()
		var ms int64
		if err := f.s.pool.QueryRow(ctx, `SELECT timeout_ms FROM attempts WHERE id = $1`, a).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ms) * time.Millisecond
	}
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := f.s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	// The third's outcome is being committed: it is not waited for.
	before := dbNow()
	if _, err := f.s.Renew(ctx, []Renewal{{Attempt: cs[0].Attempt, Worker: f.worker, Slots: 1}, {Attempt: cs[1].Attempt, Worker: f.worker, Slots: 1},
		{Attempt: cs[2].Attempt, Worker: f.worker, Slots: 1, Reported: true}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	after := dbNow()
	allowed := wall(cs[0].Attempt) + wall(cs[1].Attempt) + grace
	d, _ := f.deadlineOf(t, cs[0].Attempt)
	if d.Before(before.Add(allowed)) || d.After(after.Add(allowed)) {
		t.Errorf("the first attempt's deadline is %v after the renewal began, want %v: its wall time, the second's and the grace",
			d.Sub(before), allowed)
	}
}
