package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Claimed is a task attempt created by ClaimPicks, with everything a
// worker needs to run it.
type Claimed struct {
	Attempt     int64
	Worker      string
	TaskID      int64
	WorkflowID  string
	Owner       int64 // the workflow's owner (0 in tasks older than migration 00026)
	Name        string
	Module      string
	Args        []string
	Stdin       []byte
	Priority    string
	TimeoutMS   int64
	MemoryPages int
	OutputBytes int64
	LogBytes    int64
	CkptMS      int64
	Seed        int64
	Restore     []byte
	// RestoreBlob is the checkpoint to restore when it was uploaded over
	// HTTP (of RestoreSize bytes): the worker downloads it.
	RestoreBlob string
	RestoreSize int64
	Inputs      []Input
	// Setup is the task's protocol.Setup as JSON, nil for most tasks.
	Setup []byte
	// Missing names an input whose upstream output does not exist; such an
	// attempt must be failed instead of sent.
	Missing string

	hasInputs bool
}

// Input is one input file of a claimed task; Name "" is stdin. An
// upstream output uploaded over HTTP has no Data: Blob names it (of Size
// bytes), and the worker downloads it.
type Input struct {
	Name string
	Data []byte
	Blob string
	Size int64
}

// MaxAssignInputBytes bounds the inputs (files and stdin from upstream
// tasks) of one claimed attempt that the store loads: an attempt whose
// inputs take more is given Missing instead (one assignment could not
// carry them), and none of their bytes are read. It is the worker
// protocol's default frame limit (protocol.DefaultMaxFrameBytes).
const MaxAssignInputBytes = 80 << 20

