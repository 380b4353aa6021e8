package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Cancel cancels every unfinished task of a workflow, ends its running
// attempts as cancelled and tells every replica (ChannelCancel) to stop them
// on their workers. It returns the workflow status after the change and the
// attempts that were running.
func (s *Store) Cancel(ctx context.Context, ownerID int64, id string) ([]int64, error) {
	var attempts []int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		attempts = nil
		// Lock the workflow first and decide on its state under the lock, so
		// that a workflow finishing meanwhile is not overwritten.
		state, err := lockWorkflow(ctx, tx, ownerID, id)
		if err != nil {
			return err
		}
		if state != StateRunning {
			return nil
		}
		// Tasks before attempts: a claim that commits while this waits for
		// its task rows is then seen by the attempts statement below.
		rows, err := tx.Query(ctx, `UPDATE tasks SET state = 'cancelled', pending = 0, finished_at = now(), updated_at = now(),
				checkpoint = NULL, checkpoint_blob = NULL
			WHERE workflow_id = $1 AND state IN ('blocked', 'ready', 'running') RETURNING id`, id)
		if err != nil {
			return err
		}
		tasks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `UPDATE attempts SET state = 'cancelled', ended_at = now(), reason = 'workflow cancelled'
			WHERE task_id = ANY($1) AND state = 'running' RETURNING id`, tasks)
		if err != nil {
			return err
		}
		if attempts, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE workflows SET state = 'cancelled', finished_at = now(), tasks_left = 0 WHERE id = $1`, id); err != nil {
			return err
		}
		return notifyCancel(ctx, tx, attempts)
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("cancel workflow %s: %w", id, err)
	}
	return attempts, nil
}

// ErrTaskFinished is returned when cancelling a task that already reached a
// final state (done, failed, upstream_failed or cancelled).
// Its message completes the error that wraps it: `task "sum" is already
// done: nothing to cancel`.
var ErrTaskFinished = errors.New("nothing to cancel")

// CancelTask cancels one unfinished task of an owner's workflow: the task
// ends cancelled, its running attempts (replicas included) end cancelled
// and every replica is told (ChannelCancel) to stop them on their workers,
// as Cancel does for a whole workflow. The task's descendants cannot run
// without its outputs: they end upstream_failed, as below a failed task.
// A cancelled task counts as a failure of its workflow, which therefore
// ends failed once its other tasks finish (or at once, when it was the
// last). The other tasks run on.
//
// A task that already finished is left alone: the error wraps
// ErrTaskFinished and says its state. An unknown task, or a workflow of
// another owner, gives ErrNotFound. It returns the attempts that were
// running.
func (s *Store) CancelTask(ctx context.Context, ownerID int64, id, task string) ([]int64, error) {
	var attempts []int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		attempts = nil
		if !looksLikeUUID(id) || !ValidText(task) {
			return ErrNotFound
		}
		// Lock the task row first, as completions and claims do, and decide
		// on its state under the lock.
		var taskID int64
		var state string
		err := tx.QueryRow(ctx, `SELECT t.id, t.state FROM tasks t JOIN workflows w ON w.id = t.workflow_id
			WHERE w.id = $1 AND w.owner_id = $2 AND t.name = $3 FOR UPDATE OF t`, id, ownerID, task).Scan(&taskID, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		switch state {
		case StateBlocked, StateReady, StateRunning:
		default:
			return fmt.Errorf("task %q is already %s: %w", task, state, ErrTaskFinished)
		}
		if _, err := tx.Exec(ctx, `UPDATE tasks SET state = 'cancelled', pending = 0, finished_at = now(), updated_at = now(),
			error = 'cancelled by the owner', checkpoint = NULL, checkpoint_blob = NULL WHERE id = $1`, taskID); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE attempts SET state = 'cancelled', ended_at = now(), reason = 'task cancelled'
			WHERE task_id = $1 AND state = 'running' RETURNING id`, taskID)
		if err != nil {
			return err
		}
		if attempts, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return err
		}
		var below int
		if err := tx.QueryRow(ctx, `WITH RECURSIVE down(id) AS (
				SELECT task_id FROM task_inputs WHERE from_task = $1
				UNION SELECT ti.task_id FROM task_inputs ti JOIN down ON ti.from_task = down.id),
			failed AS (UPDATE tasks SET state = 'upstream_failed', pending = 0, finished_at = now(), updated_at = now(),
					error = format('upstream task %s was cancelled', $2::text)
				WHERE id IN (SELECT id FROM down) AND state = 'blocked' RETURNING 1)
			SELECT count(*) FROM failed`, taskID, task).Scan(&below); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE workflows SET tasks_left = tasks_left - $2, tasks_failed = tasks_failed + $2,
				state = CASE WHEN tasks_left - $2 > 0 THEN state ELSE 'failed' END,
				finished_at = CASE WHEN tasks_left - $2 > 0 THEN NULL ELSE now() END
			WHERE id = $1 AND state = 'running'`, id, 1+below); err != nil {
			return err
		}
		return notifyCancel(ctx, tx, attempts)
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrTaskFinished) {
			return nil, err
		}
		return nil, fmt.Errorf("cancel task %q of workflow %s: %w", task, id, err)
	}
	return attempts, nil
}

