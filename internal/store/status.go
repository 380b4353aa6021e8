package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Counts holds the number of tasks in each state.
type Counts struct {
	Blocked        int
	Ready          int
	Running        int
	Done           int
	Failed         int
	UpstreamFailed int
	Cancelled      int
}

func (c *Counts) add(state string, n int) {
	switch state {
	case StateBlocked:
		c.Blocked += n
	case StateReady:
		c.Ready += n
	case StateRunning:
		c.Running += n
	case StateDone:
		c.Done += n
	case StateFailed:
		c.Failed += n
	case StateUpstreamFailed:
		c.UpstreamFailed += n
	case StateCancelled:
		c.Cancelled += n
	}
}

// OutputInfo names one output of a task.
type OutputInfo struct {
	Name string
	Size int
}

// TaskStatus is a task as the API shows it.
type TaskStatus struct {
	Name        string
	State       string
	Attempts    int
	MaxAttempts int
	Progress    float64
	Module      string
	Checkpoints int
	// CheckpointAt is when the latest checkpoint was saved (null: none).
	CheckpointAt *time.Time
	// Worker is the id of the worker running the task's latest running
	// attempt, or for a done task of the worker whose result was
	// accepted (the latest, with replicas); "" otherwise.
	Worker     string
	StartedAt  *time.Time
	FinishedAt *time.Time
	Error      string
	// Disputed is true when the task's result was accepted alone from a
	// worker that later lost a quorum, after the workflow had finished, so
	// it could not be re-checked (docs/WORKFLOW.md, "Result verification").
	Disputed  bool
	Outputs   []OutputInfo
	UpdatedAt time.Time
}

// WorkflowStatus is a workflow as the API shows it.
type WorkflowStatus struct {
	ID         string
	Name       string
	Priority   string
	State      string
	CreatedAt  time.Time
	FinishedAt *time.Time
	TaskCount  int
	Replicas   int
	Quorum     int
	// Efficiency and SuggestedParallelism are Heymann et al.'s resource
	// efficiency and worker count for >= 80% efficiency (status of one
	// workflow only; null until an attempt succeeded).
	Efficiency           *float64
	SuggestedParallelism *int
	// Notice is what the server has to say of itself that holds the
	// workflow up (status of one workflow only): its database cannot
	// store results now, say. Set by the server, not read from the
	// database.
	Notice string
	Counts *Counts
	Tasks  []TaskStatus
}

// ownedWorkflow reads a workflow's summary, or ErrNotFound when it does not
// exist or belongs to another owner.
func (s *Store) ownedWorkflow(ctx context.Context, q pgx.Tx, ownerID int64, id string) (*WorkflowStatus, error) {
	if !looksLikeUUID(id) {
		return nil, ErrNotFound
	}
	var row pgx.Row
	if q != nil {
		row = q.QueryRow(ctx, ownedWorkflowSQL, id, ownerID)
	} else {
		row = s.pool.QueryRow(ctx, ownedWorkflowSQL, id, ownerID)
	}
	return scanOwnedWorkflow(row, id)
}

// ownedWorkflowSQL reads the workflow $1 of owner $2.
const ownedWorkflowSQL = workflowSQL + ` AND owner_id = $2`

// workflowSQL reads the workflow $1 (scanOwnedWorkflow).
const workflowSQL = `SELECT id::text, name, priority, state, created_at, finished_at, task_count, replicas, quorum
	FROM workflows WHERE id = $1`

// The statements of status for a workflow $1 that has finished, of any
// owner (the owner's waiter looked first): each reads nothing while the
// workflow runs. completeFast queues them for the workflows it is asked
// to watch (CompleteWatching).
const (
	finishedWorkflowSQL = workflowSQL + ` AND state <> 'running'`
	finishedTasksSQL    = taskStatusSQL + ` WHERE t.workflow_id = $1 AND EXISTS (SELECT 1 FROM workflows w WHERE w.id = $1 AND w.state <> 'running')
	ORDER BY t.id`
	finishedSpansSQL = workflowSpansSQL + ` AND EXISTS (SELECT 1 FROM workflows w WHERE w.id = $1 AND w.state <> 'running') ORDER BY a.id`
)

