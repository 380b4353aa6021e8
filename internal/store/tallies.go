package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// tallies gathers what completions count for the dashboard, the tasks done
// per minute (Activity) and each worker's successful attempts
// (WorkerTasks), so that FlushTallies writes them in one statement every
// few seconds instead of each completion upserting the same rows on the
// path of every task. What a replica gathered after its last flush is lost
// if it dies: these are display counts, not results.
type tallies struct {
	mu        sync.Mutex
	done      map[time.Time]int64 // minute -> tasks done
	succeeded map[string]int64    // worker id -> successful attempts
}

// add counts done tasks done at the minute of now, and one success for
// each element of workers.
func (t *tallies) add(now time.Time, done int, workers []string) {
	if done == 0 && len(workers) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if done > 0 {
		if t.done == nil {
			t.done = map[time.Time]int64{}
		}
		t.done[now.UTC().Truncate(time.Minute)] += int64(done)
	}
	for _, w := range workers {
		if t.succeeded == nil {
			t.succeeded = map[string]int64{}
		}
		t.succeeded[w]++
	}
}

// take returns what was gathered and starts anew.
func (t *tallies) take() (done map[time.Time]int64, succeeded map[string]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	done, succeeded = t.done, t.succeeded
	t.done, t.succeeded = nil, nil
	return done, succeeded
}

// putBack returns counts that could not be written, for the next flush.
func (t *tallies) putBack(done map[time.Time]int64, succeeded map[string]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for m, n := range done {
		if t.done == nil {
			t.done = map[time.Time]int64{}
		}
		t.done[m] += n
	}
	for w, n := range succeeded {
		if t.succeeded == nil {
			t.succeeded = map[string]int64{}
		}
		t.succeeded[w] += n
	}
}

// FlushTallies adds the tasks done and the successes counted since the last
// flush to tasks_done_minutes and worker_results, in one statement (the
// server calls it every few seconds and when it stops). A worker whose
// record was pruned meanwhile is skipped. Counts that could not be written
// are kept for the next flush.
func (s *Store) FlushTallies(ctx context.Context) error {
	done, succeeded := s.tallies.take()
	if len(done) == 0 && len(succeeded) == 0 {
		return nil
	}
	minutes := slices.SortedFunc(maps.Keys(done), time.Time.Compare)
	counts := make([]int64, len(minutes))
	for i, m := range minutes {
		counts[i] = done[m]
	}
	workers := slices.Sorted(maps.Keys(succeeded)) // one lock order for every replica
	wcounts := make([]int64, len(workers))
	for i, w := range workers {
		wcounts[i] = succeeded[w]
	}
	_, err := s.pool.Exec(ctx, `WITH d AS (
			INSERT INTO tasks_done_minutes AS m (minute, n) SELECT * FROM unnest($1::timestamptz[], $2::bigint[])
			ON CONFLICT (minute) DO UPDATE SET n = m.n + excluded.n
		)
		INSERT INTO worker_results AS r (worker_id, succeeded)
		SELECT u.w, u.n FROM unnest($3::uuid[], $4::bigint[]) WITH ORDINALITY AS u(w, n, ord) JOIN workers w ON w.id = u.w ORDER BY u.ord
		ON CONFLICT (worker_id) DO UPDATE SET succeeded = r.succeeded + excluded.succeeded`,
		minutes, counts, uuidParams(workers), wcounts)
	if err != nil {
		s.tallies.putBack(done, succeeded)
		return fmt.Errorf("write the counts of tasks done: %w", err)
	}
	return nil
}