// loadInputs fills in the input files of claimed tasks. Outputs never change
// once written, so this needs no transaction. The sizes come first, from
// the values' headers (octet_length reads no TOAST data): a task whose
// inputs add up to more than MaxAssignInputBytes gets Missing, and its
// inputs' bytes are never read, so that an owner's workflow reading a big
// output under many names cannot make the server load it many times over.
func (s *Store) loadInputs(ctx context.Context, cs []Claimed) error {
	var ids []int64
	byTask := make(map[int64]*Claimed, len(cs))
	for i := range cs {
		if cs[i].hasInputs {
			ids = append(ids, cs[i].TaskID)
			byTask[cs[i].TaskID] = &cs[i]
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, `SELECT x.task_id, x.name, x.output, x.upstream, x.state,
			CASE WHEN x.total <= $2 THEN o.data END, x.total, coalesce(o.blob_id, ''), coalesce(b.size, 0)
		FROM (SELECT ti.task_id, ti.name, ti.output, ti.from_task, up.name AS upstream, up.state,
				sum(CASE WHEN o.blob_id IS NULL THEN coalesce(octet_length(o.data), 0) ELSE 0 END) OVER (PARTITION BY ti.task_id) AS total
			FROM task_inputs ti JOIN tasks up ON up.id = ti.from_task
			LEFT JOIN task_outputs o ON o.task_id = ti.from_task AND o.name = ti.output
			WHERE ti.task_id = ANY($1)) x
		LEFT JOIN task_outputs o ON o.task_id = x.from_task AND o.name = x.output
		LEFT JOIN blobs b ON b.id = o.blob_id
		ORDER BY x.task_id, x.name`, ids, MaxAssignInputBytes)
	if err != nil {
		return fmt.Errorf("load inputs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var name, output, upstream, state string
		var data []byte
		var total, size int64
		var blob string
		if err := rows.Scan(&id, &name, &output, &upstream, &state, &data, &total, &blob, &size); err != nil {
			return fmt.Errorf("load inputs: %w", err)
		}
		if blob != "" {
			// Uploaded over HTTP: the worker downloads it, as a file of
			// its setup.
			c := byTask[id]
			if name == "" {
				if c.Missing == "" {
					c.Missing = fmt.Sprintf("stdin: output %q of task %q is %d MiB, uploaded over HTTP: read it as a file (inputs or files) instead of stdin",
						output, upstream, size>>20)
				}
				continue
			}
			c.Inputs = append(c.Inputs, Input{Name: name, Blob: blob, Size: size})
			continue
		}
		if total > MaxAssignInputBytes {
			if c := byTask[id]; c.Missing == "" {
				c.Missing = fmt.Sprintf("inputs take %d MiB, more than the %d MiB one assignment can carry", total>>20, MaxAssignInputBytes>>20)
				c.Inputs, c.Stdin = nil, nil
			}
			continue
		}
		if data == nil && output == Stdout && state == StateDone {
			data = []byte{} // an empty stdout has no row (implied)
		}
		c := byTask[id]
		if data == nil && c.Missing == "" {
			what := fmt.Sprintf("input %q", name)
			if name == "" {
				what = "stdin"
			}
			c.Missing = fmt.Sprintf("%s: task %q produced no output %q", what, upstream, output)
		}
		if name == "" {
			c.Stdin = data
		} else {
			c.Inputs = append(c.Inputs, Input{Name: name, Data: data})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load inputs: %w", err)
	}
	return nil
}

// Candidate is a ready task as the dispatcher's plan sees it.
type Candidate struct {
	TaskID     int64
	WorkflowID string
	Owner      int64 // the workflow's owner (0 in tasks older than migration 00026)
	Module     string
	Name       string
	Priority   string
	ReadySince time.Time // sort_key: the time it became ready, minus the interactive head start
	Pending    int       // replicas waiting to be claimed
	Replicas   int       // replicas started at first (1: not replicated)
	// Fresh is true when no replica of the task has been claimed yet.
	Fresh bool
	// Exclude lists the workers the task may not go to: those that run or
	// ran a replica of a replicated task (no second replica may go to
	// them), and the volunteers the task avoids (tasks.avoid: they failed,
	// lost or broke the rules of an attempt of it).
	Exclude []string
	CkptMS  int64
	// Setup: the task has a setup (env, files...), which only workers
	// with protocol.FeatureSetup lay out; Blobs are the data blobs its
	// files read (the plan prefers workers that keep them).
	Setup bool
	Blobs []string
}

// Candidates reads up to limit ready tasks in dispatch order, without
// locking them: ClaimPicks claims those the plan chose, and skips those
// another replica took meanwhile. running has the attempts this replica's
// workers run, by owner (nil: none). The order is fair between owners: an
// owner's k-th ready task in its own order (sort_key, id) comes at turn
// running[owner] + k, and tasks go by turn, then sort_key; so a slot goes
// to the owner with the fewest attempts running, and an owner's backlog
// holds back nobody else's work (candidatesSQL). With one owner this is
// the order of the queue. more reports whether ready tasks may follow
// those returned (always when limit came back). It runs as the claim does
// (queueBegin): planning it anew each time took about 1 ms per call in the
// dispatch benchmark, as long as a fifth of running it.
func (s *Store) Candidates(ctx context.Context, limit int, running map[int64]int) (cs []Candidate, more bool, err error) {
	owners := make([]int64, 0, len(running))
	counts := make([]int32, 0, len(running))
	for o, n := range running {
		owners, counts = append(owners, o), append(counts, int32(min(n, 1<<30)))
	}
	// The read gives each owner its share of turns for fill tasks; an owner
	// with fewer ready tasks leaves the window short while others have
	// more. Then the turns are counted for more tasks, and read again.
	// An owner whose running attempts put even its first task past the
	// window's turn gives none, and says so too. (Owners past
	// MaxQueueOwners make more true as well, but reading again would not
	// reach them.)
	fill := limit
	for range 8 {
		var short bool
		if cs, more, short, err = s.candidates(ctx, limit, fill, owners, counts, running); err != nil || len(cs) == limit || !short {
			return cs, more, err
		}
		fill += 2 * (limit - len(cs))
	}
	return cs, more, nil
}

// candidates is one read of Candidates, its turns counted for fill tasks
// (at least limit). short reports that an owner may have more ready tasks
// than it gave for lack of turns: a read counting turns for more tasks
// may find them.
//
// The statement gives each owner's tasks in the owner's order; the turns
// are counted and the owners merged here. Sorting all the tasks by turn in
// the statement (with a window function for their places) doubled its
// time a task in the dispatch benchmark, where one owner's tasks come
// in order already.
func (s *Store) candidates(ctx context.Context, limit, fill int, owners []int64, counts []int32, running map[int64]int) (cs []Candidate, more, short bool, err error) {
	b := &pgx.Batch{}
	queueBegin(b, false)
	for _, sql := range candidatesSettings {
		b.Queue(sql)
	}
	b.Queue(candidatesSQL, owners, counts, MaxQueueOwners, fill)
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	err = execBegin(br)
	for range candidatesSettings {
		if err == nil {
			_, err = br.Exec()
		}
	}
	type share struct{ given, bound int64 }
	shares := map[int64]*share{}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			in := interned{}
			var wf, module, prio pgtype.DriverBytes
			var bound int64
			var starved, beyond bool
			cs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Candidate, error) {
				var c Candidate
				err := r.Scan(&c.TaskID, &wf, &c.Owner, &module, &c.Name, &prio, &c.ReadySince, &c.Pending, &c.Replicas,
					&c.Fresh, &c.CkptMS, &c.Exclude, &c.Setup, &c.Blobs, &bound, &starved, &beyond)
				c.WorkflowID, c.Module, c.Priority = in.of(wf), in.of(module), in.of(prio)
				sh := shares[c.Owner]
				if sh == nil {
					sh = &share{bound: bound}
					shares[c.Owner] = sh
				}
				sh.given++
				short = short || starved
				more = more || starved || beyond
				return c, err
			})
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, false, false, fmt.Errorf("read ready tasks: %w", err)
	}
	for _, sh := range shares {
		if sh.given == sh.bound {
			short, more = true, true
		}
	}
	switch {
	case len(shares) > 1:
		cs = byTurn(cs, turnsOf(cs, running))
	case !slices.IsSortedFunc(cs, func(a, b Candidate) int { return queueOrder(&a, &b) }):
		// One owner's tasks, which the statement gives in the queue's
		// order (a LATERAL naming the outer row is the inner side of a
		// nested loop); sorted should a plan ever give them otherwise.
		slices.SortFunc(cs, func(a, b Candidate) int { return queueOrder(&a, &b) })
	}
	if len(cs) > limit {
		cs, more = cs[:limit], true
	}
	return cs, more || len(cs) == limit, short, nil
}

