package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/pgembed"
)

// Claims commit without waiting for their WAL flush, so a crash of
// PostgreSQL can take back the last ones, and the sequence's advance with
// them. Attempt ids handed out after the restart must still never repeat
// one handed out before: the store moves the sequence on when it meets a
// server that restarted, and only then.
func TestAttemptIDsNeverRepeatAfterACrash(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	pg, err := pgembed.Start(ctx, pgembed.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	f := newFixtureAt(t, pg.URL())
	var tasks []NewTask
	for i := range 6 {
		tasks = append(tasks, f.task(fmt.Sprintf("t%d", i)))
	}
	f.submit(t, "batch", tasks...)

	first := f.claim(t, 1, time.Minute)[0].Attempt
	// New connections to the same server: no jump.
	f.s.pool.Reset()
	if next := f.claim(t, 1, time.Minute)[0].Attempt; next != first+1 {
		t.Fatalf("attempt after reconnecting to the same server = %d, want %d", next, first+1)
	}
	// Claims that may be lost in the crash.
	var last int64
	for _, c := range f.claim(t, 2, time.Minute) {
		last = max(last, c.Attempt)
	}

	port := pg.Port()
	pg.Crash()
	pg, err = pgembed.Start(ctx, pgembed.Config{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	var after []Claimed
	for deadline := time.Now().Add(30 * time.Second); ; {
		// The pool's old connections fail once each before new ones are made.
		cands, err := f.s.Candidates(ctx, 1)
		if err == nil && len(cands) > 0 {
			after, err = f.s.ClaimPicks(ctx, []Pick{{TaskID: cands[0].TaskID, Worker: f.worker}}, time.Minute)
			if err == nil && len(after) == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no claim after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := after[0].Attempt; got <= last+attemptIDGap/2 {
		t.Fatalf("first attempt after the crash = %d, want above %d (last before it %d, jump %d)", got, last+attemptIDGap/2, last, attemptIDGap)
	}
}
