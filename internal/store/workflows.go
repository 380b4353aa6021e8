package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// NewWorkflow is a validated workflow ready to be written.
type NewWorkflow struct {
	Name     string
	Priority string // "interactive" or "batch"
	Tasks    []NewTask
	// Replicas, Quorum and MaxReplicas are the result verification of
	// every task (0 counts as 1: no verification).
	Replicas    int
	Quorum      int
	MaxReplicas int
	// Blobs are the data blobs the tasks read (Setup), kept while the
	// workflow is.
	Blobs []string
}

// NewTask is one task of a NewWorkflow.
type NewTask struct {
	Name        string
	Module      string
	Args        []string
	Stdin       []byte     // inline stdin
	Inputs      []NewInput // files under /in, and stdin from a task (Name "")
	Seed        int64
	TimeoutMS   int64
	MaxAttempts int
	MemoryPages int
	OutputBytes int64
	LogBytes    int64
	CkptMS      int64
	// Setup is the task's protocol.Setup as JSON, nil when it has none.
	Setup []byte
}

// NewInput maps an output of an upstream task (by index in Tasks) to a file
// name under /in; Name "" means stdin.
type NewInput struct {
	Name   string
	From   int
	Output string
}

// Workflow and task states.
const (
	StateRunning        = "running"
	StateDone           = "done"
	StateFailed         = "failed"
	StateCancelled      = "cancelled"
	StateBlocked        = "blocked"
	StateReady          = "ready"
	StateUpstreamFailed = "upstream_failed"
)

// CreateWorkflow writes the whole DAG in one transaction and returns the
// workflow id. Tasks without upstream tasks are ready at once; the commit
// wakes the dispatchers of every replica.
func (s *Store) CreateWorkflow(ctx context.Context, ownerID int64, w *NewWorkflow) (string, error) {
	var id string
	var err error
	if w.Claimable() {
		var uid pgtype.UUID
		if uid, err = newUUID(); err == nil {
			id, _, err = s.createSmall(ctx, ownerID, w, uid, nil, 0)
		}
	} else {
		id, err = s.createLarge(ctx, ownerID, w)
	}
	if err != nil {
		return "", fmt.Errorf("create workflow %q: %w", w.Name, err)
	}
	// The planner's statistics are refreshed in the background, after the
	// answer (statsRefresher says why).
	s.stats.request(len(w.Tasks) >= analyzeAfterTasks, countEdges(w) >= analyzeAfterTasks)
	return id, nil
}