// queueOrder compares two tasks of one owner in the queue's order: sort
// key, then id.
func queueOrder(a, b *Candidate) int {
	return cmp.Or(a.ReadySince.Compare(b.ReadySince), cmp.Compare(a.TaskID, b.TaskID))
}

// turnsOf returns the turns of cs (running[owner] plus the task's place in
// its owner's queue order), whatever order they come in.
func turnsOf(cs []Candidate, running map[int64]int) []int64 {
	idx := make([]int, len(cs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(cs[a].Owner, cs[b].Owner), queueOrder(&cs[a], &cs[b]))
	})
	turns := make([]int64, len(cs))
	place := int64(0)
	for k, i := range idx {
		if k == 0 || cs[idx[k-1]].Owner != cs[i].Owner {
			place = 0
		}
		place++
		turns[i] = int64(running[cs[i].Owner]) + place
	}
	return turns
}

// byTurn orders candidates by their turns (turns[i] is cs[i]'s), then by
// sort key and id, as the queue's order has it.
func byTurn(cs []Candidate, turns []int64) []Candidate {
	idx := make([]int, len(cs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(turns[a], turns[b]), queueOrder(&cs[a], &cs[b]))
	})
	out := make([]Candidate, len(cs))
	for i, j := range idx {
		out[i] = cs[j]
	}
	return out
}

// candidatesSettings are set for the transaction of candidatesSQL, after
// queueBegin's.
var candidatesSettings = []string{candidatesNoBitmapSQL}

// candidatesNoBitmapSQL keeps candidatesSQL on its ordered index scans.
// Told by statistics that lag a submission that an owner has few ready
// tasks, PostgreSQL read all of them by a bitmap scan and sorted them to
// give the first few (20,000 tasks and 33 ms for a window of 100, twice
// the statement's time a task in the dispatch benchmark).
const candidatesNoBitmapSQL = `SELECT set_config('enable_bitmapscan', 'off', true)`

// MaxQueueOwners bounds the owners whose ready tasks one read of the queue
// (Candidates) looks at: those of the lowest ids. Each costs an index probe
// and up to a window's tasks; past it, the owners of higher ids wait until
// those before them have no ready task left.
const MaxQueueOwners = 256

