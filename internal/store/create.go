package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
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
	// ID is the workflow's id (NewWorkflowID), or "" for one made when it
	// is written. A caller that waits for the workflow's end makes it
	// first, to wait from before the workflow exists.
	ID string
}

// NewWorkflowID returns a new workflow id (NewWorkflow.ID).
func NewWorkflowID() (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", fmt.Errorf("workflow id: %w", err)
	}
	return id.String(), nil
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
	uid, err := idOf(w)
	if err != nil {
		return "", fmt.Errorf("create workflow %q: %w", w.Name, err)
	}
	var id string
	if w.Claimable() {
		id, _, err = s.createSmall(ctx, ownerID, w, uid, nil, 0, 0, nil)
	} else {
		named := *w // the id made here, so that a lost answer can be looked up
		named.ID = uuid.UUID(uid.Bytes).String()
		id, err = s.createLarge(ctx, ownerID, &named)
	}
	if err != nil {
		var mc *maybeCommitted
		if errors.As(err, &mc) {
			// The transaction may have committed, its answer lost: once
			// its backend has ended, the workflow is there or not.
			if id, ferr := s.committedAfterAll(ctx, uid, mc.pid); ferr == nil && id != "" {
				return id, nil
			}
		}
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
	err := s.txCommitting(ctx, func(tx pgx.Tx) error {
		var now time.Time
		var ids []int64
		uid, err := idOf(w) // for COPY a pgtype.UUID: a string would be parsed anew for every row
		if err != nil {
			return err
		}
		// One round trip: the workflow row, its modules (whose keys
		// keep a module in use from being deleted:
		// migrations/00009_workflow_modules.sql), the transaction's time
		// and the ids of its tasks.
		if err := tx.QueryRow(ctx, `WITH wf AS (
				INSERT INTO workflows (id, owner_id, name, priority, task_count, tasks_left)
				VALUES ($6, $1, $2, $3, $4, $4) RETURNING id, created_at
			), wm AS (
				INSERT INTO workflow_modules (workflow_id, module_id) SELECT wf.id, m FROM wf, unnest($5::text[]) m
			)
			SELECT id::text, id, created_at, (SELECT array_agg(nextval('tasks_id_seq')) FROM generate_series(1, $4)) FROM wf`,
			ownerID, w.Name, w.Priority, len(w.Tasks), distinctModules(w), uid).Scan(&id, &uid, &now, &ids); err != nil {
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
			rows[i] = []any{ids[i], uid, ownerID, t.Name, t.Module, args, t.Stdin, w.Priority, state, deps, key,
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
//
// With send, the attempts go out before the commit has returned. When the
// picks name distinct tasks (the common case), send is called before the
// transaction starts, with attempts whose ids were reserved ahead (all
// above newerThan: the newest attempt the picks' workers hold, so that a
// worker's attempts stay in the order it got them) and whose task ids are
// still 0: the workers run them while PostgreSQL writes the workflow and
// flushes its commit (sendEarly). Otherwise send is called once the claim
// has returned them, while PostgreSQL flushes the COMMIT that follows in
// the same pipeline. Until CreateWorkflowClaiming returns, the attempts
// may not exist for anyone else: the caller must hold back everything
// their workers say of them until then. If it then returns an error, or
// no attempts, the caller takes them back from their workers: they never
// existed, or were ended (uncounted) meanwhile, or, when even the look for
// a lost answer failed, hold leases that will lapse. An attempt sent but
// not among those returned is taken back too (none is, as the claim of a
// fresh task refuses no pick of it, but the caller does not count on it).
func (s *Store) CreateWorkflowClaiming(ctx context.Context, ownerID int64, w *NewWorkflow, picks []SubmitPick, lease time.Duration,
	newerThan int64, send func([]Claimed)) (id string, claimed []Claimed, err error) {
	if !w.Claimable() {
		return "", nil, fmt.Errorf("create workflow %q: %d tasks are too many to claim at submission", w.Name, len(w.Tasks))
	}
	uid, err := idOf(w)
	if err != nil {
		return "", nil, err
	}
	id, claimed, err = s.createSmall(ctx, ownerID, w, uid, picks, lease, newerThan, send)
	if err != nil {
		var mc *maybeCommitted
		if errors.As(err, &mc) {
			// The transaction may have committed, its answer lost.
			if id, rerr := s.recoverSubmission(ctx, uid, mc.pid); rerr == nil && id != "" {
				return id, nil, nil
			}
		}
		return "", nil, fmt.Errorf("create workflow %q: %w", w.Name, err)
	}
	return id, claimed, nil
}

// maybeCommitted is an error after which a transaction may have committed
// all the same: its COMMIT was sent, and then its answer was lost (the
// connection failed, the context ended) or was a fatal error (a backend
// terminated while it waited for a synchronous standby has committed
// locally). pid is the transaction's backend, which may still be
// committing (0: none, the connection read its pipeline to the end).
type maybeCommitted struct {
	pid uint32
	err error
}

func (e *maybeCommitted) Error() string { return e.err.Error() }
func (e *maybeCommitted) Unwrap() error { return e.err }

// uncertain returns err, an error of a transaction on conn whose COMMIT
// was sent, as a maybeCommitted, unless it says that the transaction did
// not commit: an error PostgreSQL reported (not a fatal one) aborts the
// transaction, and its COMMIT then rolls back; an error before anything
// was sent (pgconn.SafeToRetry) leaves no transaction. Only a closed
// connection's backend may still be committing (its pid is kept, for
// awaitBackend); one still open has read its pipeline to the end.
func uncertain(conn *pgconn.PgConn, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.SeverityUnlocalized == "ERROR" || pgErr.SeverityUnlocalized == "" && pgErr.Severity == "ERROR") {
		return err
	}
	if pgconn.SafeToRetry(err) {
		return err
	}
	var pid uint32
	if conn.IsClosed() {
		pid = conn.PID()
	}
	return &maybeCommitted{pid: pid, err: err}
}

// awaitBackend waits until backend pid, whose connection was given up
// after a lost answer, has ended: its transaction is then committed or
// not, no longer in flight, and a look at what it wrote is the truth. A
// backend still there after backendGrace is terminated: a COMMIT that waits
// for a synchronous standby has committed locally, and PostgreSQL makes it
// visible when its backend ends.
func (s *Store) awaitBackend(ctx context.Context, pid uint32) error {
	terminateAt := time.Now().Add(s.backendGrace)
	for terminated := false; ; {
		var alive bool
		if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int32(pid)).Scan(&alive); err != nil {
			return fmt.Errorf("wait for backend %d: %w", pid, err)
		}
		if !alive {
			return nil
		}
		if !terminated && time.Now().After(terminateAt) {
			if _, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
				return fmt.Errorf("terminate backend %d: %w", pid, err)
			}
			terminated = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for backend %d: %w", pid, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// committedAfterAll reports the id of workflow uid once backend pid, whose
// transaction wrote it and lost its COMMIT's answer, has ended (0: not
// waited for): "" when it was not written.
func (s *Store) committedAfterAll(ctx context.Context, uid pgtype.UUID, pid uint32) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.backendGrace+15*time.Second)
	defer cancel()
	if pid != 0 {
		if err := s.awaitBackend(ctx, pid); err != nil {
			return "", fmt.Errorf("look for a workflow: %w", err)
		}
	}
	var id string
	err := s.pool.QueryRow(ctx, `SELECT id::text FROM workflows WHERE id = $1`, uid).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look for a workflow: %w", err)
	}
	return id, nil
}

// txCommitting is tx for a transaction whose COMMIT's answer may be lost:
// an error of the COMMIT comes back uncertain (maybeCommitted, with the
// backend's pid).
func (s *Store) txCommitting(ctx context.Context, fn func(pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := s.txCommittingOnce(ctx, fn)
		if err != nil && attempt < 5 && retryable(err) {
			continue
		}
		return err
	}
}

func (s *Store) txCommittingOnce(ctx context.Context, fn func(pgx.Tx) error) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer pc.Release()
	tx, err := pc.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback(ctx) // a connection left in its transaction is closed on release
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return uncertain(pc.Conn().PgConn(), err)
	}
	return nil
}