// createLarge writes a workflow in one transaction of a few round trips:
// the workflow row with the ids of its tasks, the tasks and edges with
// COPY, and the notification.
func (s *Store) createLarge(ctx context.Context, ownerID int64, w *NewWorkflow) (string, error) {
	var id string
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var now time.Time
		var ids []int64
		var uid pgtype.UUID // for COPY: a string would be parsed anew for every row
		// One round trip: the workflow row, its modules (whose keys
		// keep a module in use from being deleted:
		// migrations/00009_workflow_modules.sql), the transaction's time
		// and the ids of its tasks.
		if err := tx.QueryRow(ctx, `WITH wf AS (
				INSERT INTO workflows (owner_id, name, priority, task_count, tasks_left)
				VALUES ($1, $2, $3, $4, $4) RETURNING id, created_at
			), wm AS (
				INSERT INTO workflow_modules (workflow_id, module_id) SELECT wf.id, m FROM wf, unnest($5::text[]) m
			)
			SELECT id::text, id, created_at, (SELECT array_agg(nextval('tasks_id_seq')) FROM generate_series(1, $4)) FROM wf`,
			ownerID, w.Name, w.Priority, len(w.Tasks), distinctModules(w)).Scan(&id, &uid, &now, &ids); err != nil {
			return err
		}
		readyKey := now
		if w.Priority == "interactive" {
			readyKey = now.Add(-s.interactiveHeadStart)
		}
		ready := 0
		rows := make([][]any, len(w.Tasks))
		for i := range w.Tasks {
			t := &w.Tasks[i]
			deps := distinctDeps(t.Inputs)
			state, key := StateBlocked, (*time.Time)(nil)
			if deps == 0 {
				state, key = StateReady, &readyKey
				ready++
			}
			args := t.Args
			if args == nil {
				args = []string{}
			}
			rows[i] = []any{ids[i], uid, t.Name, t.Module, args, t.Stdin, w.Priority, state, deps, key,
				t.MaxAttempts, t.TimeoutMS, t.MemoryPages, t.OutputBytes, t.LogBytes, t.CkptMS, t.Seed, t.Setup}
		}
		if err := insertTasks(ctx, tx, rows); err != nil {
			return err
		}
		if len(w.Blobs) > 0 {
			// The blobs' keys keep them from collection while the
			// workflow is.
			if _, err := tx.Exec(ctx, `INSERT INTO workflow_blobs (workflow_id, blob_id) SELECT $1, b FROM unnest($2::text[]) b`,
				uid, w.Blobs); err != nil {
				return err
			}
		}
		if w.Replicas > 1 || w.Quorum > 1 {
			// Replicated tasks: a failed replica must not use up the
			// attempts of the others, so max_attempts grows by the extra
			// replicas.
			maxR := max(w.MaxReplicas, w.Replicas, w.Quorum)
			if _, err := tx.Exec(ctx, `WITH wf AS (UPDATE workflows SET replicas = $2, quorum = $3 WHERE id = $1)
				UPDATE tasks SET pending = $2, replicas = $2, quorum = $3, max_replicas = $4, max_attempts = max_attempts + $4 - 1
				WHERE workflow_id = $1`, id, max(w.Replicas, 1), max(w.Quorum, 1), maxR); err != nil {
				return err
			}
		}
		var edges [][]any
		for i, t := range w.Tasks {
			for _, in := range t.Inputs {
				edges = append(edges, []any{ids[i], in.Name, ids[in.From], in.Output})
			}
		}
		if len(edges) > 0 {
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{"task_inputs"}, []string{"task_id", "name", "from_task", "output"},
				pgx.CopyFromRows(edges)); err != nil {
				return err
			}
		}
		if ready > 0 {
			if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, ChannelReady); err != nil {
				return err
			}
		}
		return nil
	})
	return id, err
}

// smallWorkflow is the most tasks CreateWorkflow writes with createSmall.
const smallWorkflow = 64

// SubmitPick is a decision of the dispatcher's plan on a task of a
// workflow not written yet (CreateWorkflowClaiming): Task is its index in
// NewWorkflow.Tasks, which stands for its id in the plan.
type SubmitPick struct {
	Task   int
	Worker string
	// CkptMS overrides the task's checkpoint interval (0 keeps it).
	CkptMS int64
	// Solo starts this replica alone (as Pick.Solo).
	Solo bool
}

// Claimable reports whether CreateWorkflowClaiming takes w: a small
// workflow, written in one round trip, whose tasks have no setup (data
// and files are written by createLarge only).
func (w *NewWorkflow) Claimable() bool {
	if len(w.Tasks) > smallWorkflow || len(w.Blobs) > 0 {
		return false
	}
	for i := range w.Tasks {
		if w.Tasks[i].Setup != nil {
			return false
		}
	}
	return true
}

