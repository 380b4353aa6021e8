package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
	// Modules has the module of each attempt it kept (those of Running
	// not in Lost).
	Modules map[int64]string
	// Session identifies this connection; WorkerGone takes it so that the
	// end of an old connection does not end a newer one.
	Session int64
}

// RegisterWorker records a connected worker. A worker that proves an
// earlier identity with its reconnect token keeps it, and keeps those of
// its running attempts that still hold their lease (renewed to now+lease);
// the others are returned as lost. A new worker gets a new id and token.
func (s *Store) RegisterWorker(ctx context.Context, h WorkerHello, lease time.Duration) (Registration, error) {
	dev, err := json.Marshal(h.Device)
	if err != nil {
		return Registration{}, fmt.Errorf("register worker: %w", err)
	}
	var id, token string
	var lost []int64
	var modules map[int64]string
	var session int64
	err = s.tx(ctx, func(tx pgx.Tx) error {
		id, token, lost, modules = "", "", nil, nil
		if h.ID != "" && looksLikeUUID(h.ID) {
			tag, err := tx.Exec(ctx, `UPDATE workers SET kind = $3, slots = $4, volunteer = $5, device = $6, replica = $7,
				connected = true, connected_at = now(), last_seen = now(), operator = $8, build = $9 WHERE id = $1 AND token_hash = $2`,
				h.ID, HashToken(h.Token), h.Kind, h.Slots, h.Volunteer, dev, h.Replica, h.Operator, h.Build)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 1 {
				id, token = h.ID, h.Token
			}
		}
		if id == "" {
			if h.AllowNew != nil && !h.AllowNew() {
				return ErrTooManyIdentities
			}
			token = NewToken("cw_")
			if err := tx.QueryRow(ctx, `INSERT INTO workers (id, token_hash, kind, slots, volunteer, device, replica, operator, build)
				VALUES (gen_random_uuid(), $1, $2, $3, $4, $5, $6, $7, $8) RETURNING id::text`,
				HashToken(token), h.Kind, h.Slots, h.Volunteer, dev, h.Replica, h.Operator, h.Build).Scan(&id); err != nil {
				return err
			}
		}
		// The connection's row in the history the dashboard plots; a
		// connection the worker did not close is closed now, and rows older
		// than a day are pruned.
		if err := tx.QueryRow(ctx, `WITH closed AS (
				UPDATE worker_sessions SET disconnected_at = now() WHERE worker_id = $1 AND disconnected_at IS NULL),
			pruned AS (DELETE FROM worker_sessions WHERE disconnected_at < now() - interval '1 day')
			INSERT INTO worker_sessions (worker_id) VALUES ($1) RETURNING id`, id).Scan(&session); err != nil {
			return err
		}
		if len(h.Running) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, `UPDATE attempts a SET lease_until = now() + $3 * interval '1 millisecond'
			FROM tasks t WHERE a.id = ANY($1) AND a.worker_id = $2 AND a.state = 'running' AND t.id = a.task_id
			RETURNING a.id, t.module_id`, h.Running, id, lease.Milliseconds())
		if err != nil {
			return err
		}
		modules = map[int64]string{}
		var a int64
		var m string
		if _, err := pgx.ForEachRow(rows, []any{&a, &m}, func() error {
			modules[a] = m
			return nil
		}); err != nil {
			return err
		}
		for _, a := range h.Running {
			if _, ok := modules[a]; !ok {
				lost = append(lost, a)
			}
		}
		return nil
	})
	if err != nil {
		return Registration{}, fmt.Errorf("register worker: %w", err)
	}
	return Registration{ID: id, Token: token, Lost: lost, Modules: modules, Session: session}, nil
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

