package store

import (
	"context"
	"fmt"
)

// ActiveCounts returns the number of tasks in each unfinished state
// (blocked, ready, running) over all workflows, and the number of connected
// workers by kind. Only a running workflow has unfinished tasks: they are
// counted among its tasks (no index of tasks names the state, so that a
// completion is a HOT update: migrations/00011_tasks_done_in_place.sql).
func (s *Store) ActiveCounts(ctx context.Context) (tasks map[string]int64, workers map[string]int64, err error) {
	tasks = map[string]int64{StateBlocked: 0, StateReady: 0, StateRunning: 0}
	rows, err := s.pool.Query(ctx, `SELECT t.state, count(*) FROM workflows w JOIN tasks t ON t.workflow_id = w.id
		WHERE w.state = 'running' AND t.state IN ('blocked', 'ready', 'running') GROUP BY t.state`)
	if err != nil {
		return nil, nil, fmt.Errorf("count active tasks: %w", err)
	}
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("count active tasks: %w", err)
		}
		tasks[st] = n
	}
	rows.Close()
	workers = map[string]int64{}
	rows, err = s.pool.Query(ctx, `SELECT kind, count(*) FROM workers WHERE connected GROUP BY kind`)
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
