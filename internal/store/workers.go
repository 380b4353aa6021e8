package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cyclepool/cyclepool/internal/sched"
)

// WorkerHello is what a connecting worker says of itself.
type WorkerHello struct {
	ID        string // earlier identity, if any
	Token     string // its reconnect token
	Kind      string
	Slots     int
	Volunteer string
	Device    any // stored as JSON
	Replica   string
	Running   []int64 // attempts it still runs from an earlier connection
	// RunningComplete says Running lists every attempt this worker's
	// process was assigned and has not had acknowledged
	// (hello.running_complete): an earlier attempt it does not list never
	// reached it, and ends charged to nobody when its lease lapses.
	RunningComplete bool
	// Build is the worker's build (hello.build), cut to 100 bytes.
	Build string
	// Operator says the connection presented an operator key
	// (OperatorKeyValid): one of the operator's own machines, whose
	// failures are verdicts and which no task avoids.
	Operator bool
	// AllowNew, when set, is asked before a new identity is made (the
	// hello proved none): false refuses the registration with
	// ErrTooManyIdentities.
	AllowNew func() bool
}

// ErrTooManyIdentities refuses a worker a new identity: too many were made
// from its address lately (WorkerHello.AllowNew).
var ErrTooManyIdentities = errors.New("too many new worker identities from this address; connect again later, " +
	"or with the identity the server gave you")

// Registration is a connected worker's identity, as RegisterWorker
// recorded it.
type Registration struct {
	ID    string
	Token string  // its reconnect token
	Lost  []int64 // attempts it claimed to run that no longer hold their lease
	// Kept has each attempt it kept (those of Running not in Lost): its
	// module and its task's owner.
	Kept map[int64]KeptAttempt
	// Session identifies this connection; WorkerGone takes it so that the
	// end of an old connection does not end a newer one.
	Session int64
	// Record is the worker's record as registered (Workers).
	Record WorkerRecord
}

// KeptAttempt is an attempt a reconnected worker listed in its hello and
// kept (Registration.Kept).
type KeptAttempt struct {
	Module string
	Owner  int64 // the owner of its task, for the replica's fair share
}

// RegisterWorker records a connected worker. A worker that proves an
// earlier identity with its reconnect token keeps it, and keeps those of
// its running attempts that still hold their lease (renewed to now+lease,
// never past the attempt's deadline, which those of them that may be
// running get as from Renew); the others are returned as lost. A new worker gets a new id and token.
func (s *Store) RegisterWorker(ctx context.Context, h WorkerHello, lease time.Duration) (Registration, error) {
	regs, errs := s.RegisterWorkers(ctx, []WorkerHello{h}, lease)
	return regs[0], errs[0]
}

// RegisterWorkers is RegisterWorker for many workers at once, in one
// transaction of two round trips (more only when a batch names a worker
// twice), with one WAL flush, each registration with the worker's record: the hellos of a storm of reconnections (a
// replica's volunteers moving to the others) cost the database a
// transaction per batch rather than per worker. It returns each hello's
// registration or error, in the order of hs; an error of the transaction
// is every hello's.
func (s *Store) RegisterWorkers(ctx context.Context, hs []WorkerHello, lease time.Duration) ([]Registration, []error) {
	regs, errs := make([]Registration, len(hs)), make([]error, len(hs))
	s.RegisterWorkersEach(ctx, hs, lease, func(i int, r Registration, err error) { regs[i], errs[i] = r, err })
	return regs, errs
}