// candidatesSQL reads the ready tasks of the first turns of the queue,
// those of each owner together and in the owner's order ($1 owners and $2
// the attempts each runs on this replica; others run none), from the
// queue's index (tasks_ready: migrations/00026_tasks_owner.sql), the turns
// counted for $4 tasks (Candidates merges them).
// o finds the owners with ready tasks, one index probe each (a loose index
// scan: PostgreSQL has no skip scan), at most $3 of them. An owner running
// r attempts has its tasks at turns r+1, r+2...; the window ends at the
// first turn T by which the owners have $4 tasks between them, were each
// to have enough: with the runs sorted, r1 <= r2 <= ..., the least over j
// of ceil(($4 + r1 + ... + rj) / j) (each is at least T, and the j of the
// owners below T gives T). Each owner's tasks are read in its own order,
// T - r of them (the column bound): the read costs about $4 tasks, however
// many owners there are. starved says an owner runs T or more and gave
// none (it may have ready tasks); beyond that owners past the first $3
// have ready tasks, not read.
var candidatesSQL = strings.ReplaceAll(`WITH RECURSIVE o AS (
	(SELECT t.owner_id FROM tasks t WHERE t.pending > 0 AND t.sort_key IS NOT NULL ORDER BY t.owner_id LIMIT 1)
	UNION ALL
	SELECT (SELECT t.owner_id FROM tasks t WHERE t.pending > 0 AND t.sort_key IS NOT NULL AND t.owner_id > o.owner_id
		ORDER BY t.owner_id LIMIT 1)
	FROM o WHERE o.owner_id IS NOT NULL
), l AS (
	SELECT owner_id, row_number() OVER (ORDER BY owner_id) AS n FROM (SELECT owner_id FROM o WHERE owner_id IS NOT NULL LIMIT $3 + 1) o
), r AS (
	SELECT l.owner_id, coalesce(x.n, 0) AS run
	FROM l LEFT JOIN unnest($1::bigint[], $2::int[]) AS x(owner_id, n) ON x.owner_id = l.owner_id
	WHERE l.n <= $3
), j AS (
	SELECT ($4 + sum(run) OVER w + row_number() OVER w - 1) / row_number() OVER w AS turn
	FROM r WINDOW w AS (ORDER BY run, owner_id ROWS UNBOUNDED PRECEDING)
), m AS (
	SELECT min(j.turn) AS turn FROM j
), s AS (
	SELECT EXISTS (SELECT 1 FROM r, m WHERE r.run >= m.turn) AS starved, EXISTS (SELECT 1 FROM l WHERE l.n > $3) AS beyond
)
SELECT t.*, m.turn - r.run, s.starved, s.beyond
	FROM r, m, s, LATERAL (
		SELECT t.id, t.workflow_id::text, t.owner_id, t.module_id, t.name, t.priority, t.sort_key, t.pending, t.replicas,
			t.attempts = 0, t.ckpt_ms,
			CASE WHEN t.max_replicas > 1 THEN ARRAY(SELECT DISTINCT a.worker_id::text FROM attempts a
				WHERE a.task_id = t.id AND a.state IN ('running', 'succeeded') AND NOT a.superseded) || {avoided}
			ELSE {avoided} END, t.setup IS NOT NULL,
			CASE WHEN t.setup IS NOT NULL THEN ARRAY(SELECT f->>'blob' FROM jsonb_array_elements(t.setup->'files') f WHERE f ? 'blob') END
		FROM tasks t
		WHERE t.owner_id = r.owner_id AND t.pending > 0 AND t.sort_key IS NOT NULL AND t.state = 'ready'
		ORDER BY t.sort_key, t.id LIMIT greatest(m.turn - r.run, 0)
	) t`,
	"{avoided}", `CASE WHEN t.avoid IS NOT NULL THEN
		ARRAY(SELECT x::text FROM unnest(t.avoid) AS x WHERE `+avoids("t", "x")+`) END`)

// avoids is the SQL condition under which task alias t keeps worker w
// (an SQL expression) from it: w is on its avoid list (a volunteer that
// failed, lost or spoiled it), and either fewer than two workers are, or w
// failed it and no second worker has. Two distinct workers on the list
// are evidence enough: from then on a worker that lost the task may take
// it again, and once two failed it, so may they, so that a task with more
// attempts than the pool has volunteers uses them up (and fails) instead
// of waiting for ever at the head of the queue; but a lone failer never
// gets back a task nobody else failed.
func avoids(t, w string) string {
	return strings.NewReplacer("{t}", t, "{w}", w).Replace(`(coalesce({w} = ANY({t}.avoid), false)
		AND (coalesce(cardinality({t}.avoid), 0) < 2
			OR (coalesce({w} = ANY({t}.failed_by), false) AND coalesce(cardinality({t}.failed_by), 0) < 2)))`)
}

// Pick is one decision of the dispatcher's plan: a replica of TaskID on
// Worker.
type Pick struct {
	TaskID int64
	Worker string
	// CkptMS overrides the task's checkpoint interval for this attempt
	// (0 keeps the task's own).
	CkptMS int64
	// Solo starts this replica alone: the worker is trusted (adaptive
	// replication), so no other replica of a fresh task is queued.
	Solo bool
}