// CreateWorkflowClaiming is CreateWorkflow for a Claimable workflow whose
// ready tasks the submitting replica planned for its own idle workers
// before writing it (SubmissionCandidates): it claims picks in the
// submission's own transaction, as ClaimPicks would a moment later, and
// returns the attempts created, in attempt id order. On the path of every
// interactive task this saves the dispatcher's round and a transaction.
// The claims commit with the submission, its WAL flush included. Picks
// are taken as ClaimPicks takes them (replicas of a task go to distinct
// workers, at most its pending ones); picks of tasks that are not ready
// are ignored. When the picks leave ready tasks with replicas unclaimed,
// the commit's notification (ChannelReady) wakes every dispatcher, as for
// any submission; otherwise it sends none (a pick the claim refuses is the
// caller's to see: fewer attempts than picks).
func (s *Store) CreateWorkflowClaiming(ctx context.Context, ownerID int64, w *NewWorkflow, picks []SubmitPick, lease time.Duration) (
	id string, claimed []Claimed, err error) {
	if !w.Claimable() {
		return "", nil, fmt.Errorf("create workflow %q: %d tasks are too many to claim at submission", w.Name, len(w.Tasks))
	}
	uid, err := newUUID()
	if err != nil {
		return "", nil, err
	}
	id, claimed, err = s.createSmall(ctx, ownerID, w, uid, picks, lease)
	if err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			// The transaction may have committed, its answer lost.
			if id, rerr := s.recoverSubmission(ctx, uid); rerr == nil && id != "" {
				return id, nil, nil
			}
		}
		return "", nil, fmt.Errorf("create workflow %q: %w", w.Name, err)
	}
	return id, claimed, nil
}

