package store

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// settingsTracer records, for each statement the store's pool runs,
// whether it ran in a transaction that had applied the hot path's settings
// (hotPathSettingsSQL) before it: the stale-statistics tests explain the
// hot path's statements under those settings, which is what they check
// only if the store runs them so.
type settingsTracer struct {
	mu    sync.Mutex
	conns map[*pgx.Conn]*txSettings
	ran   map[string][]bool // statement -> for each run, whether with the settings
}

type txSettings struct{ inTx, hot bool }

func newSettingsTracer() *settingsTracer {
	return &settingsTracer{conns: map[*pgx.Conn]*txSettings{}, ran: map[string][]bool{}}
}

func (tr *settingsTracer) observe(conn *pgx.Conn, sql string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	st := tr.conns[conn]
	if st == nil {
		st = &txSettings{}
		tr.conns[conn] = st
	}
	switch word := strings.ToUpper(strings.TrimSpace(sql)); {
	case word == "BEGIN" || strings.HasPrefix(word, "BEGIN "):
		*st = txSettings{inTx: true}
	case word == "COMMIT" || word == "ROLLBACK":
		*st = txSettings{}
	case strings.HasPrefix(sql, hotPathSettingsSQL):
		st.hot = st.inTx // set_config(..., true) outlives its statement only in a transaction
	default:
		tr.ran[sql] = append(tr.ran[sql], st.hot)
	}
}

// runs returns how sql ran since the last reset: for each run, whether
// with the settings.
func (tr *settingsTracer) runs(sql string) []bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.ran[sql]
}

func (tr *settingsTracer) reset() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	clear(tr.ran)
}

func (tr *settingsTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	tr.observe(conn, data.SQL)
	return ctx
}

func (tr *settingsTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *settingsTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (tr *settingsTracer) TraceBatchQuery(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	tr.observe(conn, data.SQL)
}

func (tr *settingsTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// The statements whose plans the stale-statistics tests check under the
// hot path's settings (TestSweepReadsOnlyTheAttemptsThatMayRun,
// TestActiveCountsWithStaleStatistics,
// TestRegistrationReadsByKeyWithStaleStatistics and the claim's and
// completion's) run under those settings when the store runs them: a
// change that dropped them would bring back plans that read every row
// ever kept, and those tests would not see it.
func TestHotPathStatementsRunWithTheirSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := newSettingsTracer()
	f := newFixtureAt(t, migratedURL(t), withTracer(tr))
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
		sqls []string
	}{
		{"lease sweep", func(t *testing.T) {
			if _, err := f.s.SweepLeases(ctx, Sweep{Lease: time.Minute, Limit: 100}); err != nil {
				t.Fatal(err)
			}
		}, []string{sweepEndedSQL, expireSQL}},
		{"lease sweep after a gap", func(t *testing.T) {
			// The previous case's sweep is the pass before this one.
			if _, err := f.s.SweepLeases(ctx, Sweep{Lease: time.Minute, Limit: 100, Gap: time.Nanosecond}); err != nil {
				t.Fatal(err)
			}
		}, []string{renewAllSQL}},
		{"task counts of /metrics", func(t *testing.T) {
			if _, _, err := f.s.ActiveCounts(ctx); err != nil {
				t.Fatal(err)
			}
		}, []string{activeCountsSQL}},
		{"claim and completion", func(t *testing.T) {
			f.submit(t, "batch", f.task("a"))
			cs := f.claim(t, 1, time.Minute)
			if len(cs) != 1 {
				t.Fatalf("%d claimed", len(cs))
			}
			if ok, err := f.s.Complete(ctx, []Completion{{Attempt: cs[0].Attempt, Worker: f.worker, OK: true}}); err != nil || !ok[0] {
				t.Fatalf("complete: %v, %v", ok, err)
			}
		}, []string{candidatesSQL, claimOnePerTaskSQL, completeFastSQL}},
		{"registration", func(t *testing.T) {
			// A worker that holds an attempt reconnects, beside a new one.
			reg := f.useWorker(t, 1)
			f.submit(t, "batch", f.task("b"))
			cs := f.claim(t, 1, time.Minute)
			if len(cs) != 1 {
				t.Fatalf("%d claimed", len(cs))
			}
			if _, err := f.s.WorkerGone(ctx, Gone{Worker: reg.ID, Session: reg.Session}); err != nil {
				t.Fatal(err)
			}
			again := WorkerHello{Kind: "headless", Slots: 1, ID: reg.ID, Token: reg.Token, Running: []int64{cs[0].Attempt}}
			_, errs := f.s.RegisterWorkers(ctx, []WorkerHello{again, {Kind: "headless", Slots: 1}}, time.Minute)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("hello %d: %v", i, err)
				}
			}
		}, []string{registerProvedSQL, registerNewSQL, registerSessionsSQL, renewHeldSQL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr.reset()
			tc.run(t)
			for _, sql := range tc.sqls {
				runs := tr.runs(sql)
				if len(runs) == 0 {
					t.Errorf("%.60q did not run", sql)
				}
				for i, hot := range runs {
					if !hot {
						t.Errorf("run %d of %.60q: without the hot path's settings", i, sql)
					}
				}
			}
		})
	}
}