// ClaimPicks claims the chosen replicas in one transaction and one round
// trip, like Claim: a pick whose task is no longer ready, is being claimed
// by another replica (SKIP LOCKED), has no replica left to start, or whose
// worker already runs or ran a replica of it is skipped. It returns the
// attempts created, in attempt id order.
func (s *Store) ClaimPicks(ctx context.Context, picks []Pick, lease time.Duration) ([]Claimed, error) {
	if len(picks) == 0 {
		return nil, nil
	}
	tasks := make([]int64, len(picks))
	workers := make([]string, len(picks))
	ckpts := make([]int64, len(picks))
	solos := make([]bool, len(picks))
	for i, p := range picks {
		tasks[i], workers[i], ckpts[i], solos[i] = p.TaskID, p.Worker, p.CkptMS, p.Solo
	}
	b := &pgx.Batch{}
	// A claim needs no WAL flush of its own: losing it in a crash only
	// means its tasks run again, and the attempts' results are refused (no
	// such attempt). Its commit is flushed with the next durable commit
	// after it, at the latest the completion of one of its attempts.
	// guardAttemptIDs keeps a lost attempt's id from being reused.
	queueBegin(b, true)
	sql := claimPicksSQL
	if distinct(tasks) {
		sql = claimOnePerTaskSQL
	}
	b.Queue(sql, tasks, uuidParams(workers), ckpts, solos, lease.Milliseconds())
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	var cs []Claimed
	var err error
	if err = execBegin(br); err == nil {
		cs, err = collectClaimed(br, len(picks))
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("claim ready tasks: %w", err)
	}
	if len(cs) == 0 {
		return nil, nil
	}
	if err := s.loadInputs(ctx, cs); err != nil {
		return cs, err
	}
	return cs, nil
}

// distinct reports whether no value appears twice in xs.
func distinct[T comparable](xs []T) bool {
	seen := make(map[T]struct{}, len(xs))
	for _, x := range xs {
		if _, ok := seen[x]; ok {
			return false
		}
		seen[x] = struct{}{}
	}
	return true
}

// collectClaimed reads the attempts a claim statement (claimPicksSQL,
// claimNewSQL) returns, at most one for each of its picks: the slice is
// made that large at once rather than grown by copying.
func collectClaimed(br pgx.BatchResults, picks int) ([]Claimed, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	return collectClaimedRows(rows, picks)
}

// collectClaimedRows is collectClaimed for the claim's rows.
func collectClaimedRows(rows pgx.Rows, picks int) ([]Claimed, error) {
	in := interned{}
	var worker, wf, module, prio pgtype.DriverBytes
	var restore pgtype.Text // declared once: Scan's pointer would move it to the heap per row
	return pgx.AppendRows(make([]Claimed, 0, picks), rows, func(r pgx.CollectableRow) (Claimed, error) {
		var c Claimed
		err := r.Scan(&c.Attempt, &worker, &c.TaskID, &wf, &c.Owner, &c.Name, &module, &c.Args, &c.Stdin, &prio,
			&c.TimeoutMS, &c.MemoryPages, &c.OutputBytes, &c.LogBytes, &c.CkptMS, &c.Seed, &c.Restore, &c.Setup, &c.hasInputs, &restore)
		c.Worker, c.WorkflowID, c.Module, c.Priority = in.of(worker), in.of(wf), in.of(module), in.of(prio)
		if restore.Valid {
			id, size, _ := strings.Cut(restore.String, " ")
			c.RestoreBlob = id
			c.RestoreSize, _ = strconv.ParseInt(size, 10, 64)
		}
		return c, err
	})
}

// interned gives the values of a batch's columns that mostly repeat (the
// workers, workflows, modules and priorities of a claim's attempts) one
// string per distinct value: scanned as strings, each row's took an
// allocation of its own.
type interned map[string]string

// of returns the string of b (pgtype.DriverBytes, valid until the next row).
func (m interned) of(b []byte) string {
	if s, ok := m[string(b)]; ok {
		return s
	}
	s := string(b)
	m[s] = s
	return s
}