// RegisterWorkersEach is RegisterWorkers giving each hello's registration
// or error to answer (with its index in hs) as soon as its transaction
// committed: when a batch names a worker more than once, the hellos of
// its first transaction do not wait for the others'.
func (s *Store) RegisterWorkersEach(ctx context.Context, hs []WorkerHello, lease time.Duration, answer func(i int, r Registration, err error)) {
	regs, errs := make([]Registration, len(hs)), make([]error, len(hs))
	// A transaction registers each worker once: a second hello of the
	// same identity waits for the next round, as it would have waited for
	// the first one's transaction.
	left := make([]int, len(hs))
	for i := range left {
		left[i] = i
	}
	for len(left) > 0 {
		var round, later []int
		seen := map[string]bool{}
		for _, i := range left {
			if id := claimedID(&hs[i]); id != "" && seen[id] {
				later = append(later, i)
				continue
			} else if id != "" {
				seen[id] = true
			}
			round = append(round, i)
		}
		err := s.tx(ctx, func(tx pgx.Tx) error { return registerRound(ctx, tx, hs, round, regs, errs, lease, s.grace(lease)) })
		if err != nil && len(round) > 1 && dataError(err) {
			// A value the database refused (which registerRound's checks
			// missed) is one hello's fault: each registers alone, so that
			// it fails no other.
			for _, i := range round {
				one := []int{i}
				if err := s.tx(ctx, func(tx pgx.Tx) error { return registerRound(ctx, tx, hs, one, regs, errs, lease, s.grace(lease)) }); err != nil {
					regs[i], errs[i] = Registration{}, fmt.Errorf("register worker: %w", err)
				}
			}
			err = nil
		}
		for _, i := range round {
			if err != nil {
				regs[i], errs[i] = Registration{}, fmt.Errorf("register worker: %w", err)
			}
			answer(i, regs[i], errs[i])
		}
		left = later
	}
}

// dataError reports whether err is PostgreSQL's refusal of a value (SQL
// state classes 22, data exception, and 23, integrity constraint).
func dataError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23"))
}

// unstorable names the first of a hello's texts that PostgreSQL could not
// store (a NUL character, or bytes that are not UTF-8), "" if none.
func unstorable(h *WorkerHello, dev []byte) string {
	for _, f := range []struct{ name, v string }{{"kind", h.Kind}, {"volunteer", h.Volunteer}, {"build", h.Build}, {"replica", h.Replica}} {
		if strings.ContainsRune(f.v, 0) || !utf8.ValidString(f.v) {
			return f.name
		}
	}
	if bytes.Contains(dev, []byte(`\u0000`)) {
		return "device"
	}
	return ""
}

// The statements of registerRound, each for a batch of workers: one
// array element per worker. Each finds its rows with its keys as an array
// (= ANY): joined with an unnest instead, with statistics that said a
// few connections were open, PostgreSQL hashed the batch and read every
// open connection's history row for it (worker_sessions_open: 36,000
// rows, 17 ms for one hello).
const (
	// registerProvedSQL updates the rows of the workers whose tokens
	// prove them, and returns their ids. listed_until is the lease
	// renewHeldSQL gives the attempts a worker lists ($11 ms), when it
	// says ($10) the list is complete (migrations/00025).
	registerProvedSQL = `UPDATE workers w SET kind = u.kind, slots = u.slots, volunteer = u.volunteer, device = u.device,
		replica = u.replica, connected = true, connected_at = now(), last_seen = now(), operator = u.operator, build = u.build,
		listed_until = CASE WHEN u.complete THEN now() + $11 * interval '1 millisecond' END
	FROM unnest($1::uuid[], $2::bytea[], $3::text[], $4::int[], $5::text[], $6::jsonb[], $7::text[], $8::bool[], $9::text[], $10::bool[])
		AS u(id, token_hash, kind, slots, volunteer, device, replica, operator, build, complete)
	WHERE w.id = ANY($1::uuid[]) AND w.id = u.id AND w.token_hash = u.token_hash
	RETURNING w.id::text`
	// registerNewSQL writes new workers.
	registerNewSQL = `INSERT INTO workers (id, token_hash, kind, slots, volunteer, device, replica, operator, build)
	SELECT * FROM unnest($1::uuid[], $2::bytea[], $3::text[], $4::int[], $5::text[], $6::jsonb[], $7::text[], $8::bool[], $9::text[])`
	// registerSessionsSQL writes each connection's row in the history the
	// dashboard plots, and returns the rows' ids with their workers': a
	// connection the worker did not close is closed now, and rows older
	// than a day are pruned.
	registerSessionsSQL = `WITH ids AS (SELECT * FROM unnest($1::uuid[]) WITH ORDINALITY AS i(id, ord)),
	closed AS (UPDATE worker_sessions s SET disconnected_at = now() WHERE s.worker_id = ANY($1::uuid[]) AND s.disconnected_at IS NULL),
	pruned AS (DELETE FROM worker_sessions WHERE disconnected_at < now() - interval '1 day')
	INSERT INTO worker_sessions (worker_id) SELECT id FROM ids ORDER BY ord RETURNING id, worker_id::text`
)