// recoverSubmission settles a claiming submission whose transaction ended
// in an error that may have come after its commit (the connection lost
// with the COMMIT's answer, or the context ended while it was on its way).
// When the workflow uid was written after all, the attempts it claimed
// never reached their workers and nobody was told of its tasks: the
// attempts are ended without counting against their tasks or workers,
// which queues the tasks again and wakes the dispatchers, and it returns
// the workflow's id. It returns "" when the workflow was not written.
func (s *Store) recoverSubmission(ctx context.Context, uid pgtype.UUID) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT w.id::text, a.id, a.worker_id::text FROM workflows w
		LEFT JOIN tasks t ON t.workflow_id = w.id LEFT JOIN attempts a ON a.task_id = t.id AND a.state = 'running'
		WHERE w.id = $1`, uid)
	if err != nil {
		return "", fmt.Errorf("look for a submission: %w", err)
	}
	var id string
	var ends []Completion
	for rows.Next() {
		var attempt *int64
		var worker *string
		if err := rows.Scan(&id, &attempt, &worker); err != nil {
			rows.Close()
			return "", fmt.Errorf("look for a submission: %w", err)
		}
		if attempt != nil {
			ends = append(ends, Completion{Attempt: *attempt, Worker: *worker, Reason: "worker", End: EndUnstarted,
				Message: "the server lost the answer of the submission that claimed it: never sent"})
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("look for a submission: %w", err)
	}
	if _, err := s.Complete(ctx, ends); err != nil {
		return "", err // the leases lapse instead
	}
	return id, nil
}

// createSmall writes a small workflow (smallWorkflow tasks at most) in one
// round trip: BEGIN, one statement (createSmallSQL) and COMMIT, pipelined.
// A single task's submission is on the latency path of interactive work,
// and each round trip of the general path (workflow row, then tasks, edges
// and notification) costs as much as the rows of a small workflow.
//
// With picks, the same round trip claims them (claimNewSQL, between the
// statement and the COMMIT): the tasks are found by the workflow's id,
// made here rather than by PostgreSQL so that the claim can name it, and
// their names. It returns the attempts.
func (s *Store) createSmall(ctx context.Context, ownerID int64, w *NewWorkflow, uid pgtype.UUID, picks []SubmitPick, lease time.Duration) (
	id string, claimed []Claimed, err error) {
	n := len(w.Tasks)
	var (
		names, modules, args = make([]string, n), make([]string, n), make([]string, n)
		stdins               = make([][]byte, n)
		deps, maxAttempts    = make([]int32, n), make([]int32, n)
		pages                = make([]int32, n)
		timeouts, outBytes   = make([]int64, n), make([]int64, n)
		logBytes, ckpts      = make([]int64, n), make([]int64, n)
		seeds                = make([]int64, n)
		edgeTask, edgeFrom   []int32
		edgeName, edgeOutput []string
	)
	for i := range w.Tasks {
		t := &w.Tasks[i]
		a := t.Args
		if a == nil {
			a = []string{}
		}
		b, err := json.Marshal(a) // an array of arrays may be ragged, so each travels as JSON
		if err != nil {
			return "", nil, err
		}
		names[i], modules[i], args[i], stdins[i] = t.Name, t.Module, string(b), t.Stdin
		deps[i], maxAttempts[i], pages[i] = int32(distinctDeps(t.Inputs)), int32(t.MaxAttempts), int32(t.MemoryPages)
		timeouts[i], outBytes[i], logBytes[i], ckpts[i], seeds[i] = t.TimeoutMS, t.OutputBytes, t.LogBytes, t.CkptMS, t.Seed
		for _, in := range t.Inputs {
			edgeTask, edgeFrom = append(edgeTask, int32(i+1)), append(edgeFrom, int32(in.From+1))
			edgeName, edgeOutput = append(edgeName, in.Name), append(edgeOutput, in.Output)
		}
	}
	headStart := time.Duration(0)
	if w.Priority == "interactive" {
		headStart = s.interactiveHeadStart
	}
	replicas, quorum := max(w.Replicas, 1), max(w.Quorum, 1)
	maxR := 1
	if w.Replicas > 1 || w.Quorum > 1 { // as createLarge: MaxReplicas alone does not replicate
		maxR = max(w.MaxReplicas, w.Replicas, w.Quorum)
	}
	// The picks of ready tasks: the claim's arguments. need counts the
	// replicas of each ready task that no pick claims (a worker takes one
	// replica of a task at most, as in the claim).
	var pickNames, pickWorkers []string
	var pickCkpts []int64
	var pickSolos []bool
	need := make([]int, n)
	for i := range need {
		if deps[i] == 0 {
			need[i] = replicas
		}
	}
	type taskWorker struct {
		task   int
		worker string
	}
	counted := map[taskWorker]bool{}
	for _, p := range picks {
		if p.Task >= 0 && p.Task < n && deps[p.Task] == 0 {
			pickNames, pickWorkers = append(pickNames, names[p.Task]), append(pickWorkers, p.Worker)
			pickCkpts, pickSolos = append(pickCkpts, p.CkptMS), append(pickSolos, p.Solo)
			if tw := (taskWorker{p.Task, p.Worker}); !counted[tw] {
				counted[tw] = true
				need[p.Task]--
			}
			if p.Solo {
				need[p.Task] = 0
			}
		}
	}
	channel := ""
	if slices.ContainsFunc(need, func(k int) bool { return k > 0 }) {
		// Dispatchers hear of ready tasks left unclaimed; those claimed
		// here are no news to them.
		channel = ChannelReady
	}
	for try := 0; ; try++ {
		b := &pgx.Batch{}
		if len(pickNames) > 0 {
			queueBegin(b, false) // the claim's settings; the commit is the submission's, flushed
		} else {
			b.Queue("BEGIN")
		}
		b.Queue(createSmallSQL, ownerID, w.Name, w.Priority, n, replicas, quorum, maxR, headStart.Milliseconds(),
			names, modules, args, stdins, deps, maxAttempts, timeouts, pages, outBytes, logBytes, ckpts, seeds,
			edgeTask, edgeName, edgeFrom, edgeOutput, channel, uid)
		if len(pickNames) > 0 {
			sql := claimNewSQL
			if distinct(pickNames) {
				sql = claimNewOnePerTaskSQL
			}
			b.Queue(sql, pickNames, uuidParams(pickWorkers), pickCkpts, pickSolos, lease.Milliseconds(), uid)
		}
		b.Queue("COMMIT")
		br := s.pool.SendBatch(ctx, b)
		if len(pickNames) > 0 {
			err = execBegin(br)
		} else {
			_, err = br.Exec()
		}
		if err == nil {
			err = br.QueryRow().Scan(&id)
		}
		claimed = nil
		if err == nil && len(pickNames) > 0 {
			claimed, err = collectClaimed(br)
		}
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil && try < 5 && retryable(err) {
			continue
		}
		if err != nil {
			return "", nil, err
		}
		break
	}
	return id, claimed, nil
}

// SubmissionCandidates returns the tasks of w that will be ready once it is
// written, as Candidates would then read them, for a plan made before it is
// written (CreateWorkflowClaiming): TaskID is the task's index in w.Tasks
// (it has no id yet), WorkflowID is empty, and ReadySince is now less the
// interactive head start (the sort key will be the same by the database's
// clock).
func (s *Store) SubmissionCandidates(w *NewWorkflow, now time.Time) []Candidate {
	if w.Priority == "interactive" {
		now = now.Add(-s.interactiveHeadStart)
	}
	replicas := max(w.Replicas, 1)
	var cs []Candidate
	for i := range w.Tasks {
		t := &w.Tasks[i]
		if len(t.Inputs) == 0 {
			cs = append(cs, Candidate{TaskID: int64(i), Module: t.Module, Name: t.Name, Priority: w.Priority, ReadySince: now, Setup: t.Setup != nil,
				Pending: replicas, Replicas: replicas, Fresh: true, CkptMS: t.CkptMS})
		}
	}
	return cs
}

// newUUID returns a workflow id: a random (version 4) UUID, so that a
// few of its first characters name it (cyclepool status 6b0c); version 7
// ids share their first 8 for a minute (docs/RATIONALE.md).
func newUUID() (pgtype.UUID, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return pgtype.UUID{}, fmt.Errorf("workflow id: %w", err)
	}
	return pgtype.UUID{Bytes: id, Valid: true}, nil
}

// createSmallSQL writes a workflow with id $26, its modules
// (workflow_modules), its tasks ($9 to $20, one array element per task, in
// submission order) and its edges ($21 to $24: task and upstream task as
// 1-based positions in the task arrays) in one statement, and notifies
// channel $25 unless it is empty. It returns the workflow's id. Task ids
// come from the sequence in submission order.
// Replicated workflows ($5 replicas, $6 quorum, $7 most replicas) give
// each task more attempts, as many as the extra replicas, so that a failed
// replica does not use up the others'.
const createSmallSQL = `WITH wf AS (
	INSERT INTO workflows (id, owner_id, name, priority, task_count, tasks_left, replicas, quorum)
	VALUES ($26, $1, $2, $3, $4, $4, $5, $6) RETURNING id, created_at
), u AS (
	SELECT nextval('tasks_id_seq') AS id, s.* FROM (
		SELECT * FROM unnest($9::text[], $10::text[], $11::text[], $12::bytea[], $13::int[], $14::int[], $15::bigint[], $16::int[],
			$17::bigint[], $18::bigint[], $19::bigint[], $20::bigint[]) WITH ORDINALITY
			AS u(name, module, args, stdin, deps, max_attempts, timeout_ms, pages, output_bytes, log_bytes, ckpt_ms, seed, ord)
		ORDER BY ord) s
), wm AS (
	INSERT INTO workflow_modules (workflow_id, module_id) SELECT DISTINCT wf.id, m FROM wf, unnest($10::text[]) m
), t AS (
	INSERT INTO tasks (id, workflow_id, name, module_id, args, stdin, priority, state, deps_left, sort_key,
		max_attempts, timeout_ms, memory_pages, output_bytes, log_bytes, ckpt_ms, seed, pending, replicas, quorum, max_replicas)
	SELECT u.id, wf.id, u.name, u.module, ARRAY(SELECT json_array_elements_text(u.args::json)), u.stdin, $3,
		CASE WHEN u.deps = 0 THEN 'ready' ELSE 'blocked' END, u.deps,
		CASE WHEN u.deps = 0 THEN wf.created_at - $8 * interval '1 millisecond' END,
		u.max_attempts + $7 - 1, u.timeout_ms, u.pages, u.output_bytes, u.log_bytes, u.ckpt_ms, u.seed, $5, $5, $6, $7
	FROM u, wf ORDER BY u.ord
), e AS (
	INSERT INTO task_inputs (task_id, name, from_task, output)
	SELECT a.id, x.name, b.id, x.output
	FROM unnest($21::int[], $22::text[], $23::int[], $24::text[]) AS x(task, name, from_task, output)
	JOIN u a ON a.ord = x.task JOIN u b ON b.ord = x.from_task
)
SELECT wf.id::text FROM wf CROSS JOIN LATERAL (SELECT CASE WHEN $25 <> '' THEN pg_notify($25, '') END) note`

// taskColumns are the columns of a row built by CreateWorkflow.
var taskColumns = []string{"id", "workflow_id", "name", "module_id", "args", "stdin", "priority", "state", "deps_left", "sort_key",
	"max_attempts", "timeout_ms", "memory_pages", "output_bytes", "log_bytes", "ckpt_ms", "seed", "setup"}

// insertTasks writes the task rows of a large workflow with COPY.
func insertTasks(ctx context.Context, tx pgx.Tx, rows [][]any) error {
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"tasks"}, taskColumns, pgx.CopyFromRows(rows))
	return err
}

// distinctModules returns the modules of a workflow's tasks, each once.
func distinctModules(w *NewWorkflow) []string {
	var ms []string
	seen := map[string]bool{}
	for _, t := range w.Tasks {
		if !seen[t.Module] {
			seen[t.Module] = true
			ms = append(ms, t.Module)
		}
	}
	return ms
}

// countEdges returns the number of task_inputs rows of a workflow.
func countEdges(w *NewWorkflow) int {
	n := 0
	for _, t := range w.Tasks {
		n += len(t.Inputs)
	}
	return n
}

func distinctDeps(ins []NewInput) int {
	seen := map[int]bool{}
	for _, in := range ins {
		seen[in.From] = true
	}
	return len(seen)
}

// Counts holds the number of tasks in each state.
type Counts struct {
	Blocked        int `json:"blocked"`
	Ready          int `json:"ready"`
	Running        int `json:"running"`
	Done           int `json:"done"`
	Failed         int `json:"failed"`
	UpstreamFailed int `json:"upstream_failed"`
	Cancelled      int `json:"cancelled"`
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
	Name string `json:"name"`
	Size int    `json:"size"`
}

// TaskStatus is a task as the API shows it.
type TaskStatus struct {
	Name        string  `json:"name"`
	State       string  `json:"state"`
	Attempts    int     `json:"attempts"`
	MaxAttempts int     `json:"max_attempts"`
	Progress    float64 `json:"progress"`
	Module      string  `json:"module"`
	Checkpoints int     `json:"checkpoints"`
	// CheckpointAt is when the latest checkpoint was saved (null: none).
	CheckpointAt *time.Time `json:"checkpoint_at"`
	// Worker is the id of the worker running the task's latest running
	// attempt, or for a done task of the worker whose result was
	// accepted (the latest, with replicas); "" otherwise.
	Worker     string     `json:"worker"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Error      string     `json:"error"`
	// Disputed is true when the task's result was accepted alone from a
	// worker that later lost a quorum, after the workflow had finished, so
	// it could not be re-checked (docs/WORKFLOW.md, "Result verification").
	Disputed  bool         `json:"disputed,omitempty"`
	Outputs   []OutputInfo `json:"outputs"`
	UpdatedAt time.Time    `json:"-"`
}