// claimPicksSQL claims picks ($1 task ids, $2 worker ids, $3 checkpoint
// intervals, $4 solo flags; $5 lease in ms). Tasks are locked in id order
// (SKIP LOCKED: another replica's claim wins), a task gives at most its
// pending replicas, each to a distinct worker without a running or
// succeeded attempt of it (attempts superseded by a reset do not count)
// and not among the workers the task avoids (tasks.avoid).
//
// A task that never had an attempt counted (attempts = 0: a fresh task, or
// one reset by re-verification, whose attempts are all superseded) cannot
// have a running or succeeded one, so the lookup is skipped (a one-time
// filter) for it: the common case, one probe of attempts_task less per pick.
//
// That last check is a LATERAL lookup with LIMIT 1 rather than NOT EXISTS
// on purpose: PostgreSQL turns NOT EXISTS into an anti join, and with the
// statistics of a growing attempts table (autovacuum analyzes it seldom)
// chose to scan and sort the whole table for every claim, 5 to 15 ms per
// claim by the end of a 20,000-task workflow. The lookup probes
// attempts_task once per pick.
//
// The picked tasks are found by id: the state test is written with
// COLLATE "C" (the same test for this ASCII state, as in doneCTEs) so that
// it matches the predicate of neither tasks_ready nor tasks_active. With the
// statistics of a table analyzed while small, PostgreSQL otherwise read
// every ready task through one of them for each claim.
var claimPicksSQL = claimPicksCTE + claimLockedCTE + claimReplicasCTEs + claimTailSQL

// claimOnePerTaskSQL is claimPicksSQL for picks of distinct tasks, the
// common case (one replica per task): each pick takes one of its task's
// pending replicas, so the window that shares replicas out among workers
// (claimReplicasCTEs) is not needed. Its sorts of the picks' wide rows
// were about an eighth of a claim's time.
var claimOnePerTaskSQL = claimPicksCTE + claimLockedCTE + claimOnePerTaskCTEs + claimTailSQL

// claimNewSQL is claimPicksSQL for tasks of the workflow $6 written earlier
// in the same transaction, named by $1 task names instead of ids
// (Store.CreateWorkflowClaiming).
var claimNewSQL = claimNewCTE + claimLockedCTE + claimReplicasCTEs + claimTailSQL

// claimNewOnePerTaskSQL is claimNewSQL for picks of distinct tasks.
var claimNewOnePerTaskSQL = claimNewCTE + claimLockedCTE + claimOnePerTaskCTEs + claimTailSQL

// claimNewEarlySQL is claimNewOnePerTaskSQL with the attempts' ids given
// ($7, one per pick, drawn ahead by idBlock) rather than drawn from the
// sequence: CreateWorkflowClaiming sends the attempts before it runs.
var claimNewEarlySQL = claimEarlyCTE + claimLockedCTE + onePerTaskCTEs("o.aid", "p.aid, ") + claimTailSQL

// claimPicksCTE and claimNewCTE are the picks (p) of the claim statements.
const (
	claimPicksCTE = `
WITH p AS (
	SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::bool[]) WITH ORDINALITY AS p(task_id, w, ckpt, solo, ord)
)`
	claimNewCTE = `
WITH p AS (
	SELECT t.id AS task_id, u.w, u.ckpt, u.solo, u.ord
	FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::bool[]) WITH ORDINALITY AS u(name, w, ckpt, solo, ord)
	JOIN tasks t ON t.workflow_id = $6 AND t.name = u.name
)`
	claimEarlyCTE = `
WITH p AS (
	SELECT t.id AS task_id, u.w, u.ckpt, u.solo, u.ord, u.aid
	FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::bool[], $7::bigint[]) WITH ORDINALITY AS u(name, w, ckpt, solo, aid, ord)
	JOIN tasks t ON t.workflow_id = $6 AND t.name = u.name
)`
)

// claimLockedCTE locks the picked tasks that are still ready.
const claimLockedCTE = `, locked AS (
	SELECT t.id, t.pending, t.attempts, t.avoid, t.failed_by, t.workflow_id, t.owner_id, t.name, t.module_id, t.args, t.stdin, t.priority, t.timeout_ms, t.memory_pages,
		t.output_bytes, t.log_bytes, t.ckpt_ms, t.seed, t.setup,
		-- Replicas are independent: none resumes from a checkpoint that
		-- another replica's worker saved.
		CASE WHEN t.max_replicas > 1 THEN NULL ELSE t.checkpoint END AS checkpoint,
		CASE WHEN t.max_replicas > 1 THEN 0 ELSE t.checkpoint_seq END AS checkpoint_seq
	FROM tasks t WHERE t.id IN (SELECT task_id FROM p) AND t.state COLLATE "C" = 'ready' AND t.pending > 0
	ORDER BY t.id FOR UPDATE SKIP LOCKED
)`

