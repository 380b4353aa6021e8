package bench

import (
	"context"
	"os"
	"strings"
)

// statementsEnv, when set, loads pg_stat_statements into the benchmark's
// PostgreSQL and prints the statements that took most of its time in the
// dispatch run (execution and planning, µs per task). Opt-in: the extension
// costs a little CPU per statement.
const statementsEnv = "CYCLEPOOL_BENCH_STATEMENTS"

var statementsSettings = []string{
	"shared_preload_libraries=pg_stat_statements",
	"pg_stat_statements.track_planning=on",
}

// resetStatements clears pg_stat_statements (creating the extension first)
// when statementsEnv is set.
func (b *bench) resetStatements(ctx context.Context) {
	if os.Getenv(statementsEnv) == "" {
		return
	}
	if _, err := b.db.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		b.printf("statements: %v", err)
		return
	}
	if _, err := b.db.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		b.printf("statements: %v", err)
	}
}

// printStatements prints the 15 statements with the most time since
// resetStatements, per task.
func (b *bench) printStatements(ctx context.Context, part string, tasks int) {
	if os.Getenv(statementsEnv) == "" {
		return
	}
	rows, err := b.db.Query(ctx, `SELECT calls, rows, total_exec_time, total_plan_time, shared_blks_hit + shared_blks_read, wal_bytes, query
		FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 15`)
	if err != nil {
		b.printf("statements: %v", err)
		return
	}
	defer rows.Close()
	n := float64(tasks)
	for rows.Next() {
		var calls, nrows, blks int64
		var exec, plan float64
		var wal float64
		var q string
		if err := rows.Scan(&calls, &nrows, &exec, &plan, &blks, &wal, &q); err != nil {
			b.printf("statements: %v", err)
			return
		}
		q = strings.Join(strings.Fields(q), " ")
		if len(q) > 90 {
			q = q[:90]
		}
		b.printf("%s_statement: exec_us_per_task=%.1f plan_us_per_task=%.1f calls=%d rows_per_task=%.2f blocks_per_task=%.1f wal_bytes_per_task=%.0f %s",
			part, exec*1000/n, plan*1000/n, calls, float64(nrows)/n, float64(blks)/n, wal/n, q)
	}
}
