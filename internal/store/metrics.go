package store

import (
	"context"
	"fmt"
)

// ActiveCounts returns the number of tasks in each unfinished state
// (blocked, ready, running) over all workflows, and the number of connected
// workers by kind. No index of tasks names the state (so that a completion
// is a HOT update: migrations/00011_tasks_done_in_place.sql), so the counts
// come from what is indexed, in time proportional to the unfinished work:
// the ready tasks from the queue (tasks_ready), the running ones through
// running_attempts, and the blocked ones as the rest of the unfinished
// tasks that running workflows count (tasks_left).
func (s *Store) ActiveCounts(ctx context.Context) (tasks map[string]int64, workers map[string]int64, err error) {
	var unfinished, ready, running int64
	if err := s.pool.QueryRow(ctx, `SELECT
			(SELECT coalesce(sum(tasks_left), 0) FROM workflows WHERE state = 'running'),
			(SELECT count(*) FROM tasks WHERE pending > 0 AND sort_key IS NOT NULL AND state = 'ready'),
			(SELECT count(DISTINCT t.id) FROM running_attempts r JOIN attempts a ON a.id = r.attempt_id
				JOIN tasks t ON t.id = a.task_id WHERE a.state = 'running' AND t.state = 'running')`).Scan(&unfinished, &ready, &running); err != nil {
		return nil, nil, fmt.Errorf("count active tasks: %w", err)
	}
	tasks = map[string]int64{StateBlocked: max(0, unfinished-ready-running), StateReady: ready, StateRunning: running}
	workers = map[string]int64{}
	rows, err := s.pool.Query(ctx, `SELECT kind, count(*) FROM workers WHERE connected GROUP BY kind`)
	if err != nil {
		return nil, nil, fmt.Errorf("count workers: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return nil, nil, fmt.Errorf("count workers: %w", err)
		}
		workers[k] = n
	}
	return tasks, workers, rows.Err()
}