// notifyCancel sends the attempt ids on ChannelCancel in chunks that fit a
// NOTIFY payload.
func notifyCancel(ctx context.Context, tx querier, attempts []int64) error {
	var b strings.Builder
	flush := func() error {
		if b.Len() == 0 {
			return nil
		}
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, ChannelCancel, b.String())
		b.Reset()
		return err
	}
	for _, a := range attempts {
		if b.Len() > 7000 {
			if err := flush(); err != nil {
				return err
			}
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, a)
	}
	return flush()
}

// ErrWorkflowRunning refuses to delete a workflow that has not ended.
var ErrWorkflowRunning = errors.New("the workflow is still running: cancel it first")

// workflowBlobsSQL deletes the uploads of the attempts of workflow $1's
// tasks and returns every blob the workflow holds: the data it reads, its
// tasks' outputs and checkpoints uploaded over HTTP, and those uploads.
const workflowBlobsSQL = `WITH t AS (SELECT id, checkpoint_blob FROM tasks WHERE workflow_id = $1),
up AS (DELETE FROM output_uploads u USING attempts a, t WHERE a.task_id = t.id AND u.attempt_id = a.id RETURNING u.blob_id)
SELECT blob_id FROM workflow_blobs WHERE workflow_id = $1
UNION SELECT o.blob_id FROM task_outputs o JOIN t ON o.task_id = t.id WHERE o.blob_id IS NOT NULL
UNION SELECT checkpoint_blob FROM t WHERE checkpoint_blob IS NOT NULL
UNION SELECT blob_id FROM up`

// DeleteWorkflow deletes the owner's workflow id, which must have ended
// (done, failed or cancelled: else ErrWorkflowRunning), with everything it
// holds: its tasks, their attempts, edges, outputs and checkpoints, and its
// hold on the data it read (which counts against the owner's data quota
// while it is held), and on the modules its tasks run (likewise). The
// blobs and modules nothing else holds then are deleted with it: the
// outputs and checkpoints its tasks uploaded, and data and modules the
// owner removed from its list. ErrNotFound when the owner has no such
// workflow.
func (s *Store) DeleteWorkflow(ctx context.Context, ownerID int64, id string) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		state, err := lockWorkflow(ctx, tx, ownerID, id)
		if err != nil {
			return err
		}
		if state == StateRunning {
			return ErrWorkflowRunning
		}
		rows, err := tx.Query(ctx, workflowBlobsSQL, id)
		if err != nil {
			return err
		}
		blobs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT module_id FROM workflow_modules WHERE workflow_id = $1`, id)
		if err != nil {
			return err
		}
		modules, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		// The tasks go with it, and their attempts, outputs and edges
		// with them (the triggers of migration 00013), and its modules'
		// rows in workflow_modules.
		if _, err := tx.Exec(ctx, `DELETE FROM workflows WHERE id = $1`, id); err != nil {
			return err
		}
		if err := dropUnusedBlobs(ctx, tx, blobs); err != nil {
			return err
		}
		return dropUnusedModules(ctx, tx, modules)
	})
	if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrWorkflowRunning) {
		return fmt.Errorf("delete workflow %s: %w", id, err)
	}
	return err
}

// lockWorkflow locks the owner's workflow id in tx and returns its state,
// or ErrNotFound.
func lockWorkflow(ctx context.Context, tx pgx.Tx, ownerID int64, id string) (string, error) {
	if !looksLikeUUID(id) {
		return "", ErrNotFound
	}
	var state string
	err := tx.QueryRow(ctx, `SELECT state FROM workflows WHERE id = $1 AND owner_id = $2 FOR UPDATE`, id, ownerID).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	return state, err
}
