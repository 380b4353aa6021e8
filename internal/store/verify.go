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
}

// verifyConfig is a task's sched.VerifyConfig.
func (t verifyTask) verifyConfig() sched.VerifyConfig {
	d := sched.DefaultVerify()
	return sched.VerifyConfig{Replicas: t.replicas, Quorum: t.quorum, MaxReplicas: t.maxReplicas,
		TrustAfter: d.TrustAfter, TrustWindow: d.TrustWindow}
}

// decideReplicas applies sched.Decide to a replicated task's results. A
// task already done judges late results against its accepted hash; a task
// in another final state ignores them.
func decideReplicas(t verifyTask, as []replicaAttempt, reps map[string]sched.Reputation) verifyOutcome {
	out := verifyOutcome{verdicts: map[int64]string{}}
	cfg := t.verifyConfig()
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
	trusted := len(results) == 1 && reps[results[0].Worker].Trusted(cfg)
	v := sched.Decide(results, outstanding, cfg, trusted)
	switch v.State {
	case sched.Accepted:
		out.accept = v.Hash
		out.solo = len(results) == 1 && cfg.Quorum > 1
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
// streak of valid results stands for the recent ones.
func reputation(valid, invalid int64, streak int) sched.Reputation {
	r := sched.Reputation{Valid: int(valid), Invalid: int(invalid)}
	n := min(streak, sched.DefaultVerify().TrustWindow)
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
// agreed or lost gain or lose reputation. It runs in Complete's
// transaction, and only for replicated tasks.
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
		FROM attempts a LEFT JOIN workers w ON w.id = a.worker_id WHERE a.task_id = ANY($1) ORDER BY a.id`, tids)
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
			reps[a.worker] = reputation(*valid, *invalid, *streak)
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
	type delta struct{ valid, invalid int32 }
	deltas := map[string]*delta{}
	for _, t := range tasks {
		o := decideReplicas(t, byTask[t.id], reps)
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
		case o.fail != "":
			finished = append(finished, t.id)
			ends = append(ends, attemptEnd{task: t.id, reason: o.fail, permanent: true})
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
				valid_streak = CASE WHEN d.i > 0 THEN 0 ELSE w.valid_streak + d.v END
			FROM unnest($1::uuid[], $2::int[], $3::int[]) AS d(id, v, i) WHERE w.id = d.id`, ws, dv, di)
	}
	if len(accT) > 0 {
		b.Queue(`UPDATE tasks t SET result_hash = u.h, pending = 0, state = 'running'
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
		// The other replicas of an accepted task are no longer needed. An
		// attempt another transaction is completing right now is skipped:
		// its result then arrives for a done task and is judged late.
		rows, err := tx.Query(ctx, `UPDATE attempts SET state = 'cancelled', ended_at = now(), reason = 'a quorum of other replicas agreed'
			WHERE id IN (SELECT id FROM attempts WHERE task_id = ANY($1) AND state = 'running' ORDER BY id FOR UPDATE SKIP LOCKED)
			RETURNING id`, accT)
		if err != nil {
			return nil, nil, fmt.Errorf("cancel extra replicas: %w", err)
		}
		cancelled, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, nil, fmt.Errorf("cancel extra replicas: %w", err)
		}
		if err := notifyCancel(ctx, tx, cancelled); err != nil {
			return nil, nil, err
		}
	}
	return done, ends, nil
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
