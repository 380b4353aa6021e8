// Package store keeps all of cyclepool's SQL: the schema is in migrations/,
// every query the server runs is here. It speaks to PostgreSQL through pgx.
//
// PostgreSQL is the one source of truth; the store's write paths are built to
// be batched (claims, lease renewals and completions each take one statement
// per batch, not one per task) and fenced by attempt id, so that a worker's
// word is accepted only for an attempt it still holds.
package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/cyclepool/cyclepool/migrations"
)

// Channel names used with LISTEN/NOTIFY.
const (
	// ChannelReady is notified when tasks become ready.
	ChannelReady = "cyclepool_ready"
	// ChannelCancel is notified with a comma-separated list of attempt ids
	// that must be stopped on their workers.
	ChannelCancel = "cyclepool_cancel"
	// ChannelFinished is notified with a workflow's id when it reaches a
	// final state (by a trigger: migrations/00006_workflow_finished.sql).
	ChannelFinished = "cyclepool_finished"
)

// Store is a handle on the database.
type Store struct {
	pool *pgxpool.Pool
	// InteractiveHeadStart is how far ahead of batch work an interactive
	// task is queued; a batch task that waited longer overtakes it.
	interactiveHeadStart time.Duration
	// runs collects the run times of committed successes until
	// FlushRuntimeStats writes them.
	runs runBuffer
	// epochMu guards epoch, the start time of the PostgreSQL server this
	// store's connections last saw (guardAttemptIDs).
	epochMu sync.Mutex
	epoch   time.Time
}

// Open connects to the database at url, applies pending migrations and
// returns a Store.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store: parse database url: %w", err)
	}
	if cfg.MaxConns < 16 {
		cfg.MaxConns = 16
	}
	// No JIT compilation (unless the URL asks for it): the store's
	// statements touch tens of rows, but a plan's estimated cost can pass
	// jit_above_cost (Candidates' per-row subquery does as the tasks table
	// grows), and compiling then costs tens of milliseconds of CPU per
	// execution for nothing.
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	s := &Store{interactiveHeadStart: 5 * time.Minute}
	cfg.AfterConnect = s.guardAttemptIDs
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	s.pool = pool
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// attemptIDGap is how far the attempt id sequence jumps when the store
// meets a PostgreSQL server it has not seen start (guardAttemptIDs): far
// more attempts than can be claimed in the time an asynchronous commit may
// wait for its WAL flush (wal_writer_delay, 200 ms by default, three times
// over at most).
const attemptIDGap = 1_000_000

// guardAttemptIDs runs on every new connection. Claims commit
// asynchronously (ClaimPicks): a crash of PostgreSQL can lose the last
// claims, and with them the sequence's advance, after their attempts were
// sent to workers. A worker still running such a lost attempt must never
// find its id given to a new attempt, or its result would be taken for the
// new one's. So when the server's start time is not the one this store saw
// last (it restarted, or this is the store's first connection), the
// sequence jumps by attemptIDGap before the connection is used, in a
// transaction with an id of its own so that its commit is flushed: every
// id handed out before the crash stays below every id handed out after.
func (s *Store) guardAttemptIDs(ctx context.Context, c *pgx.Conn) error {
	var started time.Time
	var seq bool
	if err := c.QueryRow(ctx, `SELECT pg_postmaster_start_time(), to_regclass('attempts_id_seq') IS NOT NULL`).Scan(&started, &seq); err != nil {
		return fmt.Errorf("store: read the database server's start time: %w", err)
	}
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	if started.Equal(s.epoch) {
		return nil
	}
	if seq { // else the migrations have yet to create it: nothing was claimed
		if _, err := c.Exec(ctx, `SELECT setval('attempts_id_seq', last_value + $1), pg_current_xact_id() FROM attempts_id_seq`, attemptIDGap); err != nil {
			return fmt.Errorf("store: move attempt ids past those of a restarted database: %w", err)
		}
	}
	s.epoch = started
	return nil
}

// migrate applies the embedded migrations under a session lock, so that
// replicas starting together apply them once.
func (s *Store) migrate(ctx context.Context) error {
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("store: migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("store: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("store: apply migrations: %w", err)
	}
	return nil
}

// Close closes the connection pool.
func (s *Store) Close() { s.pool.Close() }

// Pool exposes the pool for the one thing that needs a connection of its
// own: the server's LISTEN loop (server/maintain.go). Every query belongs
// in this package, as a method of Store.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// tx runs fn in a transaction and retries it when PostgreSQL reports a
// deadlock or a serialization failure, which batched writes from several
// replicas can provoke.
func (s *Store) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := pgx.BeginFunc(ctx, s.pool, fn)
		if err != nil && attempt < 5 && retryable(err) {
			continue
		}
		return err
	}
}

// queueBegin queues the start of a transaction of the hot path pipelined
// in one round trip (the claim and the one-round-trip completion), whose
// statements find their rows by key: with sequential scans off. The planner's
// statistics of tasks and attempts lag behind tables that grow by
// thousands of rows a second (autovacuum analyzes them a minute later, at
// best), and with statistics that say a table is tiny it scans the table
// instead of probing its primary key: 390 blocks read per completion in
// the single-task benchmark, 45 without. And with generic plans: these
// statements are planned once per connection, not at every call (planning
// the claim took about 100 µs, more than running it for one task), and with
// sequential scans off a generic plan probes the same indexes as a custom
// one (the dispatch benchmark reads as many blocks per task either way).
// Run execBegin on the results.
func queueBegin(b *pgx.Batch) {
	b.Queue("BEGIN")
	b.Queue("SET LOCAL enable_seqscan = off")
	b.Queue("SET LOCAL plan_cache_mode = force_generic_plan")
}

// execBegin reads the results of what queueBegin queued.
func execBegin(br pgx.BatchResults) error {
	for range 3 {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

// ErrNotFound is returned when a workflow, task or output does not exist or
// belongs to another owner.
var ErrNotFound = errors.New("not found")

// InteractiveHeadStart is how far ahead of batch work an interactive task
// is queued (the sort_key of a ready interactive task is its ready time
// minus this).
func (s *Store) InteractiveHeadStart() time.Duration { return s.interactiveHeadStart }