// WorkflowStatus is a workflow as the API shows it.
type WorkflowStatus struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Priority   string     `json:"priority"`
	State      string     `json:"state"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at"`
	TaskCount  int        `json:"task_count"`
	Replicas   int        `json:"replicas"`
	Quorum     int        `json:"quorum"`
	// Efficiency and SuggestedParallelism are Heymann et al.'s resource
	// efficiency and worker count for >= 80% efficiency (status of one
	// workflow only; null until an attempt succeeded).
	Efficiency           *float64 `json:"efficiency,omitempty"`
	SuggestedParallelism *int     `json:"suggested_parallelism,omitempty"`
	// Notice is what the server has to say of itself that holds the
	// workflow up (status of one workflow only): its database cannot
	// store results now, say. Set by the server, not read from the
	// database.
	Notice string       `json:"notice,omitempty"`
	Counts *Counts      `json:"counts,omitempty"`
	Tasks  []TaskStatus `json:"tasks,omitempty"`
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
const ownedWorkflowSQL = `SELECT id::text, name, priority, state, created_at, finished_at, task_count, replicas, quorum
	FROM workflows WHERE id = $1 AND owner_id = $2`

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

// runningAttemptSQL joins a task (t) to its latest running attempt (ra:
// progress, worker), if any, or for a done task to the latest attempt
// whose result counted (its worker is the one that ran it).
const runningAttemptSQL = ` LEFT JOIN LATERAL (SELECT a.progress, a.worker_id::text AS worker FROM attempts a
		WHERE a.task_id = t.id AND (a.state = 'running' OR t.state = 'done' AND a.state = 'succeeded' AND NOT a.superseded)
		ORDER BY a.state = 'running' DESC, a.id DESC LIMIT 1) ra ON true`

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
		b.Queue(workflowSpansSQL+` AND EXISTS (SELECT 1 FROM workflows w WHERE w.id = $1 AND w.owner_id = $2) ORDER BY a.id`, id, ownerID)
	}
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	w, err := scanOwnedWorkflow(br.QueryRow(), id)
	if err != nil {
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

// Attempt is one attempt of a task as the API shows it.
type Attempt struct {
	ID           int64      `json:"id"`
	State        string     `json:"state"`
	Worker       string     `json:"worker"`
	Reason       string     `json:"reason"`
	StartedAt    time.Time  `json:"started_at"`
	EndedAt      *time.Time `json:"ended_at"`
	RestoredFrom int        `json:"restored_from"`
	// Verdict is set on results of replicated tasks: valid, invalid or
	// unverified (accepted alone from a trusted worker).
	Verdict string `json:"verdict,omitempty"`
	// Superseded is true when the attempt ran on an upstream result that
	// re-verification overturned: its task was reset and ran again.
	Superseded bool `json:"superseded,omitempty"`
}

// Attempts lists the attempts of a task, oldest first.
func (s *Store) Attempts(ctx context.Context, ownerID int64, id, task string) ([]Attempt, error) {
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

// Cancel cancels every unfinished task of a workflow, ends its running
// attempts as cancelled and tells every replica (ChannelCancel) to stop them
// on their workers. It returns the workflow status after the change and the
// attempts that were running.
func (s *Store) Cancel(ctx context.Context, ownerID int64, id string) ([]int64, error) {
	var attempts []int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		attempts = nil
		if !looksLikeUUID(id) {
			return ErrNotFound
		}
		// Lock the workflow first and decide on its state under the lock, so
		// that a workflow finishing meanwhile is not overwritten.
		var state string
		err := tx.QueryRow(ctx, `SELECT state FROM workflows WHERE id = $1 AND owner_id = $2 FOR UPDATE`, id, ownerID).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if state != StateRunning {
			return nil
		}
		// Tasks before attempts: a claim that commits while this waits for
		// its task rows is then seen by the attempts statement below.
		rows, err := tx.Query(ctx, `UPDATE tasks SET state = 'cancelled', pending = 0, finished_at = now(), updated_at = now()
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
		if !looksLikeUUID(id) {
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
			error = 'cancelled by the owner' WHERE id = $1`, taskID); err != nil {
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