// claimReplicasCTEs choose the attempts (ok) among picks that may name a
// task several times, and update the tasks (upd).
var claimReplicasCTEs = `, fit AS (
	-- The task's columns come along from the join with locked here, so
	-- that ok needs no second join: PostgreSQL estimates one row for these
	-- CTEs and joined them by nested loops, each pass over this window
	-- anew (80 picks: 80 sorts of 80 rows, 5 to 10 ms per claim with the
	-- statistics of a table analyzed while small).
	SELECT d.*, row_number() OVER (PARTITION BY d.task_id ORDER BY d.ord) AS k FROM (
		SELECT DISTINCT ON (p.task_id, p.w) p.*, l.pending, l.workflow_id, l.owner_id, l.name, l.module_id, l.args, l.stdin, l.priority,
			l.timeout_ms, l.memory_pages, l.output_bytes, l.log_bytes, l.seed, l.setup, l.checkpoint, l.checkpoint_seq, l.ckpt_ms AS task_ckpt_ms
		FROM p JOIN locked l ON l.id = p.task_id
		LEFT JOIN LATERAL (SELECT 1 AS x FROM attempts a WHERE l.attempts > 0 AND a.task_id = p.task_id AND a.worker_id = p.w
			AND a.state IN ('running', 'succeeded') AND NOT a.superseded LIMIT 1) ran ON true
		WHERE ran.x IS NULL AND NOT ` + avoids("l", "p.w") + `
		ORDER BY p.task_id, p.w, p.ord
	) d
), ok AS (
	-- The attempt ids are drawn here, in the plan's order, so that neither
	-- the insert nor the result needs a join with another CTE's rows.
	SELECT nextval('attempts_id_seq') AS attempt, o.* FROM (
		SELECT fit.task_id, fit.w, fit.ckpt, fit.solo, fit.ord, fit.workflow_id, fit.owner_id, fit.name, fit.module_id, fit.args, fit.stdin,
			fit.priority, fit.timeout_ms, fit.memory_pages, fit.output_bytes, fit.log_bytes, fit.seed, fit.setup, fit.checkpoint,
			fit.checkpoint_seq, CASE WHEN fit.ckpt > 0 THEN fit.ckpt ELSE fit.task_ckpt_ms END AS ckpt_ms
		FROM fit WHERE fit.k <= fit.pending ORDER BY fit.ord
	) o
), n AS (
	SELECT task_id, count(*) AS n, bool_or(solo) AS solo FROM ok GROUP BY task_id
), upd AS (
	-- Every task of n is locked by this statement: the update takes them all.
	UPDATE tasks t SET pending = CASE WHEN n.solo THEN 0 ELSE t.pending - n.n END,
		state = CASE WHEN n.solo OR t.pending - n.n <= 0 THEN 'running' ELSE 'ready' END,
		attempts = t.attempts + n.n, started_at = coalesce(t.started_at, now()), updated_at = now()
	FROM n WHERE t.id = n.task_id
)`

// dataBytesSQL is the size of the data an attempt (ok) downloads before
// its task starts: the blobs its setup mounts, the outputs of upstream
// tasks it reads that were uploaded over HTTP (loadInputs: the worker
// downloads them as it does a setup's blobs), and its checkpoint when it
// was uploaded over HTTP (kept in a blob, not in the task's row). The
// inputs' look-up is by task_inputs' key, as the claim's own test for
// inputs is. With its output limit: the outputs a worker uploads after
// the task ends, while the attempt still counts as running.
const dataBytesSQL = `CASE WHEN ok.setup IS NULL THEN 0 ELSE coalesce((SELECT sum(b.size) FROM blobs b
		WHERE b.id IN (SELECT f->>'blob' FROM jsonb_array_elements(ok.setup->'files') f WHERE f ? 'blob')), 0) END
	+ coalesce((SELECT sum(b.size) FROM task_inputs ti JOIN task_outputs o ON o.task_id = ti.from_task AND o.name = ti.output
		JOIN blobs b ON b.id = o.blob_id WHERE ti.task_id = ok.task_id), 0)
	+ CASE WHEN ok.checkpoint IS NULL AND ok.checkpoint_seq > 0 THEN coalesce((SELECT b.size FROM tasks t JOIN blobs b ON b.id = t.checkpoint_blob
		WHERE t.id = ok.task_id), 0) ELSE 0 END
	+ ok.output_bytes`

// claimOnePerTaskCTEs are claimReplicasCTEs for picks of distinct tasks:
// every locked task has a pending replica for its one pick, unless its
// worker runs or ran one of it already.
var claimOnePerTaskCTEs = onePerTaskCTEs("nextval('attempts_id_seq')", "")

