package store

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Run is one successful attempt's run time, for the averages per module and
// task name (longest first, checkpoint optimum).
type Run struct {
	Module   string
	Name     string
	Duration time.Duration
}

// runBuffer gathers runs from Complete so that the averages are written in
// batches, off the completion path.
type runBuffer struct {
	mu   sync.Mutex
	runs []Run
}

// maxBufferedRuns bounds the buffer; runs beyond it are dropped (the
// averages are estimates).
const maxBufferedRuns = 100000

func (b *runBuffer) add(rs []Run) {
	if len(rs) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.runs)+len(rs) <= maxBufferedRuns {
		b.runs = append(b.runs, rs...)
	}
}

func (b *runBuffer) take() []Run {
	b.mu.Lock()
	defer b.mu.Unlock()
	rs := b.runs
	b.runs = nil
	return rs
}

// RuntimeStat is the average run time of one task name of a module.
type RuntimeStat struct {
	Module string
	Name   string
	Runs   int64
	Mean   time.Duration
}

// aggregateRuns folds runs into one average per (module, name), sorted.
func aggregateRuns(rs []Run) []RuntimeStat {
	type key struct{ m, n string }
	acc := map[key]*RuntimeStat{}
	for _, r := range rs {
		k := key{r.Module, r.Name}
		a := acc[k]
		if a == nil {
			a = &RuntimeStat{Module: r.Module, Name: r.Name}
			acc[k] = a
		}
		a.Runs++
		a.Mean += (r.Duration - a.Mean) / time.Duration(a.Runs)
	}
	out := make([]RuntimeStat, 0, len(acc))
	for _, a := range acc {
		out = append(out, *a)
	}
	slices.SortFunc(out, func(a, b RuntimeStat) int {
		if c := strings.Compare(a.Module, b.Module); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// moduleRuns folds runs into one average per module, sorted by module.
func moduleRuns(rs []Run) []RuntimeStat {
	type acc struct {
		runs int64
		sum  float64
	}
	by := map[string]*acc{}
	for _, r := range rs {
		a := by[r.Module]
		if a == nil {
			a = &acc{}
			by[r.Module] = a
		}
		a.runs++
		a.sum += float64(r.Duration)
	}
	out := make([]RuntimeStat, 0, len(by))
	for m, a := range by {
		out = append(out, RuntimeStat{Module: m, Runs: a.runs, Mean: time.Duration(a.sum / float64(a.runs))})
	}
	slices.SortFunc(out, func(a, b RuntimeStat) int { return strings.Compare(a.Module, b.Module) })
	return out
}

// A task name keeps an average of its own (a runtime_stats row) only when it
// differs from its module's average by more than nameSpread of it and by
// more than nameMinDiff, or when it has one already; other names are
// expected to take their module's average. The scheduler orders tasks of
// unknown name by that average too (sched.RuntimeStats.Expected), and the
// order of tasks that differ by less hardly changes when a workflow ends,
// nor does a checkpoint interval.
const (
	nameSpread  = 0.25
	nameMinDiff = 50 * time.Millisecond
)

// FlushRuntimeStats folds the run times of the successes committed since
// the last flush into the averages: every module's (runtime_modules), and
// the names' own (runtime_stats) where they differ from their module's (see
// nameSpread) or have one already. It returns how many runs it folded in.
//
// It takes two statements in one transaction. The first updates the
// modules' averages and returns the names of each that have averages of
// their own (up to one more than the runs flushed: a module with more is
// said to have "many"); the second sends only the names that may keep
// one: those that differ from their module's new average, those that have
// one, and every name of a module that has many (PostgreSQL then keeps
// those that have a row). A workflow of 20,000 uniform tasks thus sends
// hardly a name, where sending them all and probing runtime_stats for
// each took about 50 ms of the server's and PostgreSQL's CPU per flush,
// 3 µs a task (docs/RATIONALE.md, run-time averages).
func (s *Store) FlushRuntimeStats(ctx context.Context) (int, error) {
	rs := s.runs.take()
	if len(rs) == 0 {
		return 0, nil
	}
	mods := moduleRuns(rs)
	mm := make([]string, len(mods))
	mruns := make([]int64, len(mods))
	mmeans := make([]float64, len(mods))
	for i, st := range mods {
		mm[i], mruns[i], mmeans[i] = st.Module, st.Runs, ms(st.Mean)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The modules' new averages, and the names of each that have
		// averages of their own.
		type module struct {
			mean  float64
			named map[string]bool
			many  bool // more names have one than runs are flushed
		}
		byModule := make(map[string]*module, len(mods))
		most := len(rs) + 1
		rows, err := tx.Query(ctx, `WITH m AS (
				INSERT INTO runtime_modules AS r (module_id, runs, mean_ms)
				SELECT * FROM unnest($1::text[], $2::bigint[], $3::float8[])
				ON CONFLICT (module_id) DO UPDATE SET runs = r.runs + EXCLUDED.runs,
					mean_ms = (r.mean_ms * r.runs + EXCLUDED.mean_ms * EXCLUDED.runs) / (r.runs + EXCLUDED.runs)
				RETURNING module_id, mean_ms
			)
			SELECT m.module_id, m.mean_ms, ARRAY(SELECT e.name FROM runtime_stats e WHERE e.module_id = m.module_id ORDER BY e.name LIMIT $4) FROM m`,
			mm, mruns, mmeans, most)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var names []string
			m := &module{}
			if err := rows.Scan(&id, &m.mean, &names); err != nil {
				rows.Close()
				return err
			}
			m.many = len(names) >= most
			m.named = make(map[string]bool, len(names))
			for _, n := range names {
				m.named[n] = true
			}
			byModule[id] = m
		}
		if err := rows.Err(); err != nil {
			return err
		}
		// The names that may keep an average: those that have one, every
		// name of a module that has many, and the names with a run that
		// differs (the average of runs that all lie within the band does
		// too).
		keeps := func(m *module, name string, mean float64) bool {
			return m == nil || m.many || m.named[name] || nameDiffers(mean, m.mean)
		}
		type key struct{ m, n string }
		maybe := map[key]bool{}
		for _, r := range rs {
			if keeps(byModule[r.Module], r.Name, ms(r.Duration)) {
				maybe[key{r.Module, r.Name}] = true
			}
		}
		if len(maybe) == 0 {
			return nil
		}
		var theirs []Run
		for _, r := range rs {
			if maybe[key{r.Module, r.Name}] {
				theirs = append(theirs, r)
			}
		}
		var ns, names []string
		var runs []int64
		var means []float64
		for _, st := range aggregateRuns(theirs) {
			if keeps(byModule[st.Module], st.Name, ms(st.Mean)) {
				ns, names = append(ns, st.Module), append(names, st.Name)
				runs, means = append(runs, st.Runs), append(means, ms(st.Mean))
			}
		}
		if len(names) == 0 {
			return nil
		}
		// A name sent because its module has many keeps an average only
		// when it has one already, or differs.
		_, err = tx.Exec(ctx, `INSERT INTO runtime_stats AS r (module_id, name, runs, mean_ms)
			SELECT n.module_id, n.name, n.runs, n.mean_ms
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[]) AS n(module_id, name, runs, mean_ms)
			JOIN runtime_modules m ON m.module_id = n.module_id
			WHERE abs(n.mean_ms - m.mean_ms) > greatest($5 * m.mean_ms, $6)
				OR EXISTS (SELECT 1 FROM runtime_stats e WHERE e.module_id = n.module_id AND e.name = n.name)
			ORDER BY n.module_id, n.name
			ON CONFLICT (module_id, name) DO UPDATE SET runs = r.runs + EXCLUDED.runs,
				mean_ms = (r.mean_ms * r.runs + EXCLUDED.mean_ms * EXCLUDED.runs) / (r.runs + EXCLUDED.runs)`,
			ns, names, runs, means, nameSpread, ms(nameMinDiff))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("update run time averages: %w", err)
	}
	return len(rs), nil
}

// ms is d in milliseconds, as the averages are kept.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// nameDiffers reports whether a name's average (ms) differs from its
// module's by enough to keep an average of its own (nameSpread).
func nameDiffers(name, module float64) bool {
	return math.Abs(name-module) > max(nameSpread*module, ms(nameMinDiff))
}

// RuntimeStats reads the run time averages of the given modules: each
// module's over all its runs, with Name "" (task names are never empty),
// and the task names that have one of their own.
func (s *Store) RuntimeStats(ctx context.Context, modules []string) ([]RuntimeStat, error) {
	rows, err := s.pool.Query(ctx, `SELECT module_id, '', runs, mean_ms FROM runtime_modules WHERE module_id = ANY($1)
		UNION ALL SELECT module_id, name, runs, mean_ms FROM runtime_stats WHERE module_id = ANY($1)`, modules)
	if err != nil {
		return nil, fmt.Errorf("read run time averages: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RuntimeStat, error) {
		var st RuntimeStat
		var mean float64
		err := r.Scan(&st.Module, &st.Name, &st.Runs, &mean)
		st.Mean = time.Duration(mean * float64(time.Millisecond))
		return st, err
	})
	if err != nil {
		return nil, fmt.Errorf("read run time averages: %w", err)
	}
	return out, nil
}

// AttemptSpan is when one attempt of a workflow ran, and where.
type AttemptSpan struct {
	Task      string
	Worker    string
	Start     time.Time
	End       time.Time // now for running attempts
	Succeeded bool
}

// workflowSpansSQL reads the attempts of workflow $1 (to be completed with
// an ORDER BY). Each task's attempts are looked up through attempts_task
// (the OFFSET 0 keeps PostgreSQL from flattening the lookup into a join):
// as a plain join, with the statistics of an attempts table analyzed while
// small, PostgreSQL hashed the workflow's tasks and read every attempt of
// every workflow, up to 0.6 ms for a one-task workflow among 3,000
// attempts, and in proportion to all attempts ever kept.
const workflowSpansSQL = `SELECT t.name, a.worker_id::text, a.started_at, coalesce(a.ended_at, now()), a.state = 'succeeded'
	FROM tasks t CROSS JOIN LATERAL (SELECT a.id, a.worker_id, a.started_at, a.ended_at, a.state FROM attempts a
		WHERE a.task_id = t.id OFFSET 0) a
	WHERE t.workflow_id = $1`

func scanSpans(rows pgx.Rows) ([]AttemptSpan, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AttemptSpan, error) {
		var a AttemptSpan
		err := r.Scan(&a.Task, &a.Worker, &a.Start, &a.End, &a.Succeeded)
		return a, err
	})
}
