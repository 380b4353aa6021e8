package sched

import (
	"math/rand/v2"
	"sort"
	"time"
)

// Priority is a task's priority class.
type Priority int

// Priority classes: interactive work goes before batch work.
const (
	Interactive Priority = iota
	Batch
)

// Task is one ready task instance (one replica when the task is
// replicated), as the dispatcher reads it.
type Task struct {
	ID         string // task id (replicas share it)
	Replica    int    // 0 for the first instance, 1.. for extra replicas
	Workflow   string
	Module     string // module id, for the run time averages
	Name       string // task name, for the run time averages
	Priority   Priority
	ReadySince time.Time
	// Estimate overrides the run time averages when > 0.
	Estimate time.Duration
	// CheckpointCost is the measured cost of one checkpoint of this task
	// (0 = unknown: no checkpoints are planned).
	CheckpointCost time.Duration
	// Exclude lists workers that hold or held a replica of this task: no
	// replica of a task ever goes to the same worker twice.
	Exclude []string
}

// Worker is what the server knows of one connected worker.
type Worker struct {
	ID       string
	Slots    int // slots in total
	Busy     int // slots running an attempt
	Idle     int // idle slots offered to this plan (<= Slots - Busy)
	Samples  []Sample
	History  History
	Rep      Reputation
	JobsDone int     // jobs completed in the fairness observation period
	Link     float64 // link quality in [0, 1]; negative when unknown (counts as 1)
	// Speed scales run times (1 = the reference the averages were measured
	// on; 0 counts as 1).
	Speed float64
}

// Config selects the policies of a server.
type Config struct {
	Fairness  Strategy
	GroupSize int // n of the paper (group including the worker itself)
	// DeadlockPerCandidate is the deadlock prevention bound per candidate
	// worker (the paper: 10 s).
	DeadlockPerCandidate time.Duration
	// JobWeight is how much one job done lowers a mains-powered worker's
	// performance value f (see Performance).
	JobWeight float64
	// MostAble makes the fairness strategies pick, among the workers they
	// let take a task, the one with the highest f; false takes the first in
	// the dispatcher's worker order, like the race between autonomous
	// nodes in the paper.
	MostAble bool
	// LoadWeight is how much a fully busy worker's f drops (see Performance).
	LoadWeight float64
	// BatchAging is the wait after which a batch task ranks with
	// interactive ones, so batch work never starves (0 = never).
	BatchAging time.Duration
	// LongestFirst orders tasks of equal rank by decreasing expected run
	// time (Heymann et al.); off keeps oldest first.
	LongestFirst bool
	// DeviceAware applies the stability classes; off treats every worker
	// as very stable.
	DeviceAware bool
	Stability   StabilityConfig
	// FaultPrior and FaultPriorExposure are the prior of FaultRate.
	FaultPrior         float64
	FaultPriorExposure time.Duration
	// MaxCheckpoints bounds the planned segments per attempt (0 = none).
	MaxCheckpoints int
}

// DefaultConfig is the server's default: no fairness (group size 10, 10 s
// per candidate when enabled, most able pick), one job worth 0.01 of f, a busy worker's f
// 10% lower, batch tasks aging
// into interactive after 10 minutes, longest first, device-aware, and a
// fault prior of one fault per 4 hours.
func DefaultConfig() Config {
	return Config{
		Fairness:             None,
		GroupSize:            10,
		DeadlockPerCandidate: 10 * time.Second,
		JobWeight:            0.01,
		LoadWeight:           0.1,
		MostAble:             true,
		BatchAging:           10 * time.Minute,
		LongestFirst:         true,
		DeviceAware:          true,
		Stability:            DefaultStability(),
		FaultPrior:           1,
		FaultPriorExposure:   4 * time.Hour,
		MaxCheckpoints:       100,
	}
}

// Input is one dispatch round: the ready task instances, the connected
// workers (with their idle slots) and the run time averages.
type Input struct {
	Ready   []Task
	Workers []Worker
	Stats   *RuntimeStats
	// Rand orders tasks whose run time is unknown; nil keeps input order.
	Rand *rand.Rand
}