func scanOwnedWorkflow(row pgx.Row, id string) (*WorkflowStatus, error) {
	w := &WorkflowStatus{}
	err := row.Scan(&w.ID, &w.Name, &w.Priority, &w.State, &w.CreatedAt, &w.FinishedAt, &w.TaskCount, &w.Replicas, &w.Quorum)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read workflow %s: %w", id, err)
	}
	return w, nil
}

// Summary returns an owner's workflow without its tasks (ErrNotFound when
// it does not exist or belongs to another owner): one row, for a look at
// its state.
func (s *Store) Summary(ctx context.Context, ownerID int64, id string) (*WorkflowStatus, error) {
	return s.ownedWorkflow(ctx, nil, ownerID, id)
}

// looksLikeUUID reports whether s is a UUID in its canonical 36-character
// form (the only one ids are written in), before it reaches PostgreSQL.
func looksLikeUUID(s string) bool {
	return len(s) == 36 && uuid.Validate(s) == nil
}

// ValidText reports whether s is text PostgreSQL can hold: valid UTF-8
// without NUL. A name or search that is not (a path or query from a
// client) matches nothing stored, and is refused as data to store, before
// it reaches the database, whose refusal would be a server error.
func ValidText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// runningAttemptSQL joins a task (t) to its latest running attempt (ra:
// progress, worker), if any, or for a done task to the latest attempt
// whose result counted (its worker is the one that ran it).
const runningAttemptSQL = ` LEFT JOIN LATERAL (SELECT a.progress, a.worker_id::text AS worker FROM attempts a
		WHERE a.task_id = t.id AND (a.state = 'running' OR t.state = 'done' AND a.state = 'succeeded' AND NOT a.superseded)
		ORDER BY a.state = 'running' DESC, a.id DESC LIMIT 1) ra ON true`

// spansSQL reads the attempts of workflow $1 of owner $2 (none when the
// workflow is another owner's), in the order they started.
const spansSQL = workflowSpansSQL + ` AND EXISTS (SELECT 1 FROM workflows w WHERE w.id = $1 AND w.owner_id = $2) ORDER BY a.id`

const taskStatusSQL = `SELECT t.name, t.state, t.attempts, t.max_attempts,
	CASE WHEN t.state = 'done' THEN 1 ELSE coalesce(ra.progress, 0) END,
	t.module_id, t.checkpoint_seq, t.checkpoint_at, coalesce(ra.worker, ''), t.started_at, t.finished_at, t.error, t.disputed, t.updated_at,
	coalesce(outs.names, '{}'), coalesce(outs.sizes, '{}')
	FROM tasks t` + runningAttemptSQL + taskOutputsSQL

// taskOutputsSQL joins a task (t) to the names and sizes of its outputs
// (outs), sorted by name: its task_outputs rows, and the empty stdout a
// done task has without a row (implied).
const taskOutputsSQL = ` LEFT JOIN LATERAL (SELECT array_agg(x.name ORDER BY x.name) AS names, array_agg(x.size ORDER BY x.name) AS sizes
		FROM (SELECT o.name, coalesce((SELECT b.size FROM blobs b WHERE b.id = o.blob_id), length(o.data)) AS size FROM task_outputs o WHERE o.task_id = t.id
			UNION ALL SELECT '` + Stdout + `', 0 WHERE t.state = 'done'
				AND NOT EXISTS (SELECT 1 FROM task_outputs o WHERE o.task_id = t.id AND o.name = '` + Stdout + `')) x) outs ON true`

// workflowTasksSQL reads the tasks of workflow $1 of owner $2 (none when
// the workflow is another owner's), in submission order.
const workflowTasksSQL = taskStatusSQL + ` WHERE t.workflow_id = $1 AND EXISTS (SELECT 1 FROM workflows w WHERE w.id = $1 AND w.owner_id = $2)
	ORDER BY t.id`

