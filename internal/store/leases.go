package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Renewal is one running attempt reported in a heartbeat.
type Renewal struct {
	Attempt  int64
	Worker   string
	Progress float64
	// Slots is the worker's slots (hello.slots): of the attempts a batch
	// renews for the worker, only its Slots lowest ids may be running (a
	// worker starts its attempts in the order they were assigned), and
	// only those get a deadline (see Renew). 0: every one may be running.
	Slots int
	// Reported says the attempt's outcome arrived: being committed, or
	// sent back to the worker with retry after its commit failed. The
	// attempt no longer runs, its deadline no longer bounds its lease
	// (ending it is the server's part now), and it takes no slot in the
	// ranking above.
	Reported bool
}

// DefaultWallGrace is how long past its task's wall time the server lets
// a worker hold an attempt, with leases of lease, unless WithWallGrace
// says otherwise: six leases and five minutes. An honest worker stops
// the task at its wall time and reports limit_wall_time at once; the
// grace covers that report's way to a commit when the server is at
// fault: the worker's replica dies and the worker comes back to another
// one (the lease reaper waits four leases for that, Sweep.ReplicaGrace),
// then its outcome is committed behind the backlog of everyone else's
// (a gap's renewal gives two leases for that, Sweep.Lease). The five
// minutes cover the time a worker takes to fetch the module before the
// task's clock starts: one of the largest (64 MiB) at
// DataAllowanceBytesPerSecond takes 256 s. The task's data have an
// allowance of their own, by their size (the claim adds it to the wall
// time the attempt carries; docs/RATIONALE.md).
func DefaultWallGrace(lease time.Duration) time.Duration { return 5*time.Minute + 6*lease }

// WithWallGrace sets how long past its task's wall time the server lets a
// worker hold an attempt (default DefaultWallGrace of the lease each
// renewal gives).
func WithWallGrace(d time.Duration) Option {
	return func(s *Store) { s.wallGrace = d }
}

// grace is the store's wall grace for renewals of lease.
func (s *Store) grace(lease time.Duration) time.Duration {
	if s.wallGrace > 0 {
		return s.wallGrace
	}
	return DefaultWallGrace(lease)
}

// mayRun says, for each renewal of rs (sorted by attempt id), whether its
// attempt may be running: one of the Slots lowest ids among the attempts
// rs renews for its worker that are not Reported. A worker that lists the
// same attempt twice (two heartbeats in one batch) does not push the
// others down.
func mayRun(rs []Renewal) []bool {
	type rank struct {
		n    int
		last int64
	}
	run := make([]bool, len(rs))
	by := map[string]*rank{}
	for i, r := range rs {
		if r.Reported {
			continue
		}
		k := by[r.Worker]
		if k == nil {
			k = &rank{last: -1}
			by[r.Worker] = k
		}
		if r.Attempt != k.last {
			k.n, k.last = k.n+1, r.Attempt
		}
		run[i] = r.Slots <= 0 || k.n <= r.Slots
	}
	return run
}

// deadlineSQL is the deadline of an attempt (alias a) that may be running
// when run (an SQL boolean) says so: the one it has, or else now plus ms
// (an SQL expression: the wall time it is allowed, see heldWallSQL) and
// the grace (grace, an SQL expression in ms). NULL for one that waits in
// its worker's queue, or was claimed before the attempts knew their wall
// time (migrations/00028).
func deadlineSQL(run, ms, grace string) string {
	return fmt.Sprintf(`coalesce(a.deadline, CASE WHEN %s THEN now() + (%s + %s) * interval '1 millisecond' END)`, run, ms, grace)
}