// renewHeldSQL renews the leases of the attempts ($1) that their
// workers ($2) still hold, and returns them with their modules. As
// Renew, it gives those that may be running ($4) their deadline ($5
// ms of grace) and extends no lease past it.
var renewHeldSQL = `WITH u AS (
		SELECT *, false AS reported FROM unnest($1::bigint[], $2::uuid[], $4::bool[]) AS r(id, w, run)
	), held AS (` + heldWallSQL + `)
	UPDATE attempts a SET deadline = ` + deadlineSQL("u.run", "h.ms", "$5") + `,
		lease_until = least(now() + $3 * interval '1 millisecond', ` + deadlineSQL("u.run", "h.ms", "$5") + `)
	FROM u LEFT JOIN held h ON h.w = u.w, tasks t
	WHERE a.id = ANY($1::bigint[]) AND a.id = u.id AND a.worker_id = u.w AND a.state = 'running' AND t.id = a.task_id
	RETURNING a.id, a.worker_id::text, t.module_id, t.owner_id`

// claimedID is the identity a hello claims, "" for none worth looking up.
func claimedID(h *WorkerHello) string {
	if h.ID != "" && looksLikeUUID(h.ID) {
		return strings.ToLower(h.ID)
	}
	return ""
}

// workerRows holds workers' rows as registerProvedSQL and registerNewSQL
// take them: a column each, one array element per worker.
type workerRows struct {
	ids, kinds, volunteers, replicas, builds []string
	hashes, devices                          [][]byte
	slots                                    []int32
	operators                                []bool
}

// add appends the row of worker id (token hash hash) that h describes,
// with its device as JSON.
func (w *workerRows) add(id string, hash []byte, h *WorkerHello, device []byte) {
	w.ids, w.hashes, w.kinds, w.slots = append(w.ids, id), append(w.hashes, hash), append(w.kinds, h.Kind), append(w.slots, int32(h.Slots))
	w.volunteers, w.devices, w.replicas = append(w.volunteers, h.Volunteer), append(w.devices, device), append(w.replicas, h.Replica)
	w.operators, w.builds = append(w.operators, h.Operator), append(w.builds, h.Build)
}

// args returns the columns as the statements' parameters $1 to $9.
func (w *workerRows) args() []any {
	return []any{w.ids, w.hashes, w.kinds, w.slots, w.volunteers, w.devices, w.replicas, w.operators, w.builds}
}