func scanTaskStatus(rows pgx.Rows) ([]TaskStatus, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (TaskStatus, error) {
		var t TaskStatus
		var progress float32
		var names []string
		var sizes []int32
		err := r.Scan(&t.Name, &t.State, &t.Attempts, &t.MaxAttempts, &progress, &t.Module, &t.Checkpoints,
			&t.CheckpointAt, &t.Worker, &t.StartedAt, &t.FinishedAt, &t.Error, &t.Disputed, &t.UpdatedAt, &names, &sizes)
		t.Progress = float64(progress)
		t.Outputs = make([]OutputInfo, len(names))
		for i := range names {
			t.Outputs[i] = OutputInfo{Name: names[i], Size: int(sizes[i])}
		}
		return t, err
	})
}

// Status returns a workflow with all its tasks, in submission order.
func (s *Store) Status(ctx context.Context, ownerID int64, id string) (*WorkflowStatus, error) {
	w, _, err := s.status(ctx, ownerID, id, false)
	return w, err
}

// StatusAndSpans is Status plus the spans of the workflow's attempts
// (WorkflowSpans), read in the same round trip.
func (s *Store) StatusAndSpans(ctx context.Context, ownerID int64, id string) (*WorkflowStatus, []AttemptSpan, error) {
	return s.status(ctx, ownerID, id, true)
}

// status reads a workflow, its tasks and, when spans is set, its attempts'
// spans, the queries pipelined in one round trip (a status is the answer
// an owner waits for when a workflow ends). The task and span queries name
// the owner too, so another owner's workflow yields nothing at all.
func (s *Store) status(ctx context.Context, ownerID int64, id string, spans bool) (*WorkflowStatus, []AttemptSpan, error) {
	if !looksLikeUUID(id) {
		return nil, nil, ErrNotFound
	}
	b := &pgx.Batch{}
	b.Queue(ownedWorkflowSQL, id, ownerID)
	b.Queue(workflowTasksSQL, id, ownerID)
	if spans {
		b.Queue(spansSQL, id, ownerID)
	}
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	return readStatus(br, id, spans)
}

// readStatus reads a workflow's status from the results of its statements
// in br (status's, or completeFast's for a watched workflow): the
// workflow, its tasks and, with spans, its attempts' spans. It reads all
// of them, whatever the first says (ErrNotFound when it found nothing).
func readStatus(br pgx.BatchResults, id string, spans bool) (*WorkflowStatus, []AttemptSpan, error) {
	w, err := scanOwnedWorkflow(br.QueryRow(), id)
	if err != nil {
		rest := 1
		if spans {
			rest = 2
		}
		for range rest {
			if rows, qerr := br.Query(); qerr == nil {
				rows.Close()
			}
		}
		return nil, nil, err
	}
	rows, err := br.Query()
	if err == nil {
		w.Tasks, err = scanTaskStatus(rows)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read tasks of %s: %w", id, err)
	}
	w.Counts = &Counts{}
	for _, t := range w.Tasks {
		w.Counts.add(t.State, 1)
	}
	if !spans {
		return w, nil, nil
	}
	rows, err = br.Query()
	var sp []AttemptSpan
	if err == nil {
		sp, err = scanSpans(rows)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read attempts of %s: %w", id, err)
	}
	return w, sp, nil
}

// TaskChanges returns the tasks of a workflow changed since since, plus every
// running task (whose progress moves without a change of row). It leaves
// out outputs: event streams do not carry them.
func (s *Store) TaskChanges(ctx context.Context, id string, since time.Time) ([]TaskStatus, error) {
	rows, err := s.pool.Query(ctx, taskChangesSQL, id, since)
	if err != nil {
		return nil, fmt.Errorf("read task changes of %s: %w", id, err)
	}
	ts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TaskStatus, error) {
		var t TaskStatus
		var progress float32
		err := r.Scan(&t.Name, &t.State, &t.Attempts, &t.MaxAttempts, &progress, &t.Checkpoints, &t.CheckpointAt, &t.Worker, &t.Error, &t.UpdatedAt)
		t.Progress = float64(progress)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("read task changes of %s: %w", id, err)
	}
	return ts, nil
}

