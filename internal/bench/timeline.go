package bench

import (
	"context"
	"time"
)

// printTimeline prints where a dispatch run's wall time went, from the
// database's own timestamps (each a transaction's start): when the first
// attempt of the workflow was claimed (by the first claim after the
// submission's commit, or by the submission itself for a small one), when
// the last attempt was claimed, and when the last succeeded, each in ms
// from the submission request; and the rate of the tasks' successes
// between the first claim and the last success.
func (b *bench) printTimeline(ctx context.Context, part, id string, start time.Time) {
	var first, lastStart, lastEnd time.Time
	var n int
	err := b.db.QueryRow(ctx, `
SELECT min(a.started_at), max(a.started_at), max(a.ended_at), count(DISTINCT a.task_id) FILTER (WHERE a.state = 'succeeded')
FROM attempts a JOIN tasks t ON t.id = a.task_id
WHERE t.workflow_id = $1`, id).Scan(&first, &lastStart, &lastEnd, &n)
	if err != nil {
		b.printf("%s_timeline: %v", part, err)
		return
	}
	b.printf("%s_first_start_ms: %.0f", part, ms(first.Sub(start)))
	b.printf("%s_last_start_ms: %.0f", part, ms(lastStart.Sub(start)))
	b.printf("%s_last_end_ms: %.0f", part, ms(lastEnd.Sub(start)))
	b.printf("%s_flow_tasks_per_s: %.0f", part, float64(n)/lastEnd.Sub(first).Seconds())
}