// backendGrace is how long awaitBackend lets a backend finish its COMMIT
// before it terminates it (Store.backendGrace, which tests change).
const backendGrace = 5 * time.Second

// recoverSubmission settles a claiming submission whose transaction ended
// in an error that may have come after its commit (the connection lost
// with the COMMIT's answer, or the context ended while it was on its way),
// once its backend pid has ended (awaitBackend; 0: not known, not waited
// for). When the workflow uid was written after all, the attempts it claimed
// never reached their workers and nobody was told of its tasks: the
// attempts are ended without counting against their tasks or workers,
// which queues the tasks again and wakes the dispatchers, and it returns
// the workflow's id. It returns "" when the workflow was not written.
func (s *Store) recoverSubmission(ctx context.Context, uid pgtype.UUID, pid uint32) (string, error) {
	id, err := s.committedAfterAll(ctx, uid, pid)
	if err != nil || id == "" {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT a.id, a.worker_id::text FROM tasks t JOIN attempts a ON a.task_id = t.id
		WHERE t.workflow_id = $1 AND a.state = 'running'`, uid)
	if err != nil {
		return "", fmt.Errorf("look for a submission's attempts: %w", err)
	}
	var ends []Completion
	for rows.Next() {
		c := Completion{Reason: "worker", End: EndUnstarted, Message: "the server lost the answer of the submission that claimed it: taken back"}
		if err := rows.Scan(&c.Attempt, &c.Worker); err != nil {
			rows.Close()
			return "", fmt.Errorf("look for a submission's attempts: %w", err)
		}
		ends = append(ends, c)
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("look for a submission's attempts: %w", err)
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
// their names. It returns the attempts. With send as well, the attempts
// go out before the transaction when the picks name distinct tasks
// (sendEarly), else between the claim and the COMMIT (createSending).
func (s *Store) createSmall(ctx context.Context, ownerID int64, w *NewWorkflow, uid pgtype.UUID, picks []SubmitPick, lease time.Duration,
	newerThan int64, send func([]Claimed)) (id string, claimed []Claimed, err error) {
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
	var pickTasks []int
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
			pickTasks = append(pickTasks, p.Task)
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
	createArgs := []any{ownerID, w.Name, w.Priority, n, replicas, quorum, maxR, headStart.Milliseconds(),
		names, modules, args, stdins, deps, maxAttempts, timeouts, pages, outBytes, logBytes, ckpts, seeds,
		edgeTask, edgeName, edgeFrom, edgeOutput, channel, uid}
	if send != nil && len(pickNames) > 0 && distinct(pickNames) {
		// Sent before the transaction (sendEarly), unless no attempt
		// ids could be reserved: then sent before its COMMIT, below.
		if ids, err := s.attemptIDs.take(ctx, s.pool, len(pickNames), newerThan); err == nil {
			early := earlyClaims(ownerID, w, uid, pickTasks, pickWorkers, pickCkpts, ids)
			return s.sendEarly(ctx, early, send, func() *pgx.Batch {
				b := &pgx.Batch{}
				queueBegin(b, false) // the claim's settings; the commit is the submission's, flushed
				b.Queue(createSmallSQL, createArgs...)
				b.Queue(claimNewEarlySQL, pickNames, uuidParams(pickWorkers), pickCkpts, pickSolos, lease.Milliseconds(), uid, ids)
				b.Queue("COMMIT")
				return b
			})
		}
	}
	for try := 0; ; try++ {
		b := &pgx.Batch{}
		if len(pickNames) > 0 {
			queueBegin(b, false) // the claim's settings; the commit is the submission's, flushed
		} else {
			b.Queue("BEGIN")
		}
		b.Queue(createSmallSQL, createArgs...)
		if len(pickNames) > 0 {
			sql := claimNewSQL
			if distinct(pickNames) {
				sql = claimNewOnePerTaskSQL
			}
			b.Queue(sql, pickNames, uuidParams(pickWorkers), pickCkpts, pickSolos, lease.Milliseconds(), uid)
		}
		if len(pickNames) > 0 && send != nil {
			id, claimed, err = s.createSending(ctx, b, len(pickNames), send)
		} else {
			b.Queue("COMMIT")
			id, claimed, err = s.createBatch(ctx, b, len(pickNames))
		}
		if errors.Is(err, errSent) {
			return "", nil, err // not again: its attempts went out
		}
		if err != nil && try < 5 && retryable(err) {
			continue
		}
		if err != nil {
			return "", nil, err
		}
		return id, claimed, nil
	}
}

// createBatch sends createSmall's batch, its COMMIT included, and reads
// the workflow's id and the attempts of its n picks (none when n is 0).
func (s *Store) createBatch(ctx context.Context, b *pgx.Batch, n int) (id string, claimed []Claimed, err error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return "", nil, err
	}
	defer pc.Release()
	return createBatchOn(ctx, pc, b, n)
}

// createBatchOn is createBatch on pc.
func createBatchOn(ctx context.Context, pc *pgxpool.Conn, b *pgx.Batch, n int) (id string, claimed []Claimed, err error) {
	br := pc.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			err = uncertain(pc.Conn().PgConn(), err)
		}
	}()
	if n > 0 {
		err = execBegin(br)
	} else {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(&id)
	}
	if err == nil && n > 0 {
		claimed, err = collectClaimed(br, n)
	}
	if err == nil {
		_, err = br.Exec() // COMMIT
	}
	return id, claimed, err
}

// sendEarly sends early's attempts (send), then runs the batch that batch
// builds (createSmall's, with the claim of those attempts under their
// reserved ids, claimNewEarlySQL, and its COMMIT) and returns what it
// wrote: the workers run the attempts while PostgreSQL writes the
// workflow, and the statements and the commit's WAL flush are off the path
// of an interactive task. A transaction that PostgreSQL rolled back for a
// deadlock or a serialization failure is run again, under the same ids:
// nothing of it was written, and the caller holds back what the workers
// say of the attempts until it returns. Any other error wraps errSent:
// the submission is not tried again.
func (s *Store) sendEarly(ctx context.Context, early []Claimed, send func([]Claimed), batch func() *pgx.Batch) (id string, claimed []Claimed, err error) {
	// The connection first: the workers' gates stay shut from send to
	// the commit, and not while the pool is busy.
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return "", nil, err
	}
	// A connection released inside its transaction (after an error) is
	// closed by the pool, which ends the transaction.
	defer pc.Release()
	send(early)
	for try := 0; ; try++ {
		// A batch anew each time: pgx keeps the statements' descriptions
		// in it (the same connection, but the cache may have changed).
		id, claimed, err = createBatchOn(ctx, pc, batch(), len(early))
		if err != nil && try < 5 && retryable(err) {
			continue
		}
		if err != nil {
			return "", nil, fmt.Errorf("%w: %w", errSent, err)
		}
		return id, claimed, nil
	}
}

// earlyClaims are the attempts the claim of a new workflow's picks
// (claimNewEarlySQL) writes, as it returns them, but for their task ids
// (0: not drawn yet, and the workers do not need them), built before it
// runs: pick i of task tasks[i] for workers[i] gets attempt ids[i]. A
// fresh task has no checkpoint, inputs or setup (Claimable), and no
// attempt or avoided worker that would make the claim refuse a pick.
func earlyClaims(ownerID int64, w *NewWorkflow, uid pgtype.UUID, tasks []int, workers []string, ckpts []int64, ids []int64) []Claimed {
	wf := uuid.UUID(uid.Bytes).String()
	cs := make([]Claimed, len(tasks))
	for i, ti := range tasks {
		t := &w.Tasks[ti]
		args := t.Args
		if args == nil {
			args = []string{}
		}
		ckpt := t.CkptMS
		if ckpts[i] > 0 {
			ckpt = ckpts[i]
		}
		cs[i] = Claimed{Attempt: ids[i], Worker: workers[i], WorkflowID: wf, Owner: ownerID, Name: t.Name, Module: t.Module,
			Args: args, Stdin: t.Stdin, Priority: w.Priority, TimeoutMS: t.TimeoutMS, MemoryPages: t.MemoryPages,
			OutputBytes: t.OutputBytes, LogBytes: t.LogBytes, CkptMS: ckpt, Seed: t.Seed}
	}
	return cs
}

// errSent marks an error after the attempts went out (createSending's
// COMMIT, any error of sendEarly's transaction): the submission is not
// tried again.
var errSent = errors.New("attempts sent before the commit")

// createSending sends createSmall's batch and its COMMIT in one write,
// as one pipeline, with a request between the claim and the COMMIT that
// PostgreSQL send what it has: the attempts come back before the COMMIT's
// WAL flush, and go to send while it runs. (pgx.Batch asks for nothing
// before its end, so its results come after the flush.) The statements
// with arguments are prepared once per connection, as pgx.Batch's are.
// An error of the COMMIT wraps errSent.
func (s *Store) createSending(ctx context.Context, b *pgx.Batch, n int, send func([]Claimed)) (id string, claimed []Claimed, err error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return "", nil, err
	}
	// A connection released inside its transaction (after an error) is
	// closed by the pool, which ends the transaction.
	defer pc.Release()
	conn := pc.Conn()
	qs := b.QueuedQueries // BEGIN, the settings (queueBegin), createSmallSQL, the claim
	sds := make([]*pgconn.StatementDescription, len(qs))
	for i, q := range qs {
		if len(q.Arguments) > 0 {
			if sds[i], err = conn.Prepare(ctx, preparedName(q.SQL), q.SQL); err != nil {
				return "", nil, err
			}
		}
	}
	p := conn.PgConn().StartPipeline(ctx)
	var eqb pgx.ExtendedQueryBuilder
	for i, q := range qs {
		if sds[i] == nil {
			p.SendQueryParams(q.SQL, nil, nil, nil, nil)
			continue
		}
		if err := eqb.Build(conn.TypeMap(), sds[i], q.Arguments); err != nil {
			p.Close() // unsynced: closes the connection
			return "", nil, err
		}
		p.SendQueryStatement(sds[i], eqb.ParamValues, eqb.ParamFormats, slices.Clone(eqb.ResultFormats))
	}
	p.SendFlushRequest()
	p.SendQueryParams("COMMIT", nil, nil, nil, nil)
	p.SendPipelineSync()
	// From here the COMMIT may be on its way: an error may have come after
	// it committed (uncertain).
	if err := p.Flush(); err != nil {
		return "", nil, uncertain(conn.PgConn(), err)
	}
	fail := func(err error) (string, []Claimed, error) {
		p.Close()
		return "", nil, uncertain(conn.PgConn(), err)
	}
	next := func() (pgx.Rows, error) {
		r, err := p.GetResults()
		if err != nil {
			return nil, err
		}
		rr, ok := r.(*pgconn.ResultReader)
		if !ok {
			return nil, fmt.Errorf("a statement's results are %T", r)
		}
		return pgx.RowsFromResultReader(conn.TypeMap(), rr), nil
	}
	for range len(qs) - 2 { // BEGIN and the settings
		rows, err := next()
		if err != nil {
			return fail(err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	rows, err := next()
	if err == nil {
		id, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fail(err)
	}
	if rows, err = next(); err == nil {
		claimed, err = collectClaimedRows(rows, n)
	}
	if err != nil {
		return fail(err)
	}
	send(claimed)
	rows, err = next()
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err == nil && rows.CommandTag().String() != "COMMIT" {
		err = fmt.Errorf("the transaction ended in %s", rows.CommandTag())
	}
	if err != nil {
		p.Close()
		return "", nil, uncertain(conn.PgConn(), fmt.Errorf("%w: %w", errSent, err))
	}
	// Committed: what the pipeline's end says changes nothing (a broken
	// connection is closed by the pool).
	p.Close()
	return id, claimed, nil
}

// preparedName is the name createSending prepares statement sql under on
// a connection.
func preparedName(sql string) string {
	switch sql { // the same strings: compared by their pointers first
	case createSmallSQL:
		return "cyclepool_create_small"
	case claimNewSQL:
		return "cyclepool_claim_new"
	case claimNewOnePerTaskSQL:
		return "cyclepool_claim_new_one_per_task"
	}
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(sql); i++ {
		h ^= uint64(sql[i])
		h *= 1099511628211
	}
	return fmt.Sprintf("cyclepool_%016x", h)
}

// SubmissionCandidates returns the tasks of w that will be ready once it is
// written, as Candidates would then read them, for a plan made before it is
// written (CreateWorkflowClaiming) by owner: TaskID is the task's index in
// w.Tasks (it has no id yet), WorkflowID is empty, and ReadySince is now less the
// interactive head start (the sort key will be the same by the database's
// clock).
func (s *Store) SubmissionCandidates(owner int64, w *NewWorkflow, now time.Time) []Candidate {
	if w.Priority == "interactive" {
		now = now.Add(-s.interactiveHeadStart)
	}
	replicas := max(w.Replicas, 1)
	var cs []Candidate
	for i := range w.Tasks {
		t := &w.Tasks[i]
		if len(t.Inputs) == 0 {
			cs = append(cs, Candidate{TaskID: int64(i), Owner: owner, Module: t.Module, Name: t.Name, Priority: w.Priority, ReadySince: now, Setup: t.Setup != nil,
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

// idOf returns w's id (NewWorkflow.ID), or a new one when it has none.
func idOf(w *NewWorkflow) (pgtype.UUID, error) {
	if w.ID == "" {
		return newUUID()
	}
	id, err := uuid.Parse(w.ID)
	if err != nil {
		return pgtype.UUID{}, fmt.Errorf("workflow id %q: %w", w.ID, err)
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
	INSERT INTO tasks (id, workflow_id, owner_id, name, module_id, args, stdin, priority, state, deps_left, sort_key,
		max_attempts, timeout_ms, memory_pages, output_bytes, log_bytes, ckpt_ms, seed, pending, replicas, quorum, max_replicas)
	SELECT u.id, wf.id, $1, u.name, u.module, ARRAY(SELECT json_array_elements_text(u.args::json)), u.stdin, $3,
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
var taskColumns = []string{"id", "workflow_id", "owner_id", "name", "module_id", "args", "stdin", "priority", "state", "deps_left", "sort_key",
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
