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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/cyclepool/cyclepool/internal/sched"
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
	bulk *pgxpool.Pool // moves blob chunks (bulkConns)
	// chunkBufs holds the buffers of the chunks being written, bulkConns
	// of them (nil until first used): an upload takes one for each chunk
	// it hands to a writer (BlobUpload.flush), so that at most bulkConns
	// are in flight and their memory is bounded whatever the uploads.
	chunkBufs chan []byte
	// InteractiveHeadStart is how far ahead of batch work an interactive
	// task is queued; a batch task that waited longer overtakes it.
	interactiveHeadStart time.Duration
	// backendGrace is how long a backend whose COMMIT's answer was lost
	// may go on before it is terminated (awaitBackend).
	backendGrace time.Duration
	// runs collects the run times of committed successes until
	// FlushRuntimeStats writes them.
	runs    runBuffer
	tallies tallies
	// stats refreshes the planner's statistics after large submissions.
	stats *statsRefresher
	// trust is when a worker's record is long and clean enough that its
	// results need no replica (TrustAfter, TrustWindow: WithTrust).
	trust sched.VerifyConfig
	// wallGrace is how long past its task's wall time a worker may hold
	// an attempt (WithWallGrace; 0: DefaultWallGrace).
	wallGrace time.Duration
	// tracer, when set, traces the statements of the pool's connections
	// (the tests' withTracer).
	tracer pgx.QueryTracer
	// attemptIDs are the attempt ids drawn for claims whose attempts go
	// out before the claim runs (CreateWorkflowClaiming).
	attemptIDs idBlock
}

// Option configures a Store (Open).
type Option func(*Store)

// WithTrust sets when a worker is trusted alone (cfg's TrustAfter and
// TrustWindow; default sched.DefaultVerify's): the server's policy, which
// the store applies when it judges replicas.
func WithTrust(cfg sched.VerifyConfig) Option {
	return func(s *Store) { s.trust = cfg }
}

// withTracer traces the statements of the store's pool with t (tests:
// which statements run, and in what transaction).
func withTracer(t pgx.QueryTracer) Option {
	return func(s *Store) { s.tracer = t }
}

// Open connects to the database at url, applies pending migrations and
// returns a Store.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
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
	s := &Store{interactiveHeadStart: 5 * time.Minute, backendGrace: backendGrace, trust: sched.DefaultVerify(), chunkBufs: make(chan []byte, bulkConns)}
	for range bulkConns {
		s.chunkBufs <- nil
	}
	for _, o := range opts {
		o(s)
	}
	cfg.AfterConnect = s.guardAttemptIDs
	if s.tracer != nil {
		cfg.ConnConfig.Tracer = s.tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	s.pool = pool
	// Chunks of data blobs move on connections of their own: a flood of
	// transfers cannot take the connections the dispatcher needs, and the
	// megabyte buffers pgx keeps on a connection that moved chunks stay on
	// few connections, which close when idle.
	bcfg := cfg.Copy()
	bcfg.MaxConns, bcfg.MinConns, bcfg.MaxConnIdleTime, bcfg.AfterConnect = bulkConns, 0, 30*time.Second, nil
	bcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off" // (BlobUpload.writeChunk)
	if s.bulk, err = pgxpool.NewWithConfig(ctx, bcfg); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	s.stats = newStatsRefresher(statsRefreshGap, func(ctx context.Context, sql string) error {
		_, err := pool.Exec(ctx, sql)
		return err
	})
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		s.bulk.Close()
		return nil, err
	}
	return s, nil
}

// attemptIDGap is how far the attempt id sequence jumps after a crash of
// PostgreSQL (guardAttemptIDs): far more attempts than can be claimed in
// the time an asynchronous commit may wait for its WAL flush
// (wal_writer_delay, 200 ms by default, three times over at most), or in
// the replication lag of a standby promoted after a failover.
const attemptIDGap = 1_000_000

