package bench

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// The river part runs River, the PostgreSQL job queue a Go user would pick
// instead, on the same PostgreSQL in the same minutes as the dispatch part,
// so that `dispatch_tasks_per_s` has its yardstick in the same output
// (issue 24). It is configured as the issue measured it: 500 workers, a
// 1 ms fetch cooldown, no-op jobs, --tasks of them per round. It links
// into cyclepool-bench only; bin/cyclepool carries none of it.

// riverNoop is the River job of the river part: its worker does nothing.
type riverNoop struct{}

// Kind names the job kind for River.
func (riverNoop) Kind() string { return "cyclepool_bench_noop" }

type riverNoopWorker struct {
	river.WorkerDefaults[riverNoop]
}

// Work does nothing: the figure measures the queue, not the job.
func (riverNoopWorker) Work(context.Context, *river.Job[riverNoop]) error { return nil }

// riverDB is the database of the river part, beside the server's in the
// same cluster (and so with its fsync and synchronous_commit).
const riverDB = "river_bench"

// river measures River's jobs per second two ways, --rounds times each:
// River's own (its benchmark's: the jobs inserted first, timed from the
// client's start to the last completion it reports, which follows the
// completion's commit), and as dispatch_tasks_per_s is measured (the
// client running, timed from the insertion to the last completion).
func (b *bench) river(ctx context.Context, url string) error {
	if _, err := b.db.Exec(ctx, "DROP DATABASE IF EXISTS "+riverDB); err != nil {
		return fmt.Errorf("drop River's database: %w", err)
	}
	if _, err := b.db.Exec(ctx, "CREATE DATABASE "+riverDB); err != nil {
		return fmt.Errorf("create River's database: %w", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.ConnConfig.Database = riverDB
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to River's database: %w", err)
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate River's tables: %w", err)
	}
	n := b.cfg.Tasks
	if _, err := b.riverRound(ctx, pool, min(n, 2000), false); err != nil { // warm-up
		return err
	}
	cpu0 := b.cpuNow()
	var own, total []time.Duration
	var wall time.Duration
	for range b.cfg.Rounds {
		d, err := b.riverRound(ctx, pool, n, false)
		if err != nil {
			return err
		}
		own = append(own, d)
		d2, err := b.riverRound(ctx, pool, n, true)
		if err != nil {
			return err
		}
		total = append(total, d2)
		wall += d + d2
	}
	cpu := b.cpuNow().sub(cpu0)
	rates := func(ds []time.Duration) string {
		s := make([]string, len(ds))
		for i, d := range ds {
			s[i] = fmt.Sprintf("%.0f", float64(n)/d.Seconds())
		}
		return strings.Join(s, ",")
	}
	b.printf("river_jobs_per_s: %.0f", float64(n)/medianDuration(own).Seconds())
	b.printf("river_jobs_per_s_rounds: %s", rates(own))
	b.printf("river_insert_to_done_jobs_per_s: %.0f", float64(n)/medianDuration(total).Seconds())
	b.printf("river_insert_to_done_jobs_per_s_rounds: %s", rates(total))
	jobs := 2 * n * b.cfg.Rounds
	b.printf("river_cpu_us_per_job: %.1f", float64(cpu.total().Microseconds())/float64(jobs))
	b.printf("river_cpu_us_per_job_postgres: %.1f", float64(cpu.postgres.Microseconds())/float64(jobs))
	b.printf("river_cpu_us_per_job_river: %.1f", float64(cpu.bench.Microseconds())/float64(jobs))
	if b.dispatchRate > 0 {
		b.printf("dispatch_vs_river: %.2f", b.dispatchRate/(float64(n)/medianDuration(own).Seconds()))
	}
	return nil
}

// riverRound works n no-op jobs with a new River client and returns the
// time measured: from the client's start (inserted first) or from the
// insertion (started first, when running) to the last completion.
func (b *bench) riverRound(ctx context.Context, pool *pgxpool.Pool, n int, running bool) (time.Duration, error) {
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return 0, fmt.Errorf("empty River's jobs: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverNoopWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 500}},
		Workers:           workers,
	})
	if err != nil {
		return 0, fmt.Errorf("River's client: %w", err)
	}
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: n + 1000,
		Kinds: []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled}})
	defer unsubscribe()
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i].Args = riverNoop{}
	}
	insert := func() error {
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("insert River's jobs: %w", err)
		}
		return nil
	}
	var start time.Time
	if running {
		if err := client.Start(ctx); err != nil {
			return 0, err
		}
		start = time.Now()
		if err := insert(); err != nil {
			return 0, err
		}
	} else {
		if err := insert(); err != nil {
			return 0, err
		}
		start = time.Now()
		if err := client.Start(ctx); err != nil {
			return 0, err
		}
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = client.Stop(stopCtx)
	}()
	limit := time.After(5 * time.Minute)
	for done := 0; done < n; {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				return 0, fmt.Errorf("a River job ended %s", ev.Kind)
			}
			done++
		case <-limit:
			return 0, fmt.Errorf("River worked %d of %d jobs in 5 minutes", done, n)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return time.Since(start), nil
}

// medianDuration is the middle of ds, or the slower of the two middle ones
// for an even count (as the dispatch part's median round).
func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