// taskChangesSQL reads the tasks of workflow $1 changed since $2, and the
// running ones.
const taskChangesSQL = `SELECT t.name, t.state, t.attempts, t.max_attempts,
	CASE WHEN t.state = 'done' THEN 1 WHEN t.state = 'running' THEN coalesce(ra.progress, 0) ELSE 0 END,
	t.checkpoint_seq, t.checkpoint_at, coalesce(ra.worker, ''), t.error, t.updated_at
	FROM tasks t` + runningAttemptSQL + ` WHERE t.workflow_id = $1 AND (t.updated_at > $2 OR t.state = 'running') ORDER BY t.id`

// WorkflowState returns the state of a workflow (no owner check: callers
// checked it already).
func (s *Store) WorkflowState(ctx context.Context, id string) (string, error) {
	var st string
	err := s.pool.QueryRow(ctx, `SELECT state FROM workflows WHERE id = $1`, id).Scan(&st)
	if err != nil {
		return "", fmt.Errorf("read workflow state %s: %w", id, err)
	}
	return st, nil
}

// ListOptions filters List.
type ListOptions struct {
	State  string
	Query  string // substring of the name
	Prefix string // start of the id: lower-case hex digits and dashes only (ValidIDPrefix)
	Limit  int
	Offset int
}

// ValidIDPrefix reports whether p may start a workflow id: 1 to 36
// lower-case hex digits and dashes.
func ValidIDPrefix(p string) bool {
	if p == "" || len(p) > 36 {
		return false
	}
	for _, c := range p {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '-') {
			return false
		}
	}
	return true
}

// List returns an owner's workflows, newest first, and the total matching.
func (s *Store) List(ctx context.Context, ownerID int64, o ListOptions) ([]WorkflowStatus, int, error) {
	if o.Limit <= 0 || o.Limit > 500 {
		o.Limit = 50
	}
	if !ValidText(o.Query) {
		return []WorkflowStatus{}, 0, nil // no name holds it
	}
	rows, err := s.pool.Query(ctx, `SELECT id::text, name, priority, state, created_at, finished_at, task_count, replicas, quorum, count(*) OVER ()
		FROM workflows WHERE owner_id = $1 AND ($2 = '' OR state = $2) AND ($3 = '' OR strpos(lower(name), lower($3)) > 0)
			AND ($6 = '' OR left(id::text, length($6)) = $6)
		ORDER BY created_at DESC, id LIMIT $4 OFFSET $5`, ownerID, o.State, o.Query, o.Limit, o.Offset, o.Prefix)
	if err != nil {
		return nil, 0, fmt.Errorf("list workflows: %w", err)
	}
	total := 0
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkflowStatus, error) {
		var w WorkflowStatus
		err := r.Scan(&w.ID, &w.Name, &w.Priority, &w.State, &w.CreatedAt, &w.FinishedAt, &w.TaskCount, &w.Replicas, &w.Quorum, &total)
		return w, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("list workflows: %w", err)
	}
	if len(ws) == 0 {
		return ws, total, nil
	}
	ids := make([]string, len(ws))
	byID := map[string]*WorkflowStatus{}
	for i := range ws {
		ids[i] = ws[i].ID
		ws[i].Counts = &Counts{}
		byID[ws[i].ID] = &ws[i]
	}
	rows, err = s.pool.Query(ctx, `SELECT workflow_id::text, state, count(*) FROM tasks WHERE workflow_id = ANY($1::uuid[]) GROUP BY 1, 2`, ids)
	if err != nil {
		return nil, 0, fmt.Errorf("count tasks of workflows: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, state string
		var n int
		if err := rows.Scan(&id, &state, &n); err != nil {
			return nil, 0, fmt.Errorf("count tasks of workflows: %w", err)
		}
		byID[id].Counts.add(state, n)
	}
	return ws, total, rows.Err()
}
