package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Attempt is one attempt of a task as the API shows it.
type Attempt struct {
	ID           int64
	State        string
	Worker       string
	Reason       string
	StartedAt    time.Time
	EndedAt      *time.Time
	RestoredFrom int
	// Verdict is set on results of replicated tasks: valid, invalid or
	// unverified (accepted alone from a trusted worker).
	Verdict string
	// Superseded is true when the attempt ran on an upstream result that
	// re-verification overturned: its task was reset and ran again.
	Superseded bool
}

// Attempts lists the attempts of a task, oldest first.
func (s *Store) Attempts(ctx context.Context, ownerID int64, id, task string) ([]Attempt, error) {
	if !ValidText(task) {
		return nil, ErrNotFound
	}
	if _, err := s.ownedWorkflow(ctx, nil, ownerID, id); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT a.id, a.state, a.worker_id::text, a.reason, a.started_at, a.ended_at, a.restored_seq, coalesce(a.verdict, ''), a.superseded
		FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1 AND t.name = $2 ORDER BY a.id`, id, task)
	if err != nil {
		return nil, fmt.Errorf("list attempts: %w", err)
	}
	as, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.ID, &a.State, &a.Worker, &a.Reason, &a.StartedAt, &a.EndedAt, &a.RestoredFrom, &a.Verdict, &a.Superseded)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list attempts: %w", err)
	}
	if len(as) == 0 {
		var exists bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tasks WHERE workflow_id = $1 AND name = $2)`, id, task).Scan(&exists); err != nil {
			return nil, fmt.Errorf("list attempts: %w", err)
		}
		if !exists {
			return nil, ErrNotFound
		}
	}
	return as, nil
}

// Output returns one output of a task: its bytes, or the id of the blob
// it was uploaded as (then data is empty; OpenBlob reads it).
func (s *Store) Output(ctx context.Context, ownerID int64, id, task, output string) (data []byte, blob string, err error) {
	if !ValidText(task) || !ValidText(output) {
		return nil, "", ErrNotFound
	}
	if _, err := s.ownedWorkflow(ctx, nil, ownerID, id); err != nil {
		return nil, "", err
	}
	// A done task without a stdout row has an empty stdout (implied).
	err = s.pool.QueryRow(ctx, `SELECT coalesce(o.data, ''), coalesce(o.blob_id, '') FROM tasks t
		LEFT JOIN task_outputs o ON o.task_id = t.id AND o.name = $3
		WHERE t.workflow_id = $1 AND t.name = $2 AND (o.task_id IS NOT NULL OR ($3 = '`+Stdout+`' AND t.state = 'done'))`,
		id, task, output).Scan(&data, &blob)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, "", ErrNotFound
	}
	if err != nil {
		return nil, "", fmt.Errorf("read output: %w", err)
	}
	return data, blob, nil
}

// Log returns the log of a task's latest finished attempt.
func (s *Store) Log(ctx context.Context, ownerID int64, id, task string) ([]byte, error) {
	if !ValidText(task) {
		return nil, ErrNotFound
	}
	if _, err := s.ownedWorkflow(ctx, nil, ownerID, id); err != nil {
		return nil, err
	}
	var log []byte
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT a.log FROM attempts a WHERE a.task_id = t.id AND a.log IS NOT NULL ORDER BY a.id DESC LIMIT 1), '')
		FROM tasks t WHERE t.workflow_id = $1 AND t.name = $2`, id, task).Scan(&log)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	return log, nil
}
