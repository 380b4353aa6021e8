package store

import (
	"context"
	"testing"
	"time"
)

// The lease reaper finds lapsed attempts through running_attempts, and
// deletes from it the attempts that ended before its pass.
func TestReaperForgetsEndedAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submit(t, "batch", f.task("short"), f.task("long"))
	short := f.claim(t, 1, 50*time.Millisecond)
	long := f.claim(t, 1, time.Minute)
	if len(short) != 1 || len(long) != 1 {
		t.Fatalf("claimed %d and %d", len(short), len(long))
	}
	listed := func() int {
		t.Helper()
		var n int
		if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM running_attempts`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := listed(); n != 2 {
		t.Fatalf("%d attempts listed as running, want 2", n)
	}
	if _, err := f.s.Complete(ctx, []Completion{ok(long[0], "L")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	for _, pass := range []struct{ lost, listed int }{{1, 1}, {0, 0}} {
		n, err := f.s.ExpireLeases(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if n != pass.lost || listed() != pass.listed {
			t.Errorf("a pass ended %d attempts and left %d listed, want %d and %d", n, listed(), pass.lost, pass.listed)
		}
	}
}
