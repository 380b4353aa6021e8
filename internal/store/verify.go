package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/internal/sched"
)

// Verdicts of a replica's result.
const (
	VerdictValid      = "valid"      // agreed with the accepted quorum
	VerdictInvalid    = "invalid"    // lost the quorum
	VerdictUnverified = "unverified" // accepted alone from a trusted worker
)

// OutputsHash is the hash results are compared by: sha256 over the outputs
// sorted by name, each as its name, a NUL, its length (8 bytes, big endian)
// and its bytes. It reads "sha256:<hex>".
func OutputsHash(os []Output) string {
	sorted := slices.Clone(os)
	slices.SortFunc(sorted, func(a, b Output) int { return strings.Compare(a.Name, b.Name) })
	h := sha256.New()
	var n [8]byte
	for _, o := range sorted {
		h.Write([]byte(o.Name))
		h.Write([]byte{0})
		binary.BigEndian.PutUint64(n[:], uint64(len(o.Data)))
		h.Write(n[:])
		h.Write(o.Data)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// replicaResult is an accepted success of a replicated task, in Complete.
type replicaResult struct {
	attempt int64
	task    int64
	worker  string
	outputs []Output
}

// verifyTask is what verification reads of a replicated task (locked).
type verifyTask struct {
	id          int64
	state       string
	pending     int
	replicas    int
	quorum      int
	maxReplicas int
	hash        string // accepted hash, once done
}

// replicaAttempt is one attempt of a replicated task.
type replicaAttempt struct {
	id      int64
	worker  string
	state   string
	hash    string
	verdict string
}

// verifyOutcome is what to do with one replicated task after new results.
type verifyOutcome struct {
	accept   string // the accepted hash ("" = not accepted now)
	winner   int64  // attempt whose outputs become the task's
	verdicts map[int64]string
	valid    []string // workers whose results agreed
	invalid  []string // workers whose results lost
	more     int      // replicas to queue
	fail     string   // reason the task fails ("" = it does not)
	solo     bool     // accepted alone from a trusted worker
	// soloWorker is the worker whose lone result was accepted (solo).
	soloWorker string
}

// verifyConfig is a task's sched.VerifyConfig, with the store's trust
// policy (WithTrust).
func (t verifyTask) verifyConfig(trust sched.VerifyConfig) sched.VerifyConfig {
	return sched.VerifyConfig{Replicas: t.replicas, Quorum: t.quorum, MaxReplicas: t.maxReplicas,
		TrustAfter: trust.TrustAfter, TrustWindow: trust.TrustWindow}
}

// decideReplicas applies sched.Decide to a replicated task's results. A
// task already done judges late results against its accepted hash; a task
// in another final state ignores them. trust is the store's trust policy
// (WithTrust).
func decideReplicas(t verifyTask, as []replicaAttempt, reps map[string]sched.Reputation, trust sched.VerifyConfig) verifyOutcome {
	out := verifyOutcome{verdicts: map[int64]string{}}
	cfg := t.verifyConfig(trust)
	if t.state == StateDone {
		for _, a := range as {
			if a.state == "succeeded" && a.hash != "" && a.verdict == "" && t.hash != "" {
				if a.hash == t.hash {
					out.verdicts[a.id] = VerdictValid
					out.valid = append(out.valid, a.worker)
				} else {
					out.verdicts[a.id] = VerdictInvalid
					out.invalid = append(out.invalid, a.worker)
				}
			}
		}
		return out
	}
	if t.state != StateRunning && t.state != StateReady {
		return out
	}
	var results []sched.Result
	var ids []int64
	outstanding := t.pending
	for _, a := range as {
		switch {
		case a.state == "running":
			outstanding++
		case a.state == "succeeded" && a.hash != "" && a.verdict == "":
			results = append(results, sched.Result{Worker: a.worker, Hash: a.hash})
			ids = append(ids, a.id)
		}
	}
	if len(results) == 0 {
		return out
	}
	// A task under re-check (t.hash set while it is not done) is never
	// accepted on one result: its first one came from a worker that lost a
	// quorum.
	trusted := len(results) == 1 && t.hash == "" && reps[results[0].Worker].Trusted(cfg)
	v := sched.Decide(results, outstanding, cfg, trusted)
	switch v.State {
	case sched.Accepted:
		out.accept = v.Hash
		out.solo = len(results) == 1 && cfg.Quorum > 1
		if out.solo {
			out.soloWorker = results[0].Worker
		}
		for i, r := range results {
			switch {
			case r.Hash != v.Hash:
				out.verdicts[ids[i]] = VerdictInvalid
				out.invalid = append(out.invalid, r.Worker)
			case out.solo:
				out.verdicts[ids[i]] = VerdictUnverified
			default:
				out.verdicts[ids[i]] = VerdictValid
				out.valid = append(out.valid, r.Worker)
			}
			if r.Hash == v.Hash && out.winner == 0 {
				out.winner = ids[i]
			}
		}
	case sched.Pending:
		out.more = v.More
	case sched.Failed:
		counts := map[string]int{}
		for _, r := range results {
			counts[r.Hash]++
		}
		out.fail = fmt.Sprintf("no quorum: %d results in %d different versions, %d identical needed (at most %d replicas)",
			len(results), len(counts), cfg.Quorum, cfg.MaxReplicas)
	}
	return out
}

// reputation turns a worker's stored record into a sched.Reputation: the
// streak of valid results stands for the recent ones, up to window of
// them (sched.VerifyConfig.TrustWindow).
func reputation(valid, invalid int64, streak, window int) sched.Reputation {
	r := sched.Reputation{Valid: int(valid), Invalid: int(invalid)}
	n := min(streak, window)
	for range n {
		r.Recent = append(r.Recent, true)
	}
	if invalid > 0 && streak < r.Valid+r.Invalid {
		r.Recent = append([]bool{false}, r.Recent...)
	}
	return r
}

// verify records the results of replicated tasks (hash and outputs, kept
// aside), then decides each task under its row lock: tasks that reach a
// quorum get the quorum's outputs and are returned as done (state running,
// for doneSQL); tasks that need more replicas queue them; tasks that cannot
// reach a quorum are returned as permanent ends. Workers whose results
// agreed or lost gain or lose reputation, and the results that losers had
// got accepted alone are re-checked (recheckUnverified); a re-check whose
// quorum overturns the old result resets everything downstream
// (resetDescendants). It runs in Complete's transaction, and only for
// replicated tasks.
func (s *Store) verify(ctx context.Context, tx querier, rs []replicaResult) (done []int64, ends []attemptEnd, err error) {
	var aids []int64
	var hashes []string
	var oa []int64
	var on []string
	var od [][]byte
	taskSet := map[int64]bool{}
	for _, r := range rs {
		aids = append(aids, r.attempt)
		hashes = append(hashes, OutputsHash(r.outputs))
		taskSet[r.task] = true
		for _, o := range r.outputs {
			if o.Data == nil {
				o.Data = []byte{}
			}
			oa, on, od = append(oa, r.attempt), append(on, o.Name), append(od, o.Data)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE attempts a SET result_hash = u.h FROM unnest($1::bigint[], $2::text[]) AS u(id, h) WHERE a.id = u.id`,
		aids, hashes); err != nil {
		return nil, nil, fmt.Errorf("record result hashes: %w", err)
	}
	if len(oa) > 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO attempt_outputs (attempt_id, name, data)
			SELECT * FROM unnest($1::bigint[], $2::text[], $3::bytea[])`, oa, on, od); err != nil {
			return nil, nil, fmt.Errorf("keep replica outputs: %w", err)
		}
	}
	tids := make([]int64, 0, len(taskSet))
	for t := range taskSet {
		tids = append(tids, t)
	}
	slices.Sort(tids)
	rows, err := tx.Query(ctx, `SELECT id, state, pending, replicas, quorum, max_replicas, coalesce(result_hash, '')
		FROM tasks WHERE id = ANY($1) ORDER BY id FOR UPDATE`, tids)
	if err != nil {
		return nil, nil, fmt.Errorf("lock replicated tasks: %w", err)
	}
	tasks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (verifyTask, error) {
		var t verifyTask
		err := r.Scan(&t.id, &t.state, &t.pending, &t.replicas, &t.quorum, &t.maxReplicas, &t.hash)
		return t, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("lock replicated tasks: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT a.task_id, a.id, a.worker_id::text, a.state, coalesce(a.result_hash, ''), coalesce(a.verdict, ''),
			w.results_valid, w.results_invalid, w.valid_streak
		FROM attempts a LEFT JOIN workers w ON w.id = a.worker_id WHERE a.task_id = ANY($1) AND NOT a.superseded ORDER BY a.id`, tids)
	if err != nil {
		return nil, nil, fmt.Errorf("read replicas: %w", err)
	}
	byTask := map[int64][]replicaAttempt{}
	reps := map[string]sched.Reputation{}
	for rows.Next() {
		var t int64
		var a replicaAttempt
		var valid, invalid *int64
		var streak *int
		if err := rows.Scan(&t, &a.id, &a.worker, &a.state, &a.hash, &a.verdict, &valid, &invalid, &streak); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("read replicas: %w", err)
		}
		byTask[t] = append(byTask[t], a)
		if valid != nil {
			reps[a.worker] = reputation(*valid, *invalid, *streak, s.trust.TrustWindow)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read replicas: %w", err)
	}

	var vIDs []int64
	var vVals []string
	var accT []int64
	var accH []string
	var accW []int64
	var moreT []int64
	var moreN []int32
	var finished []int64 // tasks whose kept replica outputs can go
	var refuted []int64  // re-checked tasks whose quorum overturned the result accepted alone
	type delta struct{ valid, invalid int32 }
	deltas := map[string]*delta{}
	outcomes := make([]verifyOutcome, len(tasks))
	for i, t := range tasks {
		outcomes[i] = decideReplicas(t, byTask[t.id], reps, s.trust)
	}
	// A worker that loses a quorum in this batch is not trusted with a
	// lone result in the same batch either: decide again without its trust.
	losers := map[string]bool{}
	for _, o := range outcomes {
		for _, w := range o.invalid {
			losers[w] = true
		}
	}
	// A lone result is accepted on the worker's latest record: its row is
	// locked (FOR SHARE) and read again, so that a concurrent batch in which
	// it loses a quorum either commits first (and the worker is no longer
	// trusted here) or waits for this one (and then sees the unverified
	// result to re-check).
	var soloWorkers []string
	for _, o := range outcomes {
		if o.solo && !slices.Contains(soloWorkers, o.soloWorker) {
			soloWorkers = append(soloWorkers, o.soloWorker)
		}
	}
	again := false
	if len(soloWorkers) > 0 {
		slices.Sort(soloWorkers)
		rows, err := tx.Query(ctx, `SELECT id::text, results_valid, results_invalid, valid_streak FROM workers
			WHERE id = ANY($1::uuid[]) ORDER BY id FOR SHARE`, soloWorkers)
		if err != nil {
			return nil, nil, fmt.Errorf("read trusted workers: %w", err)
		}
		for rows.Next() {
			var w string
			var valid, invalid int64
			var streak int
			if err := rows.Scan(&w, &valid, &invalid, &streak); err != nil {
				rows.Close()
				return nil, nil, fmt.Errorf("read trusted workers: %w", err)
			}
			if r := reputation(valid, invalid, streak, s.trust.TrustWindow); !r.Trusted(s.trust) {
				reps[w] = r
				again = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("read trusted workers: %w", err)
		}
	}
	for _, o := range outcomes {
		if o.solo && losers[o.soloWorker] {
			reps[o.soloWorker] = sched.Reputation{Invalid: 1}
			again = true
		}
	}
	if again {
		for i, t := range tasks {
			outcomes[i] = decideReplicas(t, byTask[t.id], reps, s.trust)
		}
	}
	for i, t := range tasks {
		o := outcomes[i]
		for id, v := range o.verdicts {
			vIDs, vVals = append(vIDs, id), append(vVals, v)
		}
		for _, w := range o.valid {
			if deltas[w] == nil {
				deltas[w] = &delta{}
			}
			deltas[w].valid++
		}
		for _, w := range o.invalid {
			if deltas[w] == nil {
				deltas[w] = &delta{}
			}
			deltas[w].invalid++
		}
		switch {
		case o.accept != "":
			accT, accH, accW = append(accT, t.id), append(accH, o.accept), append(accW, o.winner)
			finished = append(finished, t.id)
			done = append(done, t.id)
			if t.state != StateDone && t.hash != "" && t.hash != o.accept {
				refuted = append(refuted, t.id)
			}
		case o.fail != "":
			finished = append(finished, t.id)
			ends = append(ends, attemptEnd{task: t.id, reason: o.fail, end: EndTaskFinal})
		case o.more > 0:
			moreT, moreN = append(moreT, t.id), append(moreN, int32(o.more))
		}
		if t.state == StateDone {
			finished = append(finished, t.id)
		}
	}
	b := &pgx.Batch{}
	if len(vIDs) > 0 {
		b.Queue(`UPDATE attempts a SET verdict = u.v FROM unnest($1::bigint[], $2::text[]) AS u(id, v) WHERE a.id = u.id`, vIDs, vVals)
	}
	if len(deltas) > 0 {
		ws := make([]string, 0, len(deltas))
		for w := range deltas {
			ws = append(ws, w)
		}
		slices.Sort(ws)
		dv := make([]int32, len(ws))
		di := make([]int32, len(ws))
		for i, w := range ws {
			dv[i], di[i] = deltas[w].valid, deltas[w].invalid
		}
		b.Queue(`UPDATE workers w SET results_valid = w.results_valid + d.v, results_invalid = w.results_invalid + d.i,
				valid_streak = CASE WHEN d.i > 0 THEN 0 ELSE w.valid_streak + d.v END, `+strikesSet("d.i")+`
			FROM unnest($1::uuid[], $2::int[], $3::int[]) AS d(id, v, i) WHERE w.id = d.id`, ws, dv, di)
	}
	if len(refuted) > 0 {
		// The quorum's outputs replace those accepted alone.
		b.Queue(`DELETE FROM task_outputs WHERE task_id = ANY($1)`, refuted)
	}
	if len(accT) > 0 {
		b.Queue(`UPDATE tasks t SET result_hash = u.h, pending = 0, state = 'running', disputed = false
			FROM unnest($1::bigint[], $2::text[]) AS u(id, h) WHERE t.id = u.id`, accT, accH)
		b.Queue(`INSERT INTO task_outputs (task_id, name, data)
			SELECT u.t, o.name, o.data FROM unnest($1::bigint[], $2::bigint[]) AS u(t, a) JOIN attempt_outputs o ON o.attempt_id = u.a
			ON CONFLICT DO NOTHING`, accT, accW)
	}
	if len(moreT) > 0 {
		b.Queue(`UPDATE tasks t SET pending = t.pending + u.n, state = 'ready', updated_at = now()
			FROM unnest($1::bigint[], $2::int[]) AS u(id, n) WHERE t.id = u.id`, moreT, moreN)
		b.Queue(`SELECT pg_notify($1, '')`, ChannelReady)
	}
	if len(finished) > 0 {
		b.Queue(`DELETE FROM attempt_outputs o USING attempts a WHERE a.id = o.attempt_id AND a.task_id = ANY($1)`, finished)
	}
	if b.Len() > 0 {
		if err := sendBatch(ctx, tx, b); err != nil {
			return nil, nil, fmt.Errorf("settle replicated tasks: %w", err)
		}
	}
	if len(accT) > 0 {
		// The other replicas of an accepted task are no longer needed.
		if err := cancelRunning(ctx, tx, accT, "a quorum of other replicas agreed"); err != nil {
			return nil, nil, fmt.Errorf("cancel extra replicas: %w", err)
		}
	}
	if len(refuted) > 0 {
		if err := s.resetDescendants(ctx, tx, refuted); err != nil {
			return nil, nil, err
		}
	}
	if len(losers) > 0 {
		ls := make([]string, 0, len(losers))
		for w := range losers {
			ls = append(ls, w)
		}
		slices.Sort(ls)
		if err := s.recheckUnverified(ctx, tx, ls); err != nil {
			return nil, nil, err
		}
	}
	return done, ends, nil
}

// cancelRunning ends the running attempts of tasks as cancelled, with a
// reason, and tells every server replica (ChannelCancel) to stop them on
// their workers. An attempt another transaction is completing right now is
// skipped (SKIP LOCKED): its result then arrives for a task that moved on
// and is judged late or ignored.
func cancelRunning(ctx context.Context, tx querier, tasks []int64, reason string) error {
	if len(tasks) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `UPDATE attempts SET state = 'cancelled', ended_at = now(), reason = $2
		WHERE id IN (SELECT id FROM attempts WHERE task_id = ANY($1) AND state = 'running' ORDER BY id FOR UPDATE SKIP LOCKED)
		RETURNING id`, tasks, reason)
	if err != nil {
		return err
	}
	cancelled, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	return notifyCancel(ctx, tx, cancelled)
}

// recheckUnverified re-checks the results that workers who just lost a
// quorum had got accepted alone (verdict unverified, adaptive replication).
// A task of a running workflow is reopened: its lone result counts again as
// one replica's, more replicas are queued until a quorum decides, the
// workflow waits for it, and its dependents that have not yet read its
// outputs wait too (they become blocked again). When the quorum agrees with
// the old result, nothing else changes; when it overturns it, the task takes
// the quorum's outputs and everything downstream that ran on the old ones
// runs again (resetDescendants). A task of a finished workflow cannot be
// re-run: it is flagged disputed instead.
func (s *Store) recheckUnverified(ctx context.Context, tx querier, losers []string) error {
	// Lock the running workflows concerned first, so that none finishes or
	// is cancelled while its tasks are reopened.
	rows, err := tx.Query(ctx, `SELECT w.id::text FROM workflows w
		WHERE w.id IN (SELECT t.workflow_id FROM attempts a JOIN tasks t ON t.id = a.task_id
			WHERE a.worker_id = ANY($1::uuid[]) AND a.verdict = 'unverified' AND NOT a.superseded AND t.state = 'done')
		AND w.state = 'running' ORDER BY w.id FOR UPDATE`, losers)
	if err != nil {
		return fmt.Errorf("re-check unverified results: %w", err)
	}
	wfs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("re-check unverified results: %w", err)
	}
	if len(wfs) > 0 {
		rows, err := tx.Query(ctx, `WITH r AS (
				SELECT DISTINCT ON (t.id) t.id, a.id AS attempt FROM attempts a JOIN tasks t ON t.id = a.task_id
				WHERE a.worker_id = ANY($1::uuid[]) AND a.verdict = 'unverified' AND NOT a.superseded AND t.state = 'done' AND t.workflow_id = ANY($2::uuid[])
				ORDER BY t.id, a.id
			), t AS (
				UPDATE tasks SET state = 'ready', pending = greatest(tasks.quorum - 1, 1), finished_at = NULL, updated_at = now(),
					owner_id = (SELECT w.owner_id FROM workflows w WHERE w.id = tasks.workflow_id), -- 0 in rows older than migration 00026
					checkpoint = NULL, checkpoint_blob = NULL, checkpoint_at = NULL, failed_by = NULL, avoid = NULL,
					error = 'result being re-checked: the worker that produced it alone lost a quorum on another task'
				FROM r WHERE tasks.id = r.id AND tasks.state = 'done' RETURNING tasks.id, tasks.workflow_id
			), av AS (
				UPDATE attempts SET verdict = NULL FROM r WHERE attempts.id = r.attempt AND r.id IN (SELECT id FROM t) RETURNING 1
			), dep AS (
				UPDATE tasks d SET deps_left = d.deps_left + x.n, state = 'blocked', sort_key = NULL, updated_at = now()
				FROM (SELECT ti.task_id, count(DISTINCT ti.from_task) AS n FROM task_inputs ti JOIN t ON ti.from_task = t.id GROUP BY ti.task_id) x
				WHERE d.id = x.task_id AND (d.state = 'blocked' OR d.state = 'ready' AND d.attempts = 0)
				RETURNING 1
			), c AS (
				SELECT workflow_id, count(*) AS n FROM t GROUP BY workflow_id
			), wf AS (
				UPDATE workflows w SET tasks_left = w.tasks_left + c.n FROM c WHERE w.id = c.workflow_id RETURNING 1
			)
			SELECT count(*) FROM t`, losers, wfs)
		if err != nil {
			return fmt.Errorf("reopen unverified results: %w", err)
		}
		reopened, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("reopen unverified results: %w", err)
		}
		if reopened > 0 {
			if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, ChannelReady); err != nil {
				return fmt.Errorf("reopen unverified results: %w", err)
			}
		}
	}
	// What is left are results of finished workflows: flag them.
	if _, err := tx.Exec(ctx, `UPDATE tasks t SET disputed = true, updated_at = now() FROM attempts a
		WHERE a.task_id = t.id AND a.worker_id = ANY($1::uuid[]) AND a.verdict = 'unverified' AND NOT a.superseded AND t.state = 'done' AND NOT t.disputed`,
		losers); err != nil {
		return fmt.Errorf("flag disputed results: %w", err)
	}
	return nil
}

// resetDescendants runs again everything downstream of re-checked tasks
// whose result a quorum overturned (tasks in state running, about to be
// marked done with the quorum's outputs). Every descendant that is not
// cancelled goes back to blocked, as new: its running attempts are
// cancelled, its outputs, checkpoint and verification are dropped, its
// past attempts are superseded (they count neither as replicas nor against
// its workers) and its attempts count from zero. A descendant that also
// depends on a failed task becomes upstream_failed. The workflows' counts
// follow; marking the tasks done afterwards (doneSQL) releases their
// direct dependents.
func (s *Store) resetDescendants(ctx context.Context, tx querier, tasks []int64) error {
	// Locks go attempts first, then tasks, the order in which completions
	// and checkpoints take them: the other order deadlocks with an attempt
	// of a descendant that checkpoints or completes just now.
	rows, err := tx.Query(ctx, `WITH RECURSIVE down(id) AS (
			SELECT ti.task_id FROM task_inputs ti JOIN tasks d ON d.id = ti.task_id WHERE ti.from_task = ANY($1) AND d.state <> 'cancelled'
			UNION SELECT ti.task_id FROM task_inputs ti JOIN down ON ti.from_task = down.id JOIN tasks d ON d.id = ti.task_id
				WHERE d.state <> 'cancelled')
		SELECT id FROM down WHERE NOT id = ANY($1) ORDER BY id`, tasks)
	if err != nil {
		return fmt.Errorf("reset descendants: %w", err)
	}
	down, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("reset descendants: %w", err)
	}
	if len(down) == 0 {
		return nil
	}
	// Cancel their running attempts, waiting for the lock of one being
	// renewed, checkpointed or completed right now (not SKIP LOCKED as in
	// cancelRunning): an attempt left running here would go on renewing
	// its lease and saving checkpoints computed from the overturned input,
	// which the task's next attempts would then restore.
	rows, err = tx.Query(ctx, `WITH r AS (SELECT id FROM attempts WHERE task_id = ANY($1) AND state = 'running' ORDER BY id FOR UPDATE)
		UPDATE attempts a SET state = 'cancelled', ended_at = now(), reason = $2 FROM r WHERE a.id = r.id AND a.state = 'running'
		RETURNING a.id`, down, "an upstream result was overturned by re-verification")
	if err != nil {
		return fmt.Errorf("reset descendants: cancel attempts: %w", err)
	}
	cancelled, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("reset descendants: cancel attempts: %w", err)
	}
	if err := notifyCancel(ctx, tx, cancelled); err != nil {
		return fmt.Errorf("reset descendants: cancel attempts: %w", err)
	}
	// Now the tasks (one cancelled meanwhile stays cancelled).
	rows, err = tx.Query(ctx, `SELECT id, workflow_id::text, state FROM tasks WHERE id = ANY($1) AND state <> 'cancelled'
		ORDER BY id FOR UPDATE`, down)
	if err != nil {
		return fmt.Errorf("reset descendants: %w", err)
	}
	type counts struct{ left, failed int32 }
	deltas := map[string]*counts{}
	var ids []int64
	for rows.Next() {
		var id int64
		var wf, state string
		if err := rows.Scan(&id, &wf, &state); err != nil {
			rows.Close()
			return fmt.Errorf("reset descendants: %w", err)
		}
		ids = append(ids, id)
		d := deltas[wf]
		if d == nil {
			d = &counts{}
			deltas[wf] = d
		}
		switch state {
		case StateDone:
			d.left++
		case StateFailed, StateUpstreamFailed:
			d.left++
			d.failed--
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reset descendants: %w", err)
	}
	if len(ids) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM task_outputs WHERE task_id = ANY($1)`, ids)
	b.Queue(`DELETE FROM attempt_outputs o USING attempts a WHERE a.id = o.attempt_id AND a.task_id = ANY($1)`, ids)
	b.Queue(`UPDATE attempts SET superseded = true WHERE task_id = ANY($1)`, ids)
	b.Queue(`UPDATE tasks SET state = 'blocked', pending = replicas, sort_key = NULL, attempts = 0,
			owner_id = (SELECT w.owner_id FROM workflows w WHERE w.id = tasks.workflow_id), checkpoint = NULL, checkpoint_blob = NULL, checkpoint_at = NULL, failed_by = NULL, avoid = NULL,
			result_hash = NULL, disputed = false, started_at = NULL, finished_at = NULL, updated_at = now(),
			error = 'reset: an upstream result was overturned by re-verification'
		WHERE id = ANY($1)`, ids)
	// Now that they are all blocked: count the upstream tasks each waits for.
	b.Queue(`UPDATE tasks t SET deps_left = (SELECT count(DISTINCT ti.from_task) FROM task_inputs ti JOIN tasks u ON u.id = ti.from_task
			WHERE ti.task_id = t.id AND u.state <> 'done')
		WHERE t.id = ANY($1)`, ids)
	if err := sendBatch(ctx, tx, b); err != nil {
		return fmt.Errorf("reset descendants: %w", err)
	}
	// Those that also wait for a task that will never be done cannot run.
	rows, err = tx.Query(ctx, `WITH RECURSIVE bad(id) AS (
			SELECT DISTINCT ti.task_id FROM task_inputs ti JOIN tasks u ON u.id = ti.from_task
			WHERE ti.task_id = ANY($1) AND u.state IN ('failed', 'upstream_failed', 'cancelled')
			UNION SELECT ti.task_id FROM task_inputs ti JOIN bad ON ti.from_task = bad.id WHERE ti.task_id = ANY($1))
		UPDATE tasks SET state = 'upstream_failed', pending = 0, finished_at = now(), error = 'an upstream task failed'
		WHERE id IN (SELECT id FROM bad) RETURNING workflow_id::text`, ids)
	if err != nil {
		return fmt.Errorf("reset descendants: fail dependents: %w", err)
	}
	failedWF, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("reset descendants: fail dependents: %w", err)
	}
	for _, wf := range failedWF {
		deltas[wf].left--
		deltas[wf].failed++
	}
	wfs := make([]string, 0, len(deltas))
	for wf := range deltas {
		wfs = append(wfs, wf)
	}
	slices.Sort(wfs)
	left := make([]int32, len(wfs))
	failed := make([]int32, len(wfs))
	for i, wf := range wfs {
		left[i], failed[i] = deltas[wf].left, deltas[wf].failed
	}
	if _, err := tx.Exec(ctx, `UPDATE workflows w SET tasks_left = w.tasks_left + d.l, tasks_failed = w.tasks_failed + d.f
		FROM unnest($1::uuid[], $2::int[], $3::int[]) AS d(id, l, f) WHERE w.id = d.id AND w.state = 'running'`,
		wfs, left, failed); err != nil {
		return fmt.Errorf("reset descendants: count workflows: %w", err)
	}
	return nil
}

// sendBatch runs a batch on a connection in a transaction.
func sendBatch(ctx context.Context, q querier, b *pgx.Batch) error {
	sb, ok := q.(interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	})
	if !ok {
		for _, qq := range b.QueuedQueries {
			if _, err := q.Exec(ctx, qq.SQL, qq.Arguments...); err != nil {
				return err
			}
		}
		return nil
	}
	return sb.SendBatch(ctx, b).Close()
}
