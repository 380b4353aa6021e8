package store

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Ending is a way an attempt ends. Each says whom it charges (Charges):
// this is the one place where the platform decides whose fault an end is.
// docs/WORKFLOW.md ("Attempts and whom they charge") has the same table
// for owners, docs/RATIONALE.md the reasons.
type Ending uint8

// The ways an attempt ends.
const (
	// EndTaskError: the worker says the task failed on its own (a non-zero
	// exit, a trap, a limit exceeded, a module that does not load). The
	// task's, once confirmed: from one of the operator's workers the
	// report is a verdict, from a volunteer it is evidence (Charge.Avoid,
	// Charge.Corroborate).
	EndTaskError Ending = iota
	// EndResult: the attempt delivered a result.
	EndResult
	// EndTaskFinal: the task cannot succeed however often it runs (an
	// input that does not exist, replicas that cannot agree): it fails at
	// once.
	EndTaskFinal
	// EndCancelled: the owner cancelled the task or workflow, or another
	// replica of the task failed it. Nobody's.
	EndCancelled
	// EndHandedBack: the worker stopped the attempt and said so (the
	// volunteer paused, the worker shuts down). Nobody's.
	EndHandedBack
	// EndUnstarted: the attempt never started: its worker left while it
	// waited in the worker's queue, or before the assignment reached it.
	// Nobody's.
	EndUnstarted
	// EndVanished: the worker stopped answering while the attempt may have
	// been running (its lease lapsed), or held it past its deadline (its
	// wall time and the grace, Renew) without reporting: no renewal
	// carried its lease further. The worker's: it loses standing,
	// and the task counts one loss towards its separate, generous bound
	// (max_lost), never towards max_attempts; not even that when the
	// attempt saved a checkpoint first (it moved its task on: workers
	// that come and go finish a checkpointing task however often they
	// go, while a task that brings its workers down before its first
	// checkpoint, or again and again at the same point, is stopped).
	EndVanished
	// EndServerFault: the server could not do its part (the database could
	// not read or write). Nobody's.
	EndServerFault
	// EndSuperseded: re-verification reset the task; its earlier attempts
	// no longer count. Nobody's.
	EndSuperseded
	// EndRefused: the worker reported a result that breaks the task's
	// rules (an output or log over the task's limits, an output name the
	// workflow could not name), which an honest worker never sends. The
	// worker's: it counts as an invalid result against its reputation.
	EndRefused
	// EndCrashed: the process running the attempt died, and its worker
	// says so (reason crashed): as far as it can tell the task brought it
	// down (the kernel's out-of-memory killer, a browser thread that
	// failed). A loss of the task's, towards max_lost, as when a worker
	// vanishes, so that a task that brings down every worker stops; not the
	// worker's, which survived to say so. Never again to that volunteer.
	EndCrashed
)

// Charge is what an end costs, and whom.
type Charge struct {
	// Attempt uses up one of the task's max_attempts.
	Attempt bool
	// Final fails the task at once.
	Final bool
	// Lost counts one loss towards the task's max_lost, unless the
	// attempt saved a checkpoint.
	Lost bool
	// Worker counts against the worker's standing: a loss
	// (workers.tasks_lost) when it vanished, an invalid result
	// (workers.results_invalid) when its result was refused.
	Worker bool
	// KeepsPlace queues the task again at its original place in the
	// ready queue (it has waited, and may have checkpoints), rather than
	// behind the tasks that became ready since.
	KeepsPlace bool
	// Avoid keeps the task from the worker for good (tasks.avoid), when
	// the worker is a volunteer: a worker that failed, lost or broke the
	// rules of a task never gets it again, so no one volunteer can use up
	// a task's attempts.
	Avoid bool
	// Corroborate fails the task for good, once its attempts are used
	// up, only if at least two distinct workers failed it
	// (tasks.failed_by), or the worker is one of the operator's: until
	// then the task waits for another worker to confirm the failure.
	Corroborate bool
}

