package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ModuleUse maps each of an owner's modules to the names of the owner's
// workflows whose tasks run it, newest first and at most five per module.
// Modules no workflow uses are left out.
func (s *Store) ModuleUse(ctx context.Context, ownerID int64) (map[string][]string, error) {
	rows, err := s.pool.Query(ctx, moduleUseSQL, ownerID)
	if err != nil {
		return nil, fmt.Errorf("module use: %w", err)
	}
	defer rows.Close()
	use := map[string][]string{}
	for rows.Next() {
		var m string
		var names []string
		if err := rows.Scan(&m, &names); err != nil {
			return nil, fmt.Errorf("module use: %w", err)
		}
		use[m] = names
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("module use: %w", err)
	}
	return use, nil
}

// moduleUseSQL reads the modules of owner $1's workflows from
// workflow_modules (one row per module of a workflow), not from the tasks:
// the dashboard's Modules page then reads as many rows as the owner has
// workflows, not as many as they have tasks.
const moduleUseSQL = `SELECT module_id, (array_agg(name ORDER BY created_at DESC))[1:5] FROM (
		SELECT DISTINCT m.module_id, w.name, w.created_at FROM workflows w JOIN workflow_modules m ON m.workflow_id = w.id WHERE w.owner_id = $1
	) u GROUP BY module_id`

// Edges returns the edges of the DAG of one of an owner's workflows, each
// as (upstream task name, downstream task name), once per pair however many
// inputs the downstream task reads from the upstream one. A workflow of
// another owner, or none, gives ErrNotFound.
func (s *Store) Edges(ctx context.Context, ownerID int64, id string) ([][2]string, error) {
	if _, err := s.ownedWorkflow(ctx, nil, ownerID, id); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT f.name, t.name FROM tasks t
		JOIN task_inputs i ON i.task_id = t.id JOIN tasks f ON f.id = i.from_task
		WHERE t.workflow_id = $1`, id)
	if err != nil {
		return nil, fmt.Errorf("edges of workflow %s: %w", id, err)
	}
	edges, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var e [2]string
		err := r.Scan(&e[0], &e[1])
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("edges of workflow %s: %w", id, err)
	}
	return edges, nil
}

// WorkerTasks is what a connected worker has done and runs, as one owner
// may see it.
type WorkerTasks struct {
	// Succeeded counts the worker's successful attempts over its life, for
	// every owner, as of the replicas' last FlushTallies (a few seconds).
	Succeeded int64
	// Running names the attempts it runs now: "workflow / task" for the
	// owner's own workflows, "(another project)" for the others.
	Running []string
}

// WorkerTasks maps every connected worker's id to its WorkerTasks, with
// task names shown only for ownerID's workflows.
func (s *Store) WorkerTasks(ctx context.Context, ownerID int64) (map[string]WorkerTasks, error) {
	rows, err := s.pool.Query(ctx, `SELECT w.id::text,
			coalesce((SELECT r.succeeded FROM worker_results r WHERE r.worker_id = w.id), 0),
			coalesce((SELECT array_agg(CASE WHEN wf.owner_id = $1 THEN wf.name || ' / ' || t.name ELSE '(another project)' END ORDER BY a.id)
				FROM running_attempts ra JOIN attempts a ON a.id = ra.attempt_id JOIN tasks t ON t.id = a.task_id
				JOIN workflows wf ON wf.id = t.workflow_id
				WHERE a.worker_id = w.id AND a.state = 'running'), '{}')
		FROM workers w WHERE w.connected`, ownerID)
	if err != nil {
		return nil, fmt.Errorf("tasks of workers: %w", err)
	}
	defer rows.Close()
	out := map[string]WorkerTasks{}
	for rows.Next() {
		var id string
		var wt WorkerTasks
		if err := rows.Scan(&id, &wt.Succeeded, &wt.Running); err != nil {
			return nil, fmt.Errorf("tasks of workers: %w", err)
		}
		out[id] = wt
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tasks of workers: %w", err)
	}
	return out, nil
}

// ActivityMinute is one minute of the platform's recent activity.
type ActivityMinute struct {
	Minute    time.Time // its start
	TasksDone int       // tasks of every owner that ended done in it
	Workers   int       // workers connected at any time in it
}

// Activity returns the last n minutes (1 to 1440) of activity, oldest
// first, the last one being the current, unfinished minute. Connections
// come from worker_sessions, tasks from tasks_done_minutes, which each
// replica adds its completions to every few seconds (FlushTallies).
func (s *Store) Activity(ctx context.Context, n int) ([]ActivityMinute, error) {
	n = min(max(n, 1), 1440)
	rows, err := s.pool.Query(ctx, `WITH m AS (
			SELECT generate_series(date_trunc('minute', now()) - ($1 - 1) * interval '1 minute', date_trunc('minute', now()), interval '1 minute') AS minute),
		done AS (
			SELECT minute, n FROM tasks_done_minutes WHERE minute >= date_trunc('minute', now()) - ($1 - 1) * interval '1 minute'),
		sess AS (
			SELECT worker_id, connected_at, coalesce(disconnected_at, now()) AS until FROM worker_sessions
			WHERE disconnected_at IS NULL OR disconnected_at >= date_trunc('minute', now()) - ($1 - 1) * interval '1 minute')
		SELECT m.minute, coalesce(done.n, 0),
			(SELECT count(DISTINCT worker_id) FROM sess WHERE sess.connected_at < m.minute + interval '1 minute' AND sess.until >= m.minute)
		FROM m LEFT JOIN done ON done.minute = m.minute ORDER BY m.minute`, n)
	if err != nil {
		return nil, fmt.Errorf("read activity: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ActivityMinute, error) {
		var a ActivityMinute
		err := r.Scan(&a.Minute, &a.TasksDone, &a.Workers)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("read activity: %w", err)
	}
	return out, nil
}
