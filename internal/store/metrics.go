package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// activeCountsSQL counts the tasks of running workflows that are
// unfinished, ready (the queue), and running (through running_attempts).
const activeCountsSQL = `SELECT
	(SELECT coalesce(sum(tasks_left), 0) FROM workflows WHERE state = 'running'),
	(SELECT count(*) FROM tasks WHERE pending > 0 AND sort_key IS NOT NULL AND state = 'ready'),
	(SELECT count(DISTINCT t.id) FROM running_attempts r JOIN attempts a ON a.id = r.attempt_id
		JOIN tasks t ON t.id = a.task_id WHERE a.state = 'running' AND t.state = 'running')`

// ActiveCounts returns the number of tasks in each unfinished state
// (blocked, ready, running) over all workflows, and the number of connected
// workers by kind. No index of tasks names the state (so that a completion
// is a HOT update: migrations/00011_tasks_done_in_place.sql), so the counts
// come from what is indexed, in time proportional to the unfinished work:
// the ready tasks from the queue (tasks_ready), the running ones through
// running_attempts, and the blocked ones as the rest of the unfinished
// tasks that running workflows count (tasks_left). The statement runs with
// the hot path's settings (queueBegin): with statistics taken while many
// tasks were ready or running, PostgreSQL otherwise scanned every task and
// every attempt ever kept, 35 ms at every scrape of /metrics after a
// 62,000-task benchmark, in proportion to all the history.
func (s *Store) ActiveCounts(ctx context.Context) (tasks map[string]int64, workers map[string]int64, err error) {
	var unfinished, ready, running int64
	b := &pgx.Batch{}
	queueBegin(b, false)
	b.Queue(activeCountsSQL)
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	err = execBegin(br)
	if err == nil {
		err = br.QueryRow().Scan(&unfinished, &ready, &running)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
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

// ConnectedWorkers counts the workers connected to any replica.
func (s *Store) ConnectedWorkers(ctx context.Context) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM workers WHERE connected`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count connected workers: %w", err)
	}
	return n, nil
}