// heldWallSQL sums, by worker (w), the wall times (attempts.timeout_ms:
// the task's, with its data's download and its outputs' upload) of the
// attempts a renewal lists for it that are still running and whose
// outcome the server does not hold, from the renewal's rows u (id, w,
// reported). An attempt's deadline allows that sum, not its own wall time
// alone: an honest worker need not run its attempts in the order of their
// ids (a browser page runs one whose module it has compiled before an
// earlier one whose module it still compiles, and reports the attempts of
// a batch together, when the last ends), so one may wait for the others
// to run, each within its own wall time. A worker holds at most its slots
// and queue, so the bound stays one.
const heldWallSQL = `SELECT u.w, sum(x.timeout_ms) AS ms FROM u JOIN attempts x ON x.id = u.id AND x.worker_id = u.w
	WHERE x.state = 'running' AND NOT u.reported GROUP BY u.w`

// renewSQL renews the leases of Renew's batch ($1 attempts, $2 workers,
// $3 progress, $6 whether each may be running, $7 whether the server
// holds its outcome) to now + $4 ms, giving those that may be running
// their deadline ($5 ms of grace). least ignores a NULL deadline.
var renewSQL = `WITH u AS (
	SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::real[], $6::bool[], $7::bool[]) AS u(id, w, p, run, reported)
), held AS (` + heldWallSQL + `)
UPDATE attempts a SET deadline = ` + deadlineSQL("u.run", "h.ms", "$5") + `,
	lease_until = greatest(a.lease_until, CASE WHEN u.reported THEN now() + $4 * interval '1 millisecond'
		ELSE least(now() + $4 * interval '1 millisecond', ` + deadlineSQL("u.run", "h.ms", "$5") + `) END),
	progress = u.p
	FROM u LEFT JOIN held h ON h.w = u.w
	WHERE a.id = u.id AND a.worker_id = u.w AND a.state = 'running' RETURNING a.id`

// Renew extends the leases of a batch of attempts to now+lease and records
// their progress. A lease is never shortened: a late renewal from an old
// connection must not undo a newer one (see unreachedSQL). Nor is it
// extended past the attempt's deadline: the first renewal at which the
// attempt may be running (Renewal.Slots) sets that to now plus its task's
// wall time and the grace (WithWallGrace), so that a worker that renews
// an attempt and never ends it loses it when the lease lapses (the lease
// reaper ends it as vanished, charged to the worker). It returns the
// attempts of the batch that are no longer running on the worker that
// reported them: the worker must stop those.
func (s *Store) Renew(ctx context.Context, rs []Renewal, lease time.Duration) (lost []int64, err error) {
	if len(rs) == 0 {
		return nil, nil
	}
	slices.SortFunc(rs, func(a, b Renewal) int { return int(a.Attempt - b.Attempt) })
	ids := make([]int64, len(rs))
	workers := make([]string, len(rs))
	progress := make([]float32, len(rs))
	reported := make([]bool, len(rs))
	for i, r := range rs {
		ids[i], workers[i], progress[i], reported[i] = r.Attempt, r.Worker, float32(r.Progress), r.Reported
	}
	run := mayRun(rs)
	// A renewal need not survive a crash (the lease would lapse a little
	// sooner), so it commits without waiting for the WAL flush.
	var held []int64
	err = s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, renewSQL, ids, uuidParams(workers), progress, lease.Milliseconds(), s.grace(lease).Milliseconds(), run, reported)
		if err != nil {
			return err
		}
		held, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(rs), err)
	}
	slices.Sort(held)
	for _, id := range ids {
		if _, ok := slices.BinarySearch(held, id); !ok {
			lost = append(lost, id)
		}
	}
	return lost, nil
}

// SaveCheckpoint stores state as the latest checkpoint of the task of
// attempt, if the attempt still runs on worker, and renews its lease (never
// shortening it, nor extending it past its deadline, as Renew; a
// checkpoint says the attempt runs, and sets its deadline if it had none). It
// returns false when the attempt no longer holds its lease. A checkpoint
// larger than the task's memory limit (its state is what the task held in
// memory) is refused with a *RefusedError that says so, and not stored.
func (s *Store) SaveCheckpoint(ctx context.Context, attempt int64, worker string, state []byte, lease time.Duration) (bool, error) {
	return s.saveCheckpoint(ctx, attempt, worker, state, "", lease)
}