// WorkerGone records that a worker's connection (session, from
// RegisterWorker) closed. The worker stays connected if it has a newer
// connection already (it reconnected, to this replica or another, before
// the old socket was noticed gone). Its running attempts keep their leases
// until they lapse, so that a worker that reconnects in time can still
// deliver; the attempts of unstarted, which it held in its queue, end at
// once unless it is still connected (EndUnstarted: charged to nobody). It
// returns how many of those ended.
func (s *Store) WorkerGone(ctx context.Context, id string, session int64, unstarted []int64) (int, error) {
	var gone bool
	if err := s.pool.QueryRow(ctx, `WITH ended AS (
			UPDATE worker_sessions SET disconnected_at = now() WHERE id = $2 AND disconnected_at IS NULL),
		upd AS (UPDATE workers SET connected = false, last_seen = now() WHERE id = $1
			AND NOT EXISTS (SELECT 1 FROM worker_sessions WHERE worker_id = $1 AND disconnected_at IS NULL AND id <> $2)
			RETURNING id)
		SELECT EXISTS (SELECT 1 FROM upd)`, id, session).Scan(&gone); err != nil {
		return 0, fmt.Errorf("disconnect worker %s: %w", id, err)
	}
	if !gone || len(unstarted) == 0 {
		return 0, nil
	}
	ends := make([]Completion, len(unstarted))
	for i, a := range unstarted {
		ends[i] = Completion{Attempt: a, Worker: id, Reason: "worker", End: EndUnstarted,
			Message: "the worker left before it started the task; queued again"}
	}
	acc, err := s.Complete(ctx, ends)
	if err != nil {
		return 0, fmt.Errorf("return the queued attempts of worker %s: %w", id, err)
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

// ForgetGhosts marks disconnected the workers that the database says are
// connected to replica but that it does not hold (connected, the ids it
// holds): their end was not recorded (WorkerGone failed, or the replica
// restarted under its name). Workers that connected within the last
// minute are left alone: they may have arrived after the list was made.
func (s *Store) ForgetGhosts(ctx context.Context, replica string, connected []string) error {
	if _, err := s.pool.Exec(ctx, `WITH gone AS (UPDATE workers SET connected = false, last_seen = now()
			WHERE replica = $1 AND connected AND connected_at < now() - interval '1 minute' AND NOT (id = ANY($2::uuid[]))
			RETURNING id)
		UPDATE worker_sessions ws SET disconnected_at = now() FROM gone
		WHERE ws.worker_id = gone.id AND ws.disconnected_at IS NULL`, replica, connected); err != nil {
		return fmt.Errorf("forget the ghost workers of %s: %w", replica, err)
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
	// A connected worker was seen when its replica last said it is alive.
	cols := fmt.Sprintf(`SELECT w.id::text, w.kind, w.slots, w.volunteer, w.device, w.replica, w.connected, w.connected_at,
		CASE WHEN w.connected THEN greatest(w.last_seen, (SELECT rp.seen FROM replicas rp WHERE rp.name = w.replica)) ELSE w.last_seen END,
		w.attempts, w.tasks_lost, w.results_valid, w.results_invalid, w.valid_streak, w.operator, w.build, coalesce(r.succeeded, 0),
		w.strikes * power(0.5, extract(epoch FROM now() - coalesce(w.strikes_at, now())) / %d)
		FROM workers w LEFT JOIN worker_results r ON r.worker_id = w.id`, int(StrikeHalfLife.Seconds()))
	if ids == nil {
		rows, err = s.pool.Query(ctx, cols+` WHERE w.connected ORDER BY w.id`)
	} else {
		rows, err = s.pool.Query(ctx, cols+` WHERE w.id = ANY($1::uuid[]) ORDER BY w.id`, ids)
	}
	if err != nil {
		return nil, fmt.Errorf("read workers: %w", err)
	}
	ws, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkerRecord, error) {
		var w WorkerRecord
		err := r.Scan(&w.ID, &w.Kind, &w.Slots, &w.Volunteer, &w.Device, &w.Replica, &w.Connected, &w.ConnectedAt, &w.LastSeen,
			&w.Attempts, &w.TasksLost, &w.ResultsValid, &w.ResultsInvalid, &w.ValidStreak, &w.Operator, &w.Build, &w.Succeeded, &w.Strikes)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("read workers: %w", err)
	}
	return ws, nil
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
