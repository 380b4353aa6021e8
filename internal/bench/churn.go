package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// churnEvery is how long each churned worker process lives, from its start,
// before the churn part SIGKILLs it and starts the next.
const churnEvery = 4 * time.Second

// churnSteps is the step count (of 100 ms of the counter's busy loop) of
// churn task i: 0.8 to 1.2 s of CPU.
func churnSteps(i int) int { return 8 + i%5 }

// churnRun is what one run of the churn workflow gave.
type churnRun struct {
	id       string
	makespan time.Duration // submission request to the durable end of the workflow
	kills    int           // churned worker processes SIGKILLed while it ran
	err      error         // why the workflow did not end done (nil: it did)
}

// churn measures what volunteers who vanish cost a workflow of short
// checkpointing tasks. Two headless worker processes run it twice: once
// both stay up (the baseline), then again while the second is SIGKILLed and
// replaced by a new process every churnEvery (the soak). It prints the
// soak's attempts per task, every attempt row counted whatever its end,
// and its makespan over the baseline's.
//
// Each worker has half the CPUs' slots and the queue a volunteer's worker
// has by default, so the two runs keep the machine's cores busy with the
// tasks' CPU time (Config.ChurnTasks tasks of 0.8 to 1.2 s).
func (b *bench) churn(ctx context.Context) error {
	log := b.cfg.Logger.With("part", "churn")
	mod, err := b.pushTask(ctx, "counter")
	if err != nil {
		return err
	}
	slots := max(1, runtime.NumCPU()/2)
	startWorker := func(name string) (*process, error) {
		return b.startWorkerArgs(name, "--slots", strconv.Itoa(slots))
	}
	ws, err := b.connectWorkers(ctx, startWorker, "churn-steady", "churn-second")
	for _, w := range ws {
		defer w.stop()
	}
	if err != nil {
		return err
	}
	second := ws[1]
	// Both workers compile the module (into the cache that every later
	// process shares) and start their slot processes before anything is
	// measured.
	warm := b.counterWorkflow("churn-warm-up", mod.ID, 4*slots, func(int) int { return 1 })
	if run, err := b.runChurn(ctx, warm, time.Minute, nil); err != nil || run.err != nil {
		return fmt.Errorf("warm-up: %w", cmp.Or(err, run.err))
	}

	wf := b.counterWorkflow("churn", mod.ID, b.cfg.ChurnTasks, churnSteps)
	log.Info("baseline run", "tasks", b.cfg.ChurnTasks, "slots", slots)
	base, err := b.runChurn(ctx, wf, 5*time.Minute, nil)
	if err != nil {
		return fmt.Errorf("baseline run: %w", err)
	}
	second.stop()
	b.printf("churn_tasks: %d", b.cfg.ChurnTasks)
	b.printf("churn_baseline_makespan_s: %.1f", base.makespan.Seconds())
	if base.err != nil {
		b.printf("churn_baseline_workflow: FAILED: %v", base.err)
	} else if made, err := b.attemptsMade(ctx, base.id); err == nil {
		b.printf("churn_baseline_attempts_per_task: %.2f", float64(made)/float64(b.cfg.ChurnTasks))
	}

	log.Info("soak run", "every", churnEvery)
	soak, err := b.runChurn(ctx, wf, max(3*time.Minute, 5*base.makespan), func(n int) (*process, error) {
		return startWorker(fmt.Sprintf("churn-%d", n))
	})
	if err != nil {
		return fmt.Errorf("soak run: %w", err)
	}
	b.printf("churn_kills: %d", soak.kills)
	b.printf("churn_makespan_s: %.1f", soak.makespan.Seconds())
	if soak.err != nil {
		b.printf("churn_workflow: FAILED: %v", soak.err)
	} else {
		b.printf("churn_workflow: done (all %d tasks done)", b.cfg.ChurnTasks)
	}
	if err := b.printChurnAttempts(ctx, soak.id); err != nil {
		return err
	}
	if soak.err == nil && base.err == nil {
		b.printf("churn_makespan_ratio: %.2f", soak.makespan.Seconds()/base.makespan.Seconds())
	}

	// Volunteers whose phones fall asleep: the second worker is stopped
	// (SIGSTOP: its socket stays open, silent) for sleepFor, then goes on,
	// every awakeFor.
	log.Info("sleep run", "awake", awakeFor, "asleep", sleepFor)
	ws, err = b.connectWorkers(ctx, startWorker, "churn-sleeper")
	for _, w := range ws {
		defer w.stop()
	}
	if err != nil {
		return err
	}
	sleepy, err := b.runSleeping(ctx, wf, max(3*time.Minute, 5*base.makespan), ws[0])
	if err != nil {
		return fmt.Errorf("sleep run: %w", err)
	}
	b.printf("churn_sleeps: %d", sleepy.kills)
	b.printf("churn_sleep_makespan_s: %.1f", sleepy.makespan.Seconds())
	if sleepy.err != nil {
		b.printf("churn_sleep_workflow: FAILED: %v", sleepy.err)
	} else if made, err := b.attemptsMade(ctx, sleepy.id); err == nil {
		b.printf("churn_sleep_attempts_per_task: %.2f", float64(made)/float64(b.cfg.ChurnTasks))
		if base.err == nil {
			b.printf("churn_sleep_makespan_ratio: %.2f", sleepy.makespan.Seconds()/base.makespan.Seconds())
		}
	}
	return nil
}

