package store

import (
	"context"
	"testing"
	"time"
)

// A replica says it is alive once for all its workers, whose rows it does
// not write: they count as seen when it was. When it falls silent, the
// leader marks them disconnected as of that moment; a worker whose replica
// has yet to say so, but that connected a moment ago, stays.
func TestReplicaVouchesForItsWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	register := func(replica string) string {
		t.Helper()
		reg, err := f.s.RegisterWorker(ctx, WorkerHello{Kind: "headless", Slots: 1, Replica: replica}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return reg.ID
	}
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
