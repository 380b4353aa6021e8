package store

import (
	"context"
	"slices"
	"testing"
	"time"
)

// Attempt ids drawn ahead come in ascending order, from one block until it
// runs out, and above the id they must be newer than: a block drawn
// before an attempt claimed since is left for a new one.
func TestAttemptIDsDrawnAhead(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	var b idBlock
	take := func(n int, newerThan int64) []int64 {
		t.Helper()
		ids, err := b.take(ctx, f.s.pool, n, newerThan)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != n || !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != n {
			t.Fatalf("drew %v: want %d distinct ids, ascending", ids, n)
		}
		if ids[0] <= newerThan {
			t.Fatalf("drew %v: want ids above %d", ids, newerThan)
		}
		return ids
	}
	first := take(3, 0)
	next := take(2, 0)
	if next[0] <= first[2] || next[1] >= first[0]+idBlockSize {
		t.Errorf("drew %v, then %v: want the next ids of the same block", first, next)
	}
	f.submit(t, "batch", f.task("a"))
	claimed := f.claim(t, 1, time.Minute)
	if len(claimed) != 1 {
		t.Fatalf("claimed %d attempts, want 1", len(claimed))
	}
	if newer := claimed[0].Attempt; newer < next[1] {
		t.Fatalf("attempt %d claimed after ids %v were drawn: the sequence went back", newer, next)
	}
	after := take(1, claimed[0].Attempt)
	if after[0] <= claimed[0].Attempt {
		t.Errorf("drew %v after attempt %d: want a newer id", after, claimed[0].Attempt)
	}
	if many := take(idBlockSize+5, 0); many[0] <= after[0] {
		t.Errorf("drew %d ids from %d after %d: want newer ones", len(many), many[0], after[0])
	}
}