// awakeFor and sleepFor are the cycle of the churn part's sleeping worker:
// it runs for awakeFor, then is stopped for sleepFor, longer than the
// silence after which a worker's queue goes back (two and a half heartbeat
// intervals: 7.5 s) but shorter than a lease (15 s).
const (
	awakeFor = 6 * time.Second
	sleepFor = 10 * time.Second
)

// runSleeping submits a workflow and waits up to limit for its end while
// the worker process w, connected before the submission, is stopped
// (SIGSTOP) for sleepFor after every awakeFor, and continued. Its kills
// are the times w slept. A workflow that does not end done is reported in
// churnRun.err, as runChurn does.
func (b *bench) runSleeping(ctx context.Context, wf []byte, limit time.Duration, w *process) (churnRun, error) {
	var run churnRun
	start := time.Now()
	s, err := b.client.Submit(ctx, wf)
	if err != nil {
		return run, err
	}
	run.id = s.ID
	done := make(chan error, 1)
	go func() { done <- b.waitDone(ctx, s.ID, limit) }()
	asleep := false
	t := time.NewTimer(awakeFor)
	defer t.Stop()
cycle:
	for {
		select {
		case err = <-done:
			break cycle
		case <-t.C:
			if asleep {
				if err := wakeProcess(w); err != nil {
					return run, err
				}
				t.Reset(awakeFor)
			} else {
				if err := sleepProcess(w); err != nil {
					return run, err
				}
				run.kills++
				t.Reset(sleepFor)
			}
			asleep = !asleep
		}
	}
	if asleep {
		_ = wakeProcess(w)
	}
	run.makespan = time.Since(start)
	return run, b.judgeChurn(ctx, &run, err)
}

// connectWorkers starts a worker process named after each of names with
// start and waits until they are connected. It returns those it started,
// for the caller to stop, with the first error.
func (b *bench) connectWorkers(ctx context.Context, start func(name string) (*process, error), names ...string) ([]*process, error) {
	since, err := b.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	var ws []*process
	for _, name := range names {
		w, err := start(name)
		if err != nil {
			return ws, err
		}
		ws = append(ws, w)
	}
	return ws, b.waitNewWorkers(ctx, since, len(names))
}