// Charges returns whom an end charges.
func (e Ending) Charges() Charge {
	switch e {
	case EndTaskError:
		return Charge{Attempt: true, KeepsPlace: true, Avoid: true, Corroborate: true}
	case EndTaskFinal:
		return Charge{Attempt: true, Final: true}
	case EndVanished:
		return Charge{Lost: true, Worker: true, KeepsPlace: true, Avoid: true}
	case EndCrashed:
		return Charge{Lost: true, KeepsPlace: true, Avoid: true}
	case EndHandedBack, EndUnstarted, EndServerFault:
		return Charge{KeepsPlace: true}
	case EndRefused:
		return Charge{Worker: true, KeepsPlace: true, Avoid: true}
	default: // EndResult, EndCancelled, EndSuperseded
		return Charge{}
	}
}

// attemptState is the state an attempt that ended this way without a
// result is recorded in: lost when its worker went away (whether or not it
// had started it), failed otherwise.
func (e Ending) attemptState() string {
	switch e {
	case EndVanished, EndUnstarted:
		return "lost"
	}
	return "failed"
}

// chargeWorkers counts attempts that ended this way against their workers'
// standing (Charge.Worker), n per worker: a loss (tasks_lost) for
// EndVanished, an invalid result for EndRefused (as a result that lost a
// quorum, which also ends the worker's streak of valid ones) and as many
// strikes (see strikesSet).
func chargeWorkers(ctx context.Context, tx querier, e Ending, n map[string]int) error {
	var set string
	switch e {
	case EndVanished:
		set = `tasks_lost = w.tasks_lost + c.n`
	case EndRefused:
		set = `results_invalid = w.results_invalid + c.n, valid_streak = 0, ` + strikesSet("c.n")
	default:
		return fmt.Errorf("charge workers: %s charges no worker", e)
	}
	ws := make([]string, 0, len(n))
	for w := range n {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	counts := make([]int32, len(ws))
	for i, w := range ws {
		counts[i] = int32(n[w])
	}
	if _, err := tx.Exec(ctx, `UPDATE workers w SET `+set+`
		FROM unnest($1::uuid[], $2::int[]) AS c(id, n) WHERE w.id = c.id`, ws, counts); err != nil {
		return fmt.Errorf("count %s against their workers: %w", e, err)
	}
	return nil
}

// String names an end as docs/WORKFLOW.md does.
func (e Ending) String() string {
	switch e {
	case EndTaskError:
		return "task error"
	case EndResult:
		return "result"
	case EndTaskFinal:
		return "task cannot succeed"
	case EndCancelled:
		return "cancelled"
	case EndHandedBack:
		return "handed back"
	case EndUnstarted:
		return "never started"
	case EndVanished:
		return "worker vanished"
	case EndCrashed:
		return "crashed"
	case EndServerFault:
		return "server fault"
	case EndSuperseded:
		return "superseded"
	case EndRefused:
		return "result refused"
	}
	return "unknown"
}

// StrikeHalfLife is how fast a worker's strikes fade (workers.strikes):
// a worker benched for its strikes gets tasks again a while later.
const StrikeHalfLife = 30 * time.Minute

// strikesSet is the SET clause that adds n (an SQL expression) strikes to
// a worker (alias w), after fading those it had by StrikeHalfLife.
func strikesSet(n string) string {
	return fmt.Sprintf(`strikes = w.strikes * power(0.5, extract(epoch FROM now() - coalesce(w.strikes_at, now())) / %d) + %s,
		strikes_at = now()`, int(StrikeHalfLife.Seconds()), n)
}

// DefaultMaxLost is the bound on a task's losses (EndVanished) that a task
// gets unless its workflow says otherwise (tasks.max_lost): generous,
// since losing a volunteer is the normal case, yet finite, so that a task
// that brings down every worker that runs it (a tab that crashes) stops.
const DefaultMaxLost = 10