// SaveCheckpointBlob is SaveCheckpoint for a state the worker uploaded
// over HTTP first (BeginOutputUpload with the empty name): blob must be
// what that upload stored.
func (s *Store) SaveCheckpointBlob(ctx context.Context, attempt int64, worker, blob string, lease time.Duration) (bool, error) {
	return s.saveCheckpoint(ctx, attempt, worker, nil, blob, lease)
}

func (s *Store) saveCheckpoint(ctx context.Context, attempt int64, worker string, state []byte, blob string, lease time.Duration) (bool, error) {
	var saved, unknown bool
	var limit int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		saved, unknown, limit = false, false, 0
		var task int64
		var old string
		// Never shortened, as by Renew: a late checkpoint of an old
		// connection must not undo the lease a hello gave (unreachedSQL).
		// Nor extended past the attempt's deadline, which a checkpoint
		// sets when the attempt has none yet: it runs.
		err := tx.QueryRow(ctx, `UPDATE attempts a SET deadline = `+deadlineSQL("true", "a.timeout_ms", "$4")+`,
			lease_until = greatest(a.lease_until, least(now() + $3 * interval '1 millisecond', `+deadlineSQL("true", "a.timeout_ms", "$4")+`)) FROM tasks t
			WHERE a.id = $1 AND a.worker_id = $2 AND a.state = 'running' AND t.id = a.task_id
			RETURNING a.task_id, t.memory_pages::bigint * 65536, coalesce(t.checkpoint_blob, '')`,
			attempt, worker, lease.Milliseconds(), s.grace(lease).Milliseconds()).Scan(&task, &limit, &old)
		if err == pgx.ErrNoRows {
			return nil
		}
		if err != nil {
			return err
		}
		if int64(len(state)) > limit {
			return nil // refused below; the lease renewal commits
		}
		var blobArg any
		if blob != "" {
			var ok bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM output_uploads WHERE attempt_id = $1 AND name = '' AND blob_id = $2)`,
				attempt, blob).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				unknown = true
				return nil
			}
			blobArg, state = blob, nil
		}
		if _, err = tx.Exec(ctx, `UPDATE tasks SET checkpoint = $2, checkpoint_blob = $3, checkpoint_seq = checkpoint_seq + 1,
			checkpoint_at = now(), updated_at = now() WHERE id = $1`, task, state, blobArg); err != nil {
			return err
		}
		saved = true
		if old != "" && old != blob {
			return dropUnusedBlobs(ctx, tx, []string{old}) // the checkpoint this one replaces
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("save checkpoint of attempt %d: %w", attempt, err)
	}
	if unknown {
		return false, &RefusedError{Why: fmt.Sprintf("the checkpoint names data %s that attempt %d did not upload as its checkpoint", blob, attempt)}
	}
	if !saved && limit > 0 && int64(len(state)) > limit {
		return false, &RefusedError{Why: fmt.Sprintf("a checkpoint of %d bytes is larger than the task's memory limit of %d bytes", len(state), limit)}
	}
	return saved, nil
}

// RefusedError is what a worker sent that breaks its task's rules, refused
// for good: sending it again cannot help.
type RefusedError struct{ Why string }

func (e *RefusedError) Error() string { return "refused: " + e.Why }

// ExpireLeases ends running attempts whose lease has lapsed as lost (the
// worker vanished: EndVanished) and queues their tasks again (from their
// latest checkpoint, at their place in the queue), or fails them after
// their last allowed loss. It handles at most limit attempts per call and
// returns how many it ended.
func (s *Store) ExpireLeases(ctx context.Context, limit int) (int, error) {
	r, err := s.SweepLeases(ctx, Sweep{Limit: limit})
	return r.Expired, err
}

// Sweep configures one pass of the lease reaper (SweepLeases).
type Sweep struct {
	// Limit bounds the attempts one pass ends.
	Limit int
	// Gap, when not 0, is how long after the previous pass (of any
	// replica) a pass may come before the leases are no longer trusted:
	// such a pass gives every running attempt a lease of Lease from now
	// instead of expiring any. A gap means that no replica could sweep
	// (the database could not be written, every replica was down, the
	// leader changed), and leases lapsed meanwhile say nothing of the
	// workers, who may have heartbeated all along into a server that
	// could not record it (docs/RATIONALE.md).
	Gap, Lease time.Duration
	// ReplicaSilence and ReplicaGrace, when not 0: the attempts of a
	// worker whose replica has not said it is alive (TouchReplica) for
	// longer than ReplicaSilence (it died), or that has started again
	// since the worker connected to it (StartReplica: it died and came
	// back under its name), are not ended until their lease lapsed
	// ReplicaGrace ago. Its workers come back to other replicas,
	// and the hello that lists their attempts renews the leases; with a
	// crowd arriving at once that may take longer than a lease, and the
	// replica's death is no fault of theirs.
	ReplicaSilence, ReplicaGrace time.Duration
}

// SweepResult says what a pass of the lease reaper did.
type SweepResult struct {
	Expired int   // attempts ended as lost
	Renewed int64 // attempts given a fresh lease after a gap
	// Since is the time since the previous pass; zero when there was none.
	Since time.Duration
}

// SweepLeases is one pass of the lease reaper: ExpireLeases, or after a
// gap (Sweep.Gap) a renewal of every running attempt's lease.
func (s *Store) SweepLeases(ctx context.Context, sw Sweep) (SweepResult, error) {
	var res SweepResult
	err := s.tx(ctx, func(tx pgx.Tx) error {
		res = SweepResult{}
		if _, err := tx.Exec(ctx, hotPathSettingsSQL); err != nil {
			return err
		}
		var sinceMS *float64
		if err := tx.QueryRow(ctx, `WITH prev AS (SELECT at FROM lease_sweeps WHERE id = 1 FOR UPDATE),
				upd AS (INSERT INTO lease_sweeps (id, at) VALUES (1, now()) ON CONFLICT (id) DO UPDATE SET at = now())
			SELECT extract(epoch FROM now() - at) * 1000 FROM prev`).Scan(&sinceMS); err != nil && err != pgx.ErrNoRows {
			return err
		}
		if sinceMS != nil {
			res.Since = time.Duration(*sinceMS * float64(time.Millisecond))
		}
		if sw.Gap > 0 && res.Since > sw.Gap {
			tag, err := tx.Exec(ctx, renewAllSQL, sw.Lease.Milliseconds(), res.Since.Milliseconds())
			res.Renewed = tag.RowsAffected()
			return err
		}
		// running_attempts lists the attempts that may still run; those
		// that ended (or are gone) are deleted from it here, in the same
		// pass.
		if _, err := tx.Exec(ctx, sweepEndedSQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, expireSQL, sw.Limit, sw.ReplicaSilence.Milliseconds(), sw.ReplicaGrace.Milliseconds())
		if err != nil {
			return err
		}
		var ends []attemptEnd
		lostBy := map[string]int{}
		for rows.Next() {
			var e attemptEnd
			var w string
			var mayHaveRun bool
			if err := rows.Scan(&e.task, &e.reason, &w, &mayHaveRun, &e.progressed); err != nil {
				rows.Close()
				return err
			}
			e.end, e.worker = EndUnstarted, w
			if mayHaveRun {
				e.end = EndVanished
				lostBy[w]++
			}
			ends = append(ends, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		res.Expired = len(ends)
		if len(ends) == 0 {
			return nil
		}
		if len(lostBy) == 0 {
			return s.settleEnds(ctx, tx, ends)
		}
		if err := chargeWorkers(ctx, tx, EndVanished, lostBy); err != nil {
			return err
		}
		return s.settleEnds(ctx, tx, ends)
	})
	if err != nil {
		return SweepResult{}, fmt.Errorf("expire leases: %w", err)
	}
	return res, nil
}

// renewAllSQL renews the lease of every running attempt by $1 ms at least,
// and moves its deadline (if it has one) $2 ms on, the time since the
// previous sweep: the gap, during which an honest worker's outcome may
// have been held back (the server could not commit it, and the worker
// sends it again until it can), is the server's, and the attempt keeps
// the time it had left before it (docs/RATIONALE.md). The attempts are looked up by the ids running_attempts lists (an array,
// so that PostgreSQL cannot merge the two tables' keys and read every
// attempt ever kept, as sweepEndedSQL explains).
const renewAllSQL = `UPDATE attempts a SET lease_until = greatest(a.lease_until, now() + $1 * interval '1 millisecond'),
		deadline = a.deadline + $2 * interval '1 millisecond'
	WHERE a.id = ANY (ARRAY(SELECT attempt_id FROM running_attempts)) AND a.state = 'running'`

// sweepEndedSQL deletes from running_attempts the attempts that ended or
// are gone. Each is looked up by its id (a scalar subquery, which
// PostgreSQL never turns into a join): as NOT EXISTS, with statistics
// taken while running_attempts was large, PostgreSQL merged the two
// tables' keys and read attempts_pkey from the first attempt ever kept,
// 74 ms a sweep after the 62,000-task dispatch benchmark, in proportion
// to the whole history rather than to the attempts that may run.
const sweepEndedSQL = `DELETE FROM running_attempts r
	WHERE (SELECT a.state FROM attempts a WHERE a.id = r.attempt_id) IS DISTINCT FROM 'running'`

// unreachedSQL is true of an attempt (alias a) of worker (alias w) that never
// reached it: assigned before the worker's latest hello, which said it
// listed every attempt it held (workers.listed_until, migrations/00025),
// and not renewed by that hello or since. Renew never shortens a lease,
// so a listed attempt keeps at least the lease the hello gave it. An
// attempt with a deadline reached its worker, whatever its lease: a
// renewal of the worker's (a heartbeat, a checkpoint, a hello) listed it
// as one that may be running. Without that test, a worker could let an
// attempt's lease run to its deadline, then reconnect without it to have
// it end charged to nobody, and take its task again.
func unreachedSQL(a string) string {
	return fmt.Sprintf(`coalesce(w.listed_until IS NOT NULL AND %[1]s.deadline IS NULL AND %[1]s.started_at < w.connected_at
		AND %[1]s.lease_until < w.listed_until, false)`, a)
}

// expireSQL ends up to $1 running attempts whose lease lapsed, and returns
// each one's task, reason, worker, and whether it may have run. An
// attempt that never reached its worker (unreachedSQL) did not run
// (EndUnstarted). Otherwise a worker runs at most its slots attempts at
// once, the oldest it holds (attempt ids grow in the order of assignment,
// and a worker starts its queued attempts in that order): its attempts
// beyond its slots oldest ones waited in its queue and never started
// (EndUnstarted), the others may have run (EndVanished). The attempts it
// held are those still running and those that an earlier pass ended as it
// fell silent (lapsed_attempts, which keeps them for a day: those ended
// since the worker connected and after the attempt judged was assigned),
// not counting those that never reached it: an attempt keeps the rank it
// had when the worker went silent, however the passes split its attempts
// (leases that lapse a moment apart, a pass limit). A worker whose record
// is gone may have run any of them. Any worker may have run an attempt
// with a deadline: a renewal of its own listed it as one that may be
// running (Renew), whatever the attempts it left out of its list, which
// would otherwise push it down the ranks to end charged to nobody. The
// last column says whether the attempt saved a checkpoint.
// The attempts of a worker whose replica has been silent for $2 ms, or
// has started again since the worker connected to it, wait until their
// lease lapsed $3 ms ago (Sweep.ReplicaGrace).
var expireSQL = `WITH exp AS (
	SELECT x.id, x.worker_id, x.started_at, x.lease_until, x.deadline FROM running_attempts r JOIN attempts x ON x.id = r.attempt_id
	WHERE x.state = 'running' AND x.lease_until < now()
		AND NOT ($3::bigint > 0 AND x.lease_until > now() - $3::bigint * interval '1 millisecond' AND EXISTS (
			SELECT 1 FROM workers w JOIN replicas rp ON rp.name = w.replica
			WHERE w.id = x.worker_id AND (rp.seen < now() - $2::bigint * interval '1 millisecond' OR w.connected_at < rp.started)))
	ORDER BY x.id LIMIT $1 FOR UPDATE OF x SKIP LOCKED
), held AS (
	SELECT a.id, row_number() OVER (PARTITION BY a.worker_id ORDER BY a.id) AS k
	FROM running_attempts r JOIN attempts a ON a.id = r.attempt_id LEFT JOIN workers w ON w.id = a.worker_id
	WHERE a.state = 'running' AND a.worker_id IN (SELECT DISTINCT worker_id FROM exp) AND NOT ` + unreachedSQL("a") + `
), judged AS (
	SELECT exp.id, exp.worker_id, u.unreached, NOT u.unreached AND (exp.deadline IS NOT NULL OR coalesce(held.k + (SELECT count(*)
			FROM lapsed_attempts l WHERE l.worker_id = exp.worker_id AND l.attempt_id < exp.id
				AND l.ended_at >= greatest(exp.started_at, w.connected_at)) <= w.slots,
		true)) AS may_have_run
	FROM exp LEFT JOIN held ON held.id = exp.id LEFT JOIN workers w ON w.id = exp.worker_id
		CROSS JOIN LATERAL (SELECT ` + unreachedSQL("exp") + ` AS unreached) u
), kept AS (
	INSERT INTO lapsed_attempts (worker_id, attempt_id, ended_at) SELECT worker_id, id, now() FROM judged WHERE NOT unreached
), pruned AS (
	DELETE FROM lapsed_attempts WHERE ended_at < now() - interval '1 day'
)
UPDATE attempts a SET state = 'lost', ended_at = now(),
	reason = CASE WHEN j.unreached
		THEN 'worker ' || left(a.worker_id::text, 8) || ' reconnected without it: the assignment never reached it; queued again'
		WHEN j.may_have_run
		THEN 'lost: worker ' || left(a.worker_id::text, 8) || ' vanished while running it (no heartbeat before its lease expired); '
			|| 'retried, not counted as a failed attempt'
		ELSE 'worker ' || left(a.worker_id::text, 8) || ' vanished before it started the task; queued again' END
FROM judged j WHERE a.id = j.id
RETURNING a.task_id, a.reason, a.worker_id::text, j.may_have_run,
	-- The attempt saved a checkpoint: it moved its task on before it was lost.
	(SELECT t.checkpoint_seq > a.restored_seq FROM tasks t WHERE t.id = a.task_id)`

// TryLead makes holder the leader called name until now+ttl if nobody else
// holds an unexpired lead, or extends holder's own lead. It reports whether
// holder leads.
func (s *Store) TryLead(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	var got string
	err := s.pool.QueryRow(ctx, `INSERT INTO leaders (name, holder, expires_at) VALUES ($1, $2, now() + $3 * interval '1 millisecond')
		ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
		WHERE leaders.holder = EXCLUDED.holder OR leaders.expires_at < now()
		RETURNING holder`, name, holder, ttl.Milliseconds()).Scan(&got)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("elect %s leader: %w", name, err)
	}
	return got == holder, nil
}

// Resign gives up holder's lead, so that another replica takes over at once.
func (s *Store) Resign(ctx context.Context, name, holder string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM leaders WHERE name = $1 AND holder = $2`, name, holder)
	if err != nil {
		return fmt.Errorf("resign %s lead: %w", name, err)
	}
	return nil
}