// onePerTaskCTEs are claimOnePerTaskCTEs with each attempt's id from the
// expression attempt (over o, the chosen picks, whose columns pick adds
// to: claimNewEarlySQL's ids drawn ahead).
func onePerTaskCTEs(attempt, pick string) string {
	return `, ok AS (
	SELECT ` + attempt + ` AS attempt, o.* FROM (
		SELECT ` + pick + `p.task_id, p.w, p.ckpt, p.solo, p.ord, l.workflow_id, l.owner_id, l.name, l.module_id, l.args, l.stdin,
			l.priority, l.timeout_ms, l.memory_pages, l.output_bytes, l.log_bytes, l.seed, l.setup, l.checkpoint,
			l.checkpoint_seq, CASE WHEN p.ckpt > 0 THEN p.ckpt ELSE l.ckpt_ms END AS ckpt_ms
		FROM p JOIN locked l ON l.id = p.task_id
		LEFT JOIN LATERAL (SELECT 1 AS x FROM attempts a WHERE l.attempts > 0 AND a.task_id = p.task_id AND a.worker_id = p.w
			AND a.state IN ('running', 'succeeded') AND NOT a.superseded LIMIT 1) ran ON true
		WHERE ran.x IS NULL AND NOT ` + avoids("l", "p.w") + `
		ORDER BY p.ord
	) o
), upd AS (
	UPDATE tasks t SET pending = CASE WHEN ok.solo THEN 0 ELSE t.pending - 1 END,
		state = CASE WHEN ok.solo OR t.pending <= 1 THEN 'running' ELSE 'ready' END,
		attempts = t.attempts + 1, started_at = coalesce(t.started_at, now()), updated_at = now()
	FROM ok WHERE t.id = ok.task_id
)`
}

// DataAllowanceBytesPerSecond is the slowest download the server's bound
// on how long an attempt may be held allows for (a volunteer's link of
// 2 Mbit/s): the data a task's setup mounts, the upstream outputs it
// reads that were uploaded over HTTP, and a checkpoint uploaded over HTTP
// are downloaded before the task's wall time starts on its
// worker, so each of their bytes adds its time at this rate to the wall
// time the attempt carries (attempts.timeout_ms; Renew).
const DataAllowanceBytesPerSecond = 256 << 10

// claimTailSQL writes the attempts the claim chose (ok) and returns them.
var claimTailSQL = `, ins AS (
	-- The task's wall time goes with the attempt: renewals bound its lease
	-- by it (attempts.deadline, migrations/00028) without reading tasks;
	-- with the time its data takes to download (dataBytesSQL), which only
	-- tasks with a setup, inputs or a checkpoint in a blob read.
	INSERT INTO attempts (id, task_id, worker_id, lease_until, restored_seq, ckpt_ms, timeout_ms)
	SELECT ok.attempt, ok.task_id, ok.w, now() + $5 * interval '1 millisecond', ok.checkpoint_seq, ok.ckpt_ms,
		ok.timeout_ms + (` + dataBytesSQL + `) * 1000 / ` + strconv.Itoa(DataAllowanceBytesPerSecond) + `
	FROM ok ORDER BY ok.attempt
), run AS (
	-- What the lease reaper reads (migrations/00012_attempts_done_in_place.sql).
	INSERT INTO running_attempts (attempt_id) SELECT ok.attempt FROM ok ORDER BY ok.attempt
), wk AS (
	UPDATE workers w SET attempts = w.attempts + c.n
	FROM (SELECT w AS worker_id, count(*) AS n FROM ok GROUP BY w ORDER BY w) c WHERE w.id = c.worker_id
)
SELECT ok.attempt, ok.w::text, ok.task_id, ok.workflow_id::text, ok.owner_id, ok.name, ok.module_id, ok.args, ok.stdin, ok.priority,
	ok.timeout_ms, ok.memory_pages, ok.output_bytes, ok.log_bytes, ok.ckpt_ms, ok.seed, ok.checkpoint, ok.setup,
	EXISTS (SELECT 1 FROM task_inputs ti WHERE ti.task_id = ok.task_id),
	-- A checkpoint uploaded over HTTP (rare): read only for a task that
	-- has a checkpoint but not its bytes.
	CASE WHEN ok.checkpoint IS NULL AND ok.checkpoint_seq > 0 THEN
		(SELECT b.id || ' ' || b.size FROM tasks t JOIN blobs b ON b.id = t.checkpoint_blob WHERE t.id = ok.task_id) END
FROM ok ORDER BY ok.attempt`