// counterWorkflow is a workflow of n counter tasks, task i counting
// steps(i) steps of 100 ms, with a checkpoint asked for every second and
// the default max_attempts.
func (b *bench) counterWorkflow(name, module string, n int, steps func(int) int) []byte {
	type task struct {
		Name       string   `json:"name"`
		Module     string   `json:"module"`
		Args       []string `json:"args"`
		Checkpoint string   `json:"checkpoint_interval"`
	}
	tasks := make([]task, n)
	for i := range tasks {
		tasks[i] = task{Name: fmt.Sprintf("c%03d", i), Module: module,
			Args: []string{strconv.Itoa(steps(i)), "100"}, Checkpoint: "1s"}
	}
	data, _ := json.Marshal(map[string]any{"name": name, "tasks": tasks})
	return data
}

// runChurn submits a workflow and waits up to limit for its end. With
// churner nil the workers connected now run it. Otherwise churner(0)
// starts a worker process, which connects before the submission, and
// every churnEvery the current one is SIGKILLed and churner(k) starts the
// next, until the workflow ends; the last is then stopped. A workflow that
// does not end done is reported in churnRun.err (and cancelled, so that
// no later part runs its tasks); an error is returned when the run could
// not be made.
func (b *bench) runChurn(ctx context.Context, wf []byte, limit time.Duration,
	churner func(k int) (*process, error)) (churnRun, error) {
	var run churnRun
	var w *process
	var born time.Time
	if churner != nil {
		since, err := b.dbNow(ctx)
		if err != nil {
			return run, err
		}
		if w, err = churner(0); err != nil {
			return run, err
		}
		born = time.Now()
		if err := b.waitNewWorkers(ctx, since, 1); err != nil {
			w.kill()
			return run, err
		}
	}
	start := time.Now()
	s, err := b.client.Submit(ctx, wf)
	if err != nil {
		if w != nil {
			w.kill()
		}
		return run, err
	}
	run.id = s.ID
	done := make(chan error, 1)
	go func() { done <- b.waitDone(ctx, s.ID, limit) }()
	if churner == nil {
		err = <-done
	} else {
		t := time.NewTimer(time.Until(born.Add(churnEvery)))
	soak:
		for {
			select {
			case err = <-done:
				t.Stop()
				w.stop()
				break soak
			case <-t.C:
				w.kill()
				run.kills++
				next, err := churner(run.kills)
				if err != nil {
					if _, cerr := b.client.Cancel(ctx, s.ID); cerr != nil {
						err = errors.Join(err, cerr)
					}
					return run, err
				}
				w = next
				t.Reset(churnEvery)
			}
		}
	}
	run.makespan = time.Since(start)
	return run, b.judgeChurn(ctx, &run, err)
}

