package store

import (
	"context"
	"fmt"
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

// aggregateModules folds per-name averages into one average per module,
// sorted by module.
func aggregateModules(names []RuntimeStat) []RuntimeStat {
	var out []RuntimeStat
	for _, st := range names { // sorted by module
		if n := len(out); n == 0 || out[n-1].Module != st.Module {
			out = append(out, RuntimeStat{Module: st.Module})
		}
		m := &out[len(out)-1]
		m.Mean = time.Duration((float64(m.Mean)*float64(m.Runs) + float64(st.Mean)*float64(st.Runs)) / float64(m.Runs+st.Runs))
		m.Runs += st.Runs
	}
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
// the last flush into the averages, in one statement: every module's
// (runtime_modules), and the names' own (runtime_stats) where they differ
// from their module's (see nameSpread). It returns how many task names it
// had run times of.
func (s *Store) FlushRuntimeStats(ctx context.Context) (int, error) {
	stats := aggregateRuns(s.runs.take())
	if len(stats) == 0 {
		return 0, nil
	}
	mods := aggregateModules(stats)
	ms := make([]string, len(stats))
	ns := make([]string, len(stats))
	runs := make([]int64, len(stats))
	means := make([]float64, len(stats))
	for i, st := range stats {
		ms[i], ns[i], runs[i], means[i] = st.Module, st.Name, st.Runs, float64(st.Mean)/float64(time.Millisecond)
	}
	mm := make([]string, len(mods))
	mruns := make([]int64, len(mods))
	mmeans := make([]float64, len(mods))
	for i, st := range mods {
		mm[i], mruns[i], mmeans[i] = st.Module, st.Runs, float64(st.Mean)/float64(time.Millisecond)
	}
	_, err := s.pool.Exec(ctx, `WITH m AS (
			INSERT INTO runtime_modules AS r (module_id, runs, mean_ms)
			SELECT * FROM unnest($5::text[], $6::bigint[], $7::float8[])
			ON CONFLICT (module_id) DO UPDATE SET runs = r.runs + EXCLUDED.runs,
				mean_ms = (r.mean_ms * r.runs + EXCLUDED.mean_ms * EXCLUDED.runs) / (r.runs + EXCLUDED.runs)
			RETURNING module_id, mean_ms
		)
		INSERT INTO runtime_stats AS r (module_id, name, runs, mean_ms)
		SELECT n.module_id, n.name, n.runs, n.mean_ms
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[]) AS n(module_id, name, runs, mean_ms)
		JOIN m ON m.module_id = n.module_id
		WHERE abs(n.mean_ms - m.mean_ms) > greatest($8 * m.mean_ms, $9)
			OR EXISTS (SELECT 1 FROM runtime_stats e WHERE e.module_id = n.module_id AND e.name = n.name)
		ORDER BY n.module_id, n.name
		ON CONFLICT (module_id, name) DO UPDATE SET runs = r.runs + EXCLUDED.runs,
			mean_ms = (r.mean_ms * r.runs + EXCLUDED.mean_ms * EXCLUDED.runs) / (r.runs + EXCLUDED.runs)`,
		ms, ns, runs, means, mm, mruns, mmeans, nameSpread, float64(nameMinDiff)/float64(time.Millisecond))
	if err != nil {
		return 0, fmt.Errorf("update run time averages: %w", err)
	}
	return len(stats), nil
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
// an ORDER BY).
const workflowSpansSQL = `SELECT t.name, a.worker_id::text, a.started_at, coalesce(a.ended_at, now()), a.state = 'succeeded'
	FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1`

func scanSpans(rows pgx.Rows) ([]AttemptSpan, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (AttemptSpan, error) {
		var a AttemptSpan
		err := r.Scan(&a.Task, &a.Worker, &a.Start, &a.End, &a.Succeeded)
		return a, err
	})
}