// guardAttemptIDs runs on every new connection. Claims commit
// asynchronously (ClaimPicks): a crash of PostgreSQL, of the whole server
// or of one of its processes (which makes the server run crash recovery
// without a restart), can lose the last claims, and with them the
// sequence's advance, after their attempts were sent to workers. A worker
// still running such a lost attempt must never find its id given to a new
// attempt, or its result would be taken for the new one's. Crash recovery
// empties the unlogged table attempt_id_guard (migration 00008): when its
// row is missing, the sequence jumps by attemptIDGap and the row is written
// back, in one transaction whose commit is flushed (the insert gives it a
// transaction id), before the connection is used. Connections that find the row
// missing together wait for the first one's insert and do not jump again.
//
// The row is read first: a database that cannot write (read-only, or its
// disk full) still serves reads on new connections, which the API needs.
func (s *Store) guardAttemptIDs(ctx context.Context, c *pgx.Conn) error {
	var guarded bool
	err := c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM attempt_id_guard)`).Scan(&guarded)
	if err == nil && guarded {
		return nil
	}
	_, err = c.Exec(ctx, `WITH g AS (INSERT INTO attempt_id_guard VALUES (1) ON CONFLICT DO NOTHING RETURNING 1)
		SELECT setval('attempts_id_seq', last_value + $1) FROM attempts_id_seq, g`, attemptIDGap)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return nil // the migrations have yet to create it: nothing was claimed
	}
	if err != nil {
		return fmt.Errorf("store: move attempt ids past those a crash may have lost: %w", err)
	}
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

// Close stops a statistics refresh under way and closes the connection
// pool.
func (s *Store) Close() {
	s.stats.stop()
	s.pool.Close()
	s.bulk.Close()
}

// bulkConns bounds the connections that move the chunks of data blobs,
// and the chunks written at once (Store.chunkBufs).
const bulkConns = 4

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// tx runs fn in a transaction and retries it when PostgreSQL reports a
// deadlock or a serialization failure, which batched writes from several
// replicas can provoke.
func (s *Store) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	return txOn(ctx, s.pool, fn)
}

// txOn is tx on pool.
func txOn(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := pgx.BeginFunc(ctx, pool, fn)
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
// With asyncCommit, the commit does not wait for its WAL flush (the claim:
// see ClaimPicks). The settings take one statement, not one each: every
// statement of the pipeline costs its parse, bind and execution. Run
// execBegin on the results.
func queueBegin(b *pgx.Batch, asyncCommit bool) {
	b.Queue("BEGIN")
	if asyncCommit {
		b.Queue(hotPathSettingsSQL + `, set_config('synchronous_commit', 'off', true)`)
	} else {
		b.Queue(hotPathSettingsSQL)
	}
}

// hotPathSettingsSQL sets queueBegin's settings for the rest of the
// transaction (the lease reaper's too: it settles lost attempts with the
// completion's statements).
const hotPathSettingsSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)`

// execBegin reads the results of what queueBegin queued.
func execBegin(br pgx.BatchResults) error {
	for range 2 {
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

// uuidParams returns worker ids as parameters of a uuid[], which pgx sends
// in binary; an id that is not a UUID becomes NULL, which matches no row.
// Passed as strings, every such parameter first failed pgx's binary
// encoding, with an error message formatting the whole array, before the
// text one: 4% of the server's CPU in the dispatch benchmark. The ids of a
// batch come in runs of one worker's, so a run is parsed once.
func uuidParams(ids []string) uuidArray {
	out := make(uuidArray, len(ids))
	for i, id := range ids {
		if i > 0 && id == ids[i-1] {
			out[i] = out[i-1]
			continue
		}
		if err := out[i].Scan(id); err != nil {
			out[i] = pgtype.UUID{}
		}
	}
	return out
}

// uuidArray is a uuid[] parameter. pgx encodes a []pgtype.UUID through
// reflection, which boxes every element in an allocation of its own; this
// hands pgx pointers to its elements instead (pgtype.ArrayGetter).
type uuidArray []pgtype.UUID

// Dimensions implements pgtype.ArrayGetter: one dimension (none for nil).
func (a uuidArray) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter.
func (a uuidArray) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a uuidArray) IndexType() any { return &pgtype.UUID{} }