// judgeChurn checks that the workflow of run, which waitDone ended with
// err, has every task done, and reports it in run.err (cancelling it)
// when not. It returns ctx's error when the wait ended with it.
func (b *bench) judgeChurn(ctx context.Context, run *churnRun, err error) error {
	if err == nil { // the workflow says done: so must each of its tasks
		var notDone int
		if err = b.db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE workflow_id = $1 AND state <> 'done'`,
			run.id).Scan(&notDone); err == nil && notDone > 0 {
			err = fmt.Errorf("workflow %s is done with %d tasks not done", run.id, notDone)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		run.err = fmt.Errorf("%w; %s", err, b.taskStates(ctx, run.id))
		if _, cerr := b.client.Cancel(ctx, run.id); cerr != nil {
			b.cfg.Logger.Warn("churn: cancel the unfinished workflow", "workflow", run.id, "err", cerr)
		}
	}
	return nil
}

// taskStates says how many tasks of a workflow are in each state, and
// names the first one that is not done, with its error.
func (b *bench) taskStates(ctx context.Context, id string) string {
	rows, err := b.db.Query(ctx, `SELECT state, count(*) FROM tasks WHERE workflow_id = $1 GROUP BY state ORDER BY state`, id)
	if err != nil {
		return fmt.Sprintf("task states unknown: %v", err)
	}
	var parts []string
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			rows.Close()
			return fmt.Sprintf("task states unknown: %v", err)
		}
		parts = append(parts, fmt.Sprintf("%s=%d", state, n))
	}
	rows.Close()
	out := "tasks " + strings.Join(parts, " ")
	var name, state, msg string
	if err := b.db.QueryRow(ctx, `SELECT name, state, error FROM tasks WHERE workflow_id = $1 AND state <> 'done'
		ORDER BY name LIMIT 1`, id).Scan(&name, &state, &msg); err == nil {
		out += fmt.Sprintf("; first not done: %s (%s) %q", name, state, msg)
	}
	return out
}

// attemptsMade counts every attempt row of a workflow's tasks, however it
// ended.
func (b *bench) attemptsMade(ctx context.Context, id string) (int, error) {
	var n int
	err := b.db.QueryRow(ctx, `SELECT count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1`,
		id).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the attempts of workflow %s: %w", id, err)
	}
	return n, nil
}

// printChurnAttempts prints the soak's attempts per task, with the
// attempts by state, those that resumed from a checkpoint, and what the
// tasks were charged (max_attempts and max_lost).
func (b *bench) printChurnAttempts(ctx context.Context, id string) error {
	var tasks, charged, lost int
	if err := b.db.QueryRow(ctx, `SELECT count(*), coalesce(sum(attempts), 0), coalesce(sum(lost), 0)
		FROM tasks WHERE workflow_id = $1`, id).Scan(&tasks, &charged, &lost); err != nil {
		return fmt.Errorf("read the tasks of workflow %s: %w", id, err)
	}
	if tasks == 0 {
		return fmt.Errorf("workflow %s has no tasks", id)
	}
	rows, err := b.db.Query(ctx, `SELECT a.state, count(*), count(*) FILTER (WHERE a.restored_seq > 0)
		FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1 GROUP BY a.state ORDER BY a.state`, id)
	if err != nil {
		return fmt.Errorf("read the attempts of workflow %s: %w", id, err)
	}
	defer rows.Close()
	var made, resumed int
	var states []string
	for rows.Next() {
		var state string
		var n, r int
		if err := rows.Scan(&state, &n, &r); err != nil {
			return fmt.Errorf("read the attempts of workflow %s: %w", id, err)
		}
		made += n
		resumed += r
		states = append(states, fmt.Sprintf("%s=%d", state, n))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the attempts of workflow %s: %w", id, err)
	}
	b.printf("churn_wasted_attempts_per_task: %.2f", float64(made)/float64(tasks))
	b.printf("churn_attempts: %d (%s)", made, strings.Join(states, " "))
	b.printf("churn_attempts_resumed: %d", resumed)
	b.printf("churn_charged_attempts_per_task: %.2f", float64(charged)/float64(tasks))
	b.printf("churn_lost_per_task: %.2f", float64(lost)/float64(tasks))
	return nil
}

// dbNow is the database's clock.
func (b *bench) dbNow(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := b.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t); err != nil {
		return t, fmt.Errorf("read the database's clock: %w", err)
	}
	return t, nil
}

// waitNewWorkers waits until n workers that connected since (by the
// database's clock) are connected.
func (b *bench) waitNewWorkers(ctx context.Context, since time.Time, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var got int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FROM workers WHERE connected AND connected_at >= $1`,
			since).Scan(&got); err != nil {
			return fmt.Errorf("count the connected workers: %w", err)
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%d new workers did not connect within 30 s", n)
}

// pushTask pushes the task module bin/tasks/NAME.wasm (make tasks builds
// it) and returns it as pushed.
func (b *bench) pushTask(ctx context.Context, name string) (client.Module, error) {
	wasm, err := os.ReadFile(filepath.Join(b.cfg.Repo, "bin", "tasks", name+".wasm"))
	if err != nil {
		return client.Module{}, fmt.Errorf("%w (run make tasks)", err)
	}
	mod, err := b.client.PushModule(ctx, wasm)
	if err != nil {
		return client.Module{}, fmt.Errorf("push the %s module: %w", name, err)
	}
	return mod, nil
}
