//go:build unix

package store

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/pgembed"
)

// Claims commit without waiting for their WAL flush, so a crash of
// PostgreSQL can take back the last ones, and the sequence's advance with
// them. Attempt ids handed out after the crash must still never repeat one
// handed out before: the store moves the sequence on after every crash
// recovery (of the whole server, or after one of its processes died), and
// only then, not after a clean restart or a new connection.
func TestAttemptIDsNeverRepeatAfterACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	pg, err := pgembed.Start(ctx, pgembed.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	port := pg.Port()
	f := newFixtureAt(t, pg.URL())
	// Every step claims three tasks, and a crash may take none of its
	// claims back: enough tasks for every claim of every step.
	var tasks []NewTask
	for i := range 24 {
		tasks = append(tasks, f.task(fmt.Sprintf("t%d", i)))
	}
	f.submit(t, "batch", tasks...)

	// claim claims one task, retrying while the pool's connections broken
	// by a crash fail.
	claim := func(t *testing.T) int64 {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			cands, _, err := f.s.Candidates(ctx, 1, nil)
			if err == nil && len(cands) > 0 {
				var cs []Claimed
				cs, err = f.s.ClaimPicks(ctx, []Pick{{TaskID: cands[0].TaskID, Worker: f.worker}}, time.Minute)
				if err == nil && len(cs) == 1 {
					return cs[0].Attempt
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no claim: %v", err)
			}
		}
	}
	restart := func(t *testing.T, crash bool) {
		t.Helper()
		if crash {
			pg.Crash()
		} else if err := pg.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if pg, err = pgembed.Start(ctx, pgembed.Config{Dir: dir, Port: port}); err != nil {
			t.Fatal(err)
		}
	}
	jumped := func(before, after int64) bool { return after > before+attemptIDGap/2 }

	claim(t)
	for _, step := range []struct {
		name  string
		do    func(t *testing.T)
		jumps bool
	}{
		{"new connections", func(t *testing.T) { f.s.pool.Reset() }, false},
		{"clean restart", func(t *testing.T) { restart(t, false) }, false},
		{"server crash", func(t *testing.T) { restart(t, true) }, true},
		{"a backend killed", func(t *testing.T) {
			var pid int
			if err := f.s.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			// The server resets itself and runs crash recovery, without
			// a restart.
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(step.name, func(t *testing.T) {
			claim(t) // claims that may be lost
			before := claim(t)
			step.do(t)
			after := claim(t)
			if jumped(before, after) != step.jumps {
				t.Errorf("attempt id %d before, %d after: jumped = %v, want %v", before, after, !step.jumps, step.jumps)
			}
			if after <= before {
				t.Errorf("attempt id %d after, not above %d before", after, before)
			}
		})
	}
}