// registerRound registers the hellos hs[round] (whose claimed identities
// are distinct) in tx, writing regs and errs at their indexes; the
// attempts they list get leases of lease, and deadlines with grace (Renew).
func registerRound(ctx context.Context, tx pgx.Tx, hs []WorkerHello, round []int, regs []Registration, errs []error, lease, grace time.Duration) error {
	devs := make([][]byte, len(hs))
	for _, i := range round {
		regs[i], errs[i] = Registration{}, nil
		dev, err := json.Marshal(hs[i].Device)
		if err != nil {
			errs[i] = fmt.Errorf("register worker: %w", err)
			continue
		}
		if f := unstorable(&hs[i], dev); f != "" {
			errs[i] = fmt.Errorf("register worker: its %s holds a NUL character or bytes that are not UTF-8", f)
			continue
		}
		devs[i] = dev
	}
	// Reconnections: the identities proved by their tokens.
	var old workerRows
	for _, i := range round {
		if h := &hs[i]; errs[i] == nil && claimedID(h) != "" {
			old.add(claimedID(h), HashToken(h.Token), h, devs[i])
		}
	}
	// With the hot path's settings (queueBegin): with generic plans for
	// arrays of unknown length, PostgreSQL otherwise joined a lone hello
	// with every worker and every connection's history row, 4 to 6 ms
	// each with 36,000 volunteers.
	proved := map[string]bool{}
	b := &pgx.Batch{}
	b.Queue(hotPathSettingsSQL)
	if len(old.ids) > 0 {
		complete := make([]bool, 0, len(old.ids))
		for _, i := range round {
			if h := &hs[i]; errs[i] == nil && claimedID(h) != "" {
				complete = append(complete, h.RunningComplete)
			}
		}
		b.Queue(registerProvedSQL, append(old.args(), complete, lease.Milliseconds())...)
	}
	br := tx.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil && len(old.ids) > 0 {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			var id string
			_, err = pgx.ForEachRow(rows, []any{&id}, func() error {
				proved[id] = true
				return nil
			})
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// New identities, for the others that may have one.
	var fresh workerRows
	for _, i := range round {
		h := &hs[i]
		if errs[i] != nil {
			continue
		}
		if id := claimedID(h); id != "" && proved[id] {
			regs[i].ID, regs[i].Token = id, h.Token
			continue
		}
		if h.AllowNew != nil && !h.AllowNew() {
			errs[i] = ErrTooManyIdentities
			continue
		}
		uid, err := uuid.NewRandom()
		if err != nil {
			return fmt.Errorf("worker id: %w", err)
		}
		regs[i].ID, regs[i].Token = uid.String(), NewToken("cw_")
		fresh.add(regs[i].ID, HashToken(regs[i].Token), h, devs[i])
	}
	// The rest in one round trip: the new workers' rows; each
	// connection's row in the history the dashboard plots (a connection
	// the worker did not close is closed now, and rows older than a day
	// are pruned); and the leases of the attempts the workers still run.
	var registered []string
	var runAttempts []int64
	var runWorkers []string
	var runMay []bool
	for _, i := range round {
		if errs[i] != nil {
			continue
		}
		registered = append(registered, regs[i].ID)
		rs := make([]Renewal, len(hs[i].Running))
		for k, a := range hs[i].Running {
			rs[k] = Renewal{Attempt: a, Worker: regs[i].ID, Slots: max(hs[i].Slots, 1)}
		}
		slices.SortFunc(rs, func(a, b Renewal) int { return cmp.Compare(a.Attempt, b.Attempt) })
		for k, run := range mayRun(rs) {
			runAttempts, runWorkers, runMay = append(runAttempts, rs[k].Attempt), append(runWorkers, regs[i].ID), append(runMay, run)
		}
	}
	if len(registered) == 0 {
		return nil
	}
	b = &pgx.Batch{}
	if len(fresh.ids) > 0 {
		b.Queue(registerNewSQL, fresh.args()...)
	}
	b.Queue(registerSessionsSQL, registered)
	b.Queue(workerRecordsSQL+` WHERE w.id = ANY($1::uuid[])`, registered)
	if len(runAttempts) > 0 {
		b.Queue(renewHeldSQL, runAttempts, runWorkers, lease.Milliseconds(), runMay, grace.Milliseconds())
	}
	br = tx.SendBatch(ctx, b)
	defer br.Close()
	if len(fresh.ids) > 0 {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	byID := make(map[string]int, len(registered))
	for _, i := range round {
		if errs[i] == nil {
			byID[regs[i].ID] = i
		}
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	var session int64
	var worker string
	if _, err := pgx.ForEachRow(rows, []any{&session, &worker}, func() error {
		regs[byID[worker]].Session = session
		return nil
	}); err != nil {
		return err
	}
	if rows, err = br.Query(); err != nil {
		return err
	}
	recs, err := scanWorkerRecords(rows)
	if err != nil {
		return err
	}
	for _, r := range recs {
		regs[byID[r.ID]].Record = r
	}
	if len(runAttempts) > 0 {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var a, owner int64
		var m string
		if _, err := pgx.ForEachRow(rows, []any{&a, &worker, &m, &owner}, func() error {
			r := &regs[byID[worker]]
			if r.Kept == nil {
				r.Kept = map[int64]KeptAttempt{}
			}
			r.Kept[a] = KeptAttempt{Module: m, Owner: owner}
			return nil
		}); err != nil {
			return err
		}
	}
	for _, i := range round {
		if errs[i] != nil || len(hs[i].Running) == 0 {
			continue
		}
		r := &regs[i]
		for _, a := range hs[i].Running {
			if _, ok := r.Kept[a]; !ok {
				r.Lost = append(r.Lost, a)
			}
		}
	}
	return br.Close()
}

// UpdateDevice records a worker's latest device state.
func (s *Store) UpdateDevice(ctx context.Context, id string, device any) error {
	dev, err := json.Marshal(device)
	if err != nil {
		return fmt.Errorf("update device of %s: %w", id, err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE workers SET device = $2, last_seen = now() WHERE id = $1`, id, dev); err != nil {
		return fmt.Errorf("update device of %s: %w", id, err)
	}
	return nil
}

// workerGoneLockSQL locks worker $1's row for workerGoneSQL: a hello of
// the worker that holds the row (RegisterWorkers) commits its new
// connection first.
const workerGoneLockSQL = `SELECT 1 FROM workers WHERE id = $1 FOR UPDATE`

// workerGoneSQL closes connection $2 of worker $1 and marks the worker
// disconnected unless another connection of it is open; it reports
// whether it did. It must run after workerGoneLockSQL, as a statement of
// its own: a statement sees the connections committed before it started,
// and after a wait for the worker's row PostgreSQL re-reads that row
// alone, not the connections a hello holding it opened meanwhile. When it
// did, the leases of the worker's attempts $3 that are still running end
// within $4 ms at the latest (never later than they would have).
const workerGoneSQL = `WITH ended AS (
	UPDATE worker_sessions SET disconnected_at = now() WHERE id = $2 AND disconnected_at IS NULL),
upd AS (UPDATE workers SET connected = false, last_seen = now() WHERE id = $1
	AND NOT EXISTS (SELECT 1 FROM worker_sessions WHERE worker_id = $1 AND disconnected_at IS NULL AND id <> $2)
	RETURNING id),
cut AS (UPDATE attempts a SET lease_until = least(a.lease_until, now() + $4 * interval '1 millisecond')
	WHERE a.id = ANY($3) AND a.worker_id = $1 AND a.state = 'running' AND EXISTS (SELECT 1 FROM upd))
SELECT EXISTS (SELECT 1 FROM upd)`

// Gone is a worker's connection that closed (WorkerGone).
type Gone struct {
	// Worker and Session name the worker and its connection (from
	// RegisterWorker).
	Worker  string
	Session int64
	// Unstarted are the attempts the worker held in its queue: they end
	// at once (EndUnstarted: charged to nobody).
	Unstarted []int64
	// MayHaveRun are the attempts it may have been running: their leases
	// end within Grace, for the worker to come back with their results
	// until then (Grace 0: they keep their leases).
	MayHaveRun []int64
	Grace      time.Duration
}

// WorkerGone records that a worker's connection closed. The worker stays
// connected if it has a newer connection already (it reconnected, to this
// replica or another, before the old socket was noticed gone), and then
// nothing else changes. Otherwise the attempts it held in its queue end at
// once, and the leases of those it may have been running end within
// g.Grace: a worker that reconnects in time renews them and still
// delivers. It returns how many queued attempts ended.
func (s *Store) WorkerGone(ctx context.Context, g Gone) (int, error) {
	// One round trip, one transaction: the lock, then the statement that
	// looks for the worker's other connections, with a snapshot taken
	// once the lock is held (READ COMMITTED). With the hot path's
	// settings: the attempts are found by key however few the planner
	// thinks there are.
	var gone bool
	b := &pgx.Batch{}
	queueBegin(b, false)
	b.Queue(workerGoneLockSQL, g.Worker)
	cut := g.MayHaveRun
	if g.Grace <= 0 {
		cut = nil // no grace: their leases stay as they are
	}
	b.Queue(workerGoneSQL, g.Worker, g.Session, cut, g.Grace.Milliseconds()).QueryRow(func(r pgx.Row) error { return r.Scan(&gone) })
	b.Queue("COMMIT")
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("disconnect worker %s: %w", g.Worker, err)
	}
	if !gone || len(g.Unstarted) == 0 {
		return 0, nil
	}
	n, err := s.EndUnstarted(ctx, g.Worker, g.Unstarted, "the worker left before it started the task; queued again")
	if err != nil {
		return 0, fmt.Errorf("return the queued attempts of worker %s: %w", g.Worker, err)
	}
	return n, nil
}

// EndUnstarted ends the running attempts of worker that never started
// (EndUnstarted: charged to nobody, their tasks queued again at their
// places), with message as their reason's, and returns how many it ended.
func (s *Store) EndUnstarted(ctx context.Context, worker string, attempts []int64, message string) (int, error) {
	ends := make([]Completion, len(attempts))
	for i, a := range attempts {
		ends[i] = Completion{Attempt: a, Worker: worker, Reason: "worker", End: EndUnstarted, Message: message}
	}
	acc, err := s.Complete(ctx, ends)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ok := range acc {
		if ok {
			n++
		}
	}
	return n, nil
}

// ForgetReplicaWorkers marks workers of replicas that stopped answering as
// disconnected: those connected to a replica that has not said it is alive
// (TouchReplica) for longer than after, and were not seen themselves since
// (a worker that has just connected to a replica yet to say so stays). They
// count as last seen when their replica was.
func (s *Store) ForgetReplicaWorkers(ctx context.Context, after time.Duration) error {
	if _, err := s.pool.Exec(ctx, `WITH gone AS (UPDATE workers w SET connected = false,
				last_seen = greatest(w.last_seen, (SELECT r.seen FROM replicas r WHERE r.name = w.replica))
			WHERE w.connected AND w.last_seen < now() - $1 * interval '1 millisecond'
				AND NOT EXISTS (SELECT 1 FROM replicas r WHERE r.name = w.replica AND r.seen >= now() - $1 * interval '1 millisecond')
			RETURNING w.id, w.last_seen)
		UPDATE worker_sessions ws SET disconnected_at = gone.last_seen FROM gone
		WHERE ws.worker_id = gone.id AND ws.disconnected_at IS NULL`, after.Milliseconds()); err != nil {
		return fmt.Errorf("forget stale workers: %w", err)
	}
	return nil
}

// PruneWorkers deletes the records of at most limit workers that have been
// disconnected for longer than after, with their connection history, and
// returns how many it deleted. Every browser page that opens is a new
// worker, so without this the table grows with every visit. Their attempts
// keep the worker ids (in their reasons and history); a pruned worker that
// comes back is a new worker, with a reputation built anew.
func (s *Store) PruneWorkers(ctx context.Context, after time.Duration, limit int) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `WITH gone AS (
			DELETE FROM workers WHERE id IN (SELECT id FROM workers
				WHERE NOT connected AND last_seen < now() - $1 * interval '1 millisecond' LIMIT $2)
			RETURNING id),
		sessions AS (DELETE FROM worker_sessions ws USING gone WHERE ws.worker_id = gone.id)
		SELECT count(*) FROM gone`, after.Milliseconds(), limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("prune workers: %w", err)
	}
	return n, nil
}

// PruneActivity deletes the counts of tasks done per minute (Activity)
// older than a day, the longest span Activity reads.
func (s *Store) PruneActivity(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM tasks_done_minutes WHERE minute < now() - interval '1 day'`); err != nil {
		return fmt.Errorf("prune activity: %w", err)
	}
	return nil
}

// ReconcileWorkers makes the record of which workers are connected to
// replica agree with the connections it holds (ids, and the session of
// each, from RegisterWorker). Those recorded as connected to it that it
// does not hold are marked disconnected: their end was not recorded
// (WorkerGone failed, or the replica restarted under its name). Workers
// that connected within the last minute are left alone: they may have
// arrived after the list was made. Those it holds that are recorded as
// disconnected, and still as connected to it last, are marked connected
// again, their connection's row reopened: ForgetReplicaWorkers took them
// for gone while the replica could not say it was alive (a database
// failover of over a minute).
func (s *Store) ReconcileWorkers(ctx context.Context, replica string, ids []string, sessions []int64) error {
	if len(ids) != len(sessions) {
		return fmt.Errorf("reconcile the workers of %s: %d ids for %d sessions", replica, len(ids), len(sessions))
	}
	b := &pgx.Batch{}
	b.Queue(`WITH gone AS (UPDATE workers SET connected = false, last_seen = now()
			WHERE replica = $1 AND connected AND connected_at < now() - interval '1 minute' AND NOT (id = ANY($2::uuid[]))
			RETURNING id)
		UPDATE worker_sessions ws SET disconnected_at = now() FROM gone
		WHERE ws.worker_id = gone.id AND ws.disconnected_at IS NULL`, replica, ids)
	b.Queue(`WITH back AS (UPDATE workers w SET connected = true, last_seen = now()
			FROM unnest($2::uuid[], $3::bigint[]) AS h(id, session)
			WHERE w.id = h.id AND w.replica = $1 AND NOT w.connected
			RETURNING h.id, h.session)
		UPDATE worker_sessions ws SET disconnected_at = NULL FROM back
		WHERE ws.id = back.session AND ws.worker_id = back.id`, replica, ids, sessions)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("reconcile the workers of %s: %w", replica, err)
	}
	return nil
}

// TouchReplica records that replica is alive, and with it every worker
// connected to it: one row for all of them (migration 00021).
func (s *Store) TouchReplica(ctx context.Context, replica string) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO replicas (name, seen) VALUES ($1, now())
		ON CONFLICT (name) DO UPDATE SET seen = now()`, replica); err != nil {
		return fmt.Errorf("touch replica %s: %w", replica, err)
	}
	return nil
}

// StartReplica records that replica's process started now (and is
// alive): the workers recorded as connected to it before now were
// connected to a process that died or stopped, and their attempts get
// time to come back (SweepLeases).
func (s *Store) StartReplica(ctx context.Context, replica string) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO replicas (name, seen, started) VALUES ($1, now(), now())
		ON CONFLICT (name) DO UPDATE SET seen = now(), started = now()`, replica); err != nil {
		return fmt.Errorf("record the start of replica %s: %w", replica, err)
	}
	return nil
}

// ReplicaGone records that every worker connected to replica disconnected
// (the replica is shutting down).
func (s *Store) ReplicaGone(ctx context.Context, replica string) error {
	if _, err := s.pool.Exec(ctx, `WITH gone AS (UPDATE workers SET connected = false, last_seen = now() WHERE replica = $1 AND connected RETURNING id)
		UPDATE worker_sessions ws SET disconnected_at = now() FROM gone
		WHERE ws.worker_id = gone.id AND ws.disconnected_at IS NULL`, replica); err != nil {
		return fmt.Errorf("disconnect workers of %s: %w", replica, err)
	}
	return nil
}

// WorkerRecord is what the database keeps of a worker.
type WorkerRecord struct {
	ID             string
	Kind           string
	Slots          int
	Volunteer      string
	Device         json.RawMessage
	Replica        string
	Connected      bool
	ConnectedAt    time.Time
	LastSeen       time.Time
	Attempts       int64
	TasksLost      int64
	ResultsValid   int64
	ResultsInvalid int64
	ValidStreak    int
	// Operator: the worker connected with an operator key.
	Operator bool
	// Build: the worker's build, as it said (hello.build).
	Build string
	// Succeeded counts its results accepted (as tallied: a few seconds
	// late); Strikes its strikes as of now (they fade: StrikeHalfLife).
	Succeeded int64
	Strikes   float64
}

// Standing is the worker's record as the dispatcher weighs it.
func (w WorkerRecord) Standing() sched.Standing {
	return sched.Standing{Results: w.Succeeded + w.ResultsValid, Strikes: w.Strikes}
}

// Reputation is the worker's record as sched sees it, its latest results
// counted over trust's TrustWindow.
func (w WorkerRecord) Reputation(trust sched.VerifyConfig) sched.Reputation {
	return reputation(w.ResultsValid, w.ResultsInvalid, w.ValidStreak, trust.TrustWindow)
}

// Workers reads the records of the given workers, or of every connected
// worker when ids is nil, ordered by id.
func (s *Store) Workers(ctx context.Context, ids []string) ([]WorkerRecord, error) {
	var rows pgx.Rows
	var err error
	if ids == nil {
		rows, err = s.pool.Query(ctx, workerRecordsSQL+` WHERE w.connected ORDER BY w.id`)
	} else {
		rows, err = s.pool.Query(ctx, workerRecordsSQL+` WHERE w.id = ANY($1::uuid[]) ORDER BY w.id`, ids)
	}
	if err != nil {
		return nil, fmt.Errorf("read workers: %w", err)
	}
	ws, err := scanWorkerRecords(rows)
	if err != nil {
		return nil, fmt.Errorf("read workers: %w", err)
	}
	return ws, nil
}

// workerRecordsSQL reads worker records (scanWorkerRecords), to be
// completed with a WHERE clause on workers w. A connected worker was seen
// when its replica last said it is alive.
var workerRecordsSQL = fmt.Sprintf(`SELECT w.id::text, w.kind, w.slots, w.volunteer, w.device, w.replica, w.connected, w.connected_at,
	CASE WHEN w.connected THEN greatest(w.last_seen, (SELECT rp.seen FROM replicas rp WHERE rp.name = w.replica)) ELSE w.last_seen END,
	w.attempts, w.tasks_lost, w.results_valid, w.results_invalid, w.valid_streak, w.operator, w.build, coalesce(r.succeeded, 0),
	w.strikes * power(0.5, extract(epoch FROM now() - coalesce(w.strikes_at, now())) / %d)
	FROM workers w LEFT JOIN worker_results r ON r.worker_id = w.id`, int(StrikeHalfLife.Seconds()))

func scanWorkerRecords(rows pgx.Rows) ([]WorkerRecord, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkerRecord, error) {
		var w WorkerRecord
		err := r.Scan(&w.ID, &w.Kind, &w.Slots, &w.Volunteer, &w.Device, &w.Replica, &w.Connected, &w.ConnectedAt, &w.LastSeen,
			&w.Attempts, &w.TasksLost, &w.ResultsValid, &w.ResultsInvalid, &w.ValidStreak, &w.Operator, &w.Build, &w.Succeeded, &w.Strikes)
		return w, err
	})
}

// AddOperatorKey makes key an operator key (idempotent): a worker that
// presents it is one of the operator's own machines (WorkerHello.Operator).
// Only its hash is kept.
func (s *Store) AddOperatorKey(ctx context.Context, key string) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO operator_keys (key_hash) VALUES ($1) ON CONFLICT DO NOTHING`, HashToken(key)); err != nil {
		return fmt.Errorf("add operator key: %w", err)
	}
	return nil
}

// OperatorKeyValid reports whether key is an operator key.
func (s *Store) OperatorKeyValid(ctx context.Context, key string) (bool, error) {
	var ok bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM operator_keys WHERE key_hash = $1)`, HashToken(key)).Scan(&ok); err != nil {
		return false, fmt.Errorf("check operator key: %w", err)
	}
	return ok, nil
}