// Assignment is one decision: run this task instance on this worker, with
// these parameters.
type Assignment struct {
	Task     string
	Replica  int
	Worker   string
	Expected time.Duration // expected run time (0 = unknown)
	// Checkpoint is the plan that drives checkpoint_due for this attempt.
	Checkpoint CheckpointPlan
	// FairnessOff is set when the deadlock prevention let this task past
	// the fairness strategy.
	FairnessOff bool
}

// Skip explains why a task instance was left waiting.
type Skip struct {
	Task    string
	Replica int
	Reason  string
}

// Plan is the result of a round.
type Plan struct {
	Assignments []Assignment
	Waiting     []Skip
	// Stability is the classification of every worker, for the API.
	Stability map[string]Stability
}

// Schedule plans one dispatch round. It orders the ready tasks (priority
// with batch aging, then longest first with random order while unknown),
// classifies every worker, and gives each task, in order, the best idle
// slot that its stability allows, that the fairness strategy does not make
// refrain (unless the task has waited past the deadlock bound), and that
// holds no replica of the same task. Without fairness, or past the deadlock
// bound, the first fitting worker (most stable class, then input order)
// wins; with fairness, the first (or with MostAble the most able, highest
// Performance) of the workers the strategy lets take it. Tasks that fit nowhere stay waiting
// with a reason. It reads the time once, from clock.
func Schedule(clock Clock, in Input, cfg Config) Plan {
	now := clock.Now()
	plan := Plan{Stability: make(map[string]Stability, len(in.Workers))}
	ws := make([]Worker, len(in.Workers))
	copy(ws, in.Workers)
	ids := make([]string, len(ws))
	stab := make([]Stability, len(ws))
	for i, w := range ws {
		ids[i] = w.ID
		if cfg.DeviceAware {
			stab[i] = Classify(now, w.Samples, w.History, cfg.Stability)
		} else {
			stab[i] = Stability{Class: VeryStable, TimeToEmpty: -1}
		}
		plan.Stability[w.ID] = stab[i]
	}
	groups := make([][]int, len(ws))
	if cfg.Fairness != None {
		for i := range ws {
			groups[i] = Group(ids, i, cfg.GroupSize)
		}
	}
	perf := func(i int) float64 {
		w := ws[i]
		b, ch := -1.0, false
		if s := latest(now, w.Samples); s != nil {
			b, ch = s.Battery, s.Charging
		}
		return Performance(b, ch, w.Link, w.Busy, w.Slots, w.JobsDone, cfg.JobWeight, cfg.LoadWeight)
	}

	rank := func(t Task) int {
		if t.Priority == Interactive {
			return 0
		}
		if cfg.BatchAging > 0 && now.Sub(t.ReadySince) >= cfg.BatchAging {
			return 0
		}
		return 1
	}
	expected := func(t Task) (time.Duration, bool) {
		if t.Estimate > 0 {
			return t.Estimate, true
		}
		return in.Stats.Expected(t.Module, t.Name)
	}
	tasks := in.Ready
	// Rank and expected run time once per task: the dispatcher calls
	// Schedule round after round with hundreds of tasks.
	ranks := make([]int, len(tasks))
	exps := make([]time.Duration, len(tasks))
	knowns := make([]bool, len(tasks))
	for i := range tasks {
		ranks[i] = rank(tasks[i])
		exps[i], knowns[i] = expected(tasks[i])
	}
	var order []int
	if cfg.LongestFirst {
		order = LongestFirst(len(tasks), func(i int) int { return ranks[i] }, func(i int) (time.Duration, bool) { return exps[i], knowns[i] }, in.Rand)
	} else {
		order = make([]int, len(tasks))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool {
			ia, ib := order[a], order[b]
			if ra, rb := ranks[ia], ranks[ib]; ra != rb {
				return ra < rb
			}
			return tasks[ia].ReadySince.Before(tasks[ib].ReadySince)
		})
	}
	// Workers in order of preference: most stable first, then input order
	// (the dispatcher passes them in a stable order, e.g. by id).
	wOrder := make([]int, len(ws))
	for i := range wOrder {
		wOrder[i] = i
	}
	sort.SliceStable(wOrder, func(a, b int) bool { return stab[wOrder[a]].Class < stab[wOrder[b]].Class })

	holds := map[string]map[string]bool{} // task id -> workers holding a replica (made when needed)
	for _, t := range tasks {
		for _, x := range t.Exclude {
			if holds[t.ID] == nil {
				holds[t.ID] = map[string]bool{}
			}
			holds[t.ID][x] = true
		}
	}
	idle := 0
	for _, w := range ws {
		idle += max(w.Idle, 0)
	}
	plan.Waiting = make([]Skip, 0, len(tasks))
	for _, ti := range order {
		t := &tasks[ti]
		if idle == 0 {
			// What the loop below concludes when no worker is idle.
			plan.Waiting = append(plan.Waiting, Skip{Task: t.ID, Replica: t.Replica, Reason: "no idle slot"})
			continue
		}
		exp, known := exps[ti], knowns[ti]
		candidates := 0
		var fits []int
		reason := "no idle slot"
		for _, wi := range wOrder {
			w := ws[wi]
			if w.Idle <= 0 {
				continue
			}
			if holds[t.ID][w.ID] {
				reason = "only workers holding a replica of this task are idle"
				continue
			}
			run := scaled(exp, known, w.Speed)
			if ok, why := stab[wi].Fits(run, t.Replica > 0, cfg.Stability); !ok {
				reason = why
				continue
			}
			fits = append(fits, wi)
			candidates++
		}
		chosen, off := -1, false
		if len(fits) > 0 {
			if cfg.Fairness == None {
				chosen = fits[0]
			} else {
				timeout := DeadlockTimeout(cfg.DeadlockPerCandidate, candidates)
				off = now.Sub(t.ReadySince) >= timeout
				// Among the workers of the most stable class that the
				// strategy lets take the task, the most able (highest f).
				bestF := 0.0
				for _, wi := range fits {
					if off {
						chosen = wi
						break
					}
					if chosen >= 0 && stab[wi].Class > stab[chosen].Class {
						break
					}
					nb := make([]float64, len(groups[wi]))
					for k, j := range groups[wi] {
						nb[k] = perf(j)
					}
					if f := perf(wi); !cfg.Fairness.Refrains(f, nb) && (chosen < 0 || f > bestF) {
						chosen, bestF = wi, f
						if !cfg.MostAble {
							break
						}
					}
				}
				if chosen < 0 {
					reason = "every candidate refrains (" + cfg.Fairness.String() + "); deadlock prevention after " + timeout.String()
				}
			}
		}
		if chosen < 0 {
			plan.Waiting = append(plan.Waiting, Skip{Task: t.ID, Replica: t.Replica, Reason: reason})
			continue
		}
		w := &ws[chosen]
		w.Idle--
		w.Busy++
		idle--
		if holds[t.ID] == nil {
			holds[t.ID] = map[string]bool{}
		}
		holds[t.ID][w.ID] = true
		a := Assignment{Task: t.ID, Replica: t.Replica, Worker: w.ID, FairnessOff: off && cfg.Fairness != None}
		if known {
			a.Expected = scaled(exp, true, w.Speed)
			if t.CheckpointCost > 0 {
				mu := FaultRate(w.History.Lost, w.History.Exposure, cfg.FaultPrior, cfg.FaultPriorExposure)
				a.Checkpoint = OptimalCheckpoints(mu, a.Expected, t.CheckpointCost, cfg.MaxCheckpoints)
			}
		}
		plan.Assignments = append(plan.Assignments, a)
	}
	return plan
}

func scaled(d time.Duration, known bool, speed float64) time.Duration {
	if !known {
		return 0
	}
	if speed > 0 {
		return time.Duration(float64(d) / speed)
	}
	return d
}

func latest(now time.Time, ss []Sample) *Sample {
	var last *Sample
	for i := range ss {
		if !ss[i].At.After(now) && (last == nil || ss[i].At.After(last.At)) {
			last = &ss[i]
		}
	}
	return last
}
