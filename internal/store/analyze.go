package store

import (
	"context"
	"sync"
	"time"
)

// analyzeAfterTasks is the number of tasks (or of edges) a submission must
// write for CreateWorkflow to refresh the planner's statistics of tasks (or
// of task_inputs) afterwards.
const analyzeAfterTasks = 1000

// statsRefresher runs ANALYZE in the background after large submissions,
// one at a time: requests that arrive while one runs are merged into the
// next run.
//
// The planner's statistics of tasks and task_inputs may date from when the
// tables were small (autovacuum refreshes them only after its next nap, up
// to a minute later). The dispatcher's claim and completion no longer
// depend on them (TestClaimReadsRowsInProportionToItsPicks; queueBegin),
// but queries off the hot path do: the descendants of a failed or cancelled
// task (recursive over task_inputs) and the statements that name a task
// state, with statistics that say hardly any task is active. The refresh
// used to run before the submission was answered: 80 to 170 ms of a
// 20,000-task submission's 570 to 620. It was never ordered before the
// dispatchers' work (the commit's notification wakes them first), and the
// status and event-stream queries a submitter sends next read the new
// workflow through its (workflow_id, name) key with or without fresh
// statistics (TestStatusReadsItsWorkflowWithStaleStatistics), so the answer
// no longer waits for it. Runs are at least gap apart: a steady stream of
// large submissions refreshes the statistics every gap, not back to back.
type statsRefresher struct {
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu            sync.Mutex
	running       bool
	tasks, inputs bool // tables to analyze at the next run
	analyze       func(ctx context.Context, sql string) error
	gap           time.Duration // from the end of a run to the start of the next
}

// statsRefreshGap is the least time between two refreshes of one store.
const statsRefreshGap = 10 * time.Second

func newStatsRefresher(gap time.Duration, analyze func(ctx context.Context, sql string) error) *statsRefresher {
	ctx, cancel := context.WithCancel(context.Background())
	return &statsRefresher{ctx: ctx, cancel: cancel, analyze: analyze, gap: gap}
}

// request asks for the statistics of tasks and/or task_inputs to be
// refreshed soon.
func (r *statsRefresher) request(tasks, inputs bool) {
	if !tasks && !inputs {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tasks, r.inputs = r.tasks || tasks, r.inputs || inputs
	if r.running || r.ctx.Err() != nil {
		return
	}
	r.running = true
	r.wg.Add(1)
	go r.run()
}

func (r *statsRefresher) run() {
	defer r.wg.Done()
	for first := true; ; first = false {
		if !first {
			// Requests arriving meanwhile merge into the next run.
			select {
			case <-r.ctx.Done():
			case <-time.After(r.gap):
			}
		}
		r.mu.Lock()
		tasks, inputs := r.tasks, r.inputs
		r.tasks, r.inputs = false, false
		if (!tasks && !inputs) || r.ctx.Err() != nil {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		sql := "ANALYZE tasks, task_inputs"
		switch {
		case !inputs:
			sql = "ANALYZE tasks"
		case !tasks:
			sql = "ANALYZE task_inputs"
		}
		// Autovacuum refreshes the statistics anyway: a failure is not
		// worth more than its absence.
		_ = r.analyze(r.ctx, sql)
	}
}

// stop cancels a refresh under way and waits for it to end.
func (r *statsRefresher) stop() {
	r.mu.Lock()
	r.cancel()
	r.mu.Unlock()
	r.wg.Wait()
}
