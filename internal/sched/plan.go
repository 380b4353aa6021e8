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
	ID       string // task id (replicas share it)
	Replica  int    // 0 for the first instance, 1.. for extra replicas
	Workflow string
	// Owner is the workflow's owner: owners share the slots (FairShare).
	Owner      int64
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
	// Data lists the data blobs the task reads (its files): a worker that
	// holds them all is preferred for it (ScheduleRounds, "locality").
	Data []string
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
	// Holds has the data blobs the worker keeps (reported in its hello,
	// and those of the tasks it was given since).
	Holds map[string]bool
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
	// Running has the attempts already running by owner, for FairShare
	// (nil: none).
	Running map[int64]int
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
	// Alone is set when the worker's stability would let it run the task
	// as the only copy, not just as one replica among others: only then
	// may a trusted worker run a replicated task alone.
	Alone bool
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
	p := newPlanner(clock, in, cfg)
	idle := 0
	for _, w := range p.ws {
		idle += max(w.Idle, 0)
	}
	p.plan.Waiting = make([]Skip, 0, len(p.tasks))
	for _, ti := range p.order {
		t := &p.tasks[ti]
		if idle == 0 {
			// What choose concludes when no worker is idle.
			p.plan.Waiting = append(p.plan.Waiting, Skip{Task: t.ID, Replica: t.Replica, Reason: "no idle slot"})
			continue
		}
		chosen, off, reason := p.choose(ti)
		if chosen < 0 {
			p.plan.Waiting = append(p.plan.Waiting, Skip{Task: t.ID, Replica: t.Replica, Reason: reason})
			continue
		}
		p.plan.Assignments = append(p.plan.Assignments, p.assign(ti, chosen, off))
		idle--
	}
	return p.plan
}

// ScheduleRounds plans like Schedule called round after round, each worker
// with idle slots offering one of them per round, until no slot is idle or
// a round places nothing: work spreads over the workers as their idle slots
// allow, a worker's Busy growing with every task it takes. The tasks are
// ordered and the workers classified once for all the rounds (tasks of
// unknown run time keep one random order), which makes a plan for many
// slots cost about one call of Schedule rather than one per round.
//
// placed, when not nil, sees each assignment as it is made; when it returns
// false, the task's other instances are withdrawn (a fresh replicated task
// that a trusted worker runs alone) and not reported as waiting. Waiting
// lists the instances left, with the reason of the last round that
// considered them.
func ScheduleRounds(clock Clock, in Input, cfg Config, placed func(Assignment) bool) Plan {
	p := newPlanner(clock, in, cfg)
	left := make([]int, len(p.ws)) // idle slots not yet taken
	for i, w := range p.ws {
		left[i] = max(w.Idle, 0)
	}
	done := make([]bool, len(p.tasks)) // placed or withdrawn
	reasons := make([]string, len(p.tasks))
	var withdrawn map[string]bool
	first := 0 // p.order[:first] is done
	for {
		offered := 0
		for i := range p.ws {
			p.ws[i].Idle = min(left[i], 1)
			offered += p.ws[i].Idle
		}
		if offered == 0 {
			break
		}
		for first < len(p.order) && done[p.order[first]] {
			first++
		}
		placedAny := false
		// place assigns task ti to worker wi, and withdraws the task's
		// other instances when placed says so.
		place := func(ti, wi int, off bool) {
			a := p.assign(ti, wi, off)
			left[wi]--
			offered--
			done[ti], placedAny = true, true
			p.plan.Assignments = append(p.plan.Assignments, a)
			if placed != nil && !placed(a) {
				if withdrawn == nil {
					withdrawn = map[string]bool{}
				}
				withdrawn[a.Task] = true
			}
		}
		// Locality first: an idle worker that holds the data of a task
		// near the head of the queue takes it (BOINC's locality
		// scheduling), so that data is downloaded once per worker, not
		// once per task. Only near the head (LocalityWindow tasks), and
		// not while the oldest task has waited LocalityMaxWait: the queue's
		// order bends, it does not starve anything.
		for _, wi := range p.localityWorkers(left) {
			if ti := p.localTask(wi, first, done, withdrawn); ti >= 0 {
				place(ti, wi, false)
			}
		}
		for _, ti := range p.order[first:] {
			if offered == 0 {
				break
			}
			if done[ti] {
				continue
			}
			if withdrawn[p.tasks[ti].ID] {
				done[ti] = true
				continue
			}
			chosen, off, reason := p.choose(ti)
			if chosen < 0 {
				reasons[ti] = reason
				continue
			}
			place(ti, chosen, off)
		}
		if !placedAny {
			break
		}
	}
	for _, ti := range p.order {
		t := &p.tasks[ti]
		if done[ti] || withdrawn[t.ID] {
			continue
		}
		reason := reasons[ti]
		if reason == "" {
			reason = "no idle slot"
		}
		p.plan.Waiting = append(p.plan.Waiting, Skip{Task: t.ID, Replica: t.Replica, Reason: reason})
	}
	return p.plan
}

// Locality bounds (see ScheduleRounds): how far from the head of the queue
// a task may be taken ahead of its turn for the data a worker holds, and
// how long the head may have waited for locality to still apply.
const (
	LocalityWindow  = 64
	LocalityMaxWait = 10 * time.Second
)

// localityWorkers returns the workers with an idle slot this round that
// hold data, in stability order; none without fairness off (a fairness
// strategy chooses workers its own way) or once the head of the queue has
// waited LocalityMaxWait.
func (p *planner) localityWorkers(left []int) []int {
	if p.cfg.Fairness != None || !p.anyHolds {
		return nil
	}
	var out []int
	for _, wi := range p.wOrder {
		if left[wi] > 0 && p.ws[wi].Idle > 0 && len(p.ws[wi].Holds) > 0 {
			out = append(out, wi)
		}
	}
	return out
}

// localTask returns the first task among the LocalityWindow undone ones
// from p.order[first:] whose data worker wi holds all of and that wi may
// take, or -1 (also when the oldest undone task has waited
// LocalityMaxWait). Tasks whose instances were withdrawn are skipped.
func (p *planner) localTask(wi, first int, done []bool, withdrawn map[string]bool) int {
	w := &p.ws[wi]
	seen := 0
	for _, ti := range p.order[first:] {
		if done[ti] || withdrawn[p.tasks[ti].ID] {
			continue
		}
		t := &p.tasks[ti]
		if seen == 0 && p.now.Sub(t.ReadySince) >= LocalityMaxWait {
			return -1
		}
		if seen++; seen > LocalityWindow {
			return -1
		}
		if len(t.Data) == 0 || !holdsAll(w.Holds, t.Data) {
			continue
		}
		if _, ok := p.holds[hold{t.ID, w.ID}]; ok {
			continue
		}
		if ok, _ := p.stab[wi].Fits(scaled(p.exps[ti], p.knowns[ti], w.Speed), t.Replica > 0, p.cfg.Stability); !ok {
			continue
		}
		return ti
	}
	return -1
}

// holdsAll reports whether every blob of data is in holds.
func holdsAll(holds map[string]bool, data []string) bool {
	for _, d := range data {
		if !holds[d] {
			return false
		}
	}
	return true
}

// planner is the state of one plan: the tasks in dispatch order, the
// workers classified, and which workers hold a replica of which task.
type planner struct {
	cfg    Config
	now    time.Time
	tasks  []Task
	ws     []Worker // a copy: Idle and Busy change as tasks are placed
	stab   []Stability
	groups [][]int
	exps   []time.Duration
	knowns []bool
	order  []int // indexes into tasks
	wOrder []int // indexes into ws, most stable first
	// holds has the workers that hold a replica of a task: one map for the
	// plan rather than one per task, which cost an allocation per task.
	holds map[hold]struct{}
	fits  []int // choose's scratch
	plan  Plan
	// anyHolds: some worker holds data (else no locality pass is needed).
	anyHolds bool
}

// hold is a worker holding a replica of a task.
type hold struct{ task, worker string }

func newPlanner(clock Clock, in Input, cfg Config) *planner {
	now := clock.Now()
	p := &planner{cfg: cfg, now: now, tasks: in.Ready, plan: Plan{Stability: make(map[string]Stability, len(in.Workers))}}
	p.ws = make([]Worker, len(in.Workers))
	copy(p.ws, in.Workers)
	ids := make([]string, len(p.ws))
	p.stab = make([]Stability, len(p.ws))
	for i, w := range p.ws {
		ids[i] = w.ID
		p.anyHolds = p.anyHolds || len(w.Holds) > 0
		if cfg.DeviceAware {
			p.stab[i] = Classify(now, w.Samples, w.History, cfg.Stability)
		} else {
			p.stab[i] = Stability{Class: VeryStable, TimeToEmpty: -1}
		}
		p.plan.Stability[w.ID] = p.stab[i]
	}
	p.groups = make([][]int, len(p.ws))
	if cfg.Fairness != None {
		for i := range p.ws {
			p.groups[i] = Group(ids, i, cfg.GroupSize)
		}
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
	tasks := p.tasks
	// Rank and expected run time once per task.
	ranks := make([]int, len(tasks))
	p.exps = make([]time.Duration, len(tasks))
	p.knowns = make([]bool, len(tasks))
	for i := range tasks {
		ranks[i] = rank(tasks[i])
		p.exps[i], p.knowns[i] = expected(tasks[i])
	}
	if cfg.LongestFirst {
		p.order = LongestFirst(len(tasks), func(i int) int { return ranks[i] }, func(i int) (time.Duration, bool) { return p.exps[i], p.knowns[i] }, in.Rand)
	} else {
		p.order = make([]int, len(tasks))
		for i := range p.order {
			p.order[i] = i
		}
		sort.SliceStable(p.order, func(a, b int) bool {
			ia, ib := p.order[a], p.order[b]
			if ra, rb := ranks[ia], ranks[ib]; ra != rb {
				return ra < rb
			}
			return tasks[ia].ReadySince.Before(tasks[ib].ReadySince)
		})
	}
	p.order = FairShare(p.order, func(i int) int64 { return tasks[i].Owner }, in.Running)
	// Workers in order of preference: most stable first, then input order
	// (the dispatcher passes them in a stable order, e.g. by id).
	p.wOrder = make([]int, len(p.ws))
	for i := range p.wOrder {
		p.wOrder[i] = i
	}
	sort.SliceStable(p.wOrder, func(a, b int) bool { return p.stab[p.wOrder[a]].Class < p.stab[p.wOrder[b]].Class })

	p.holds = make(map[hold]struct{}, len(tasks))
	for _, t := range tasks {
		for _, x := range t.Exclude {
			p.holds[hold{t.ID, x}] = struct{}{}
		}
	}
	return p
}

// perf is worker i's performance value f for the fairness strategies.
func (p *planner) perf(i int) float64 {
	w := p.ws[i]
	b, ch := -1.0, false
	if s := latest(p.now, w.Samples); s != nil {
		b, ch = s.Battery, s.Charging
	}
	return Performance(b, ch, w.Link, w.Busy, w.Slots, w.JobsDone, p.cfg.JobWeight, p.cfg.LoadWeight)
}

// choose picks the worker, among those with an idle slot, for task ti:
// chosen is -1, with the reason, when none may take it; off is set when the
// deadlock prevention let the task past the fairness strategy.
func (p *planner) choose(ti int) (chosen int, off bool, reason string) {
	cfg := p.cfg
	t := &p.tasks[ti]
	exp, known := p.exps[ti], p.knowns[ti]
	candidates := 0
	fits := p.fits[:0]
	reason = "no idle slot"
	for _, wi := range p.wOrder {
		w := &p.ws[wi]
		if w.Idle <= 0 {
			continue
		}
		if _, ok := p.holds[hold{t.ID, w.ID}]; ok {
			reason = "only workers holding a replica of this task are idle"
			continue
		}
		run := scaled(exp, known, w.Speed)
		if ok, why := p.stab[wi].Fits(run, t.Replica > 0, cfg.Stability); !ok {
			reason = why
			continue
		}
		fits = append(fits, wi)
		candidates++
	}
	chosen = -1
	if len(fits) > 0 {
		if cfg.Fairness == None {
			chosen = fits[0]
		} else {
			timeout := DeadlockTimeout(cfg.DeadlockPerCandidate, candidates)
			off = p.now.Sub(t.ReadySince) >= timeout
			// Among the workers of the most stable class that the
			// strategy lets take the task, the most able (highest f).
			bestF := 0.0
			for _, wi := range fits {
				if off {
					chosen = wi
					break
				}
				if chosen >= 0 && p.stab[wi].Class > p.stab[chosen].Class {
					break
				}
				nb := make([]float64, len(p.groups[wi]))
				for k, j := range p.groups[wi] {
					nb[k] = p.perf(j)
				}
				if f := p.perf(wi); !cfg.Fairness.Refrains(f, nb) && (chosen < 0 || f > bestF) {
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
	p.fits = fits[:0]
	return chosen, off, reason
}

// assign gives task ti to worker wi: one idle slot of it becomes busy.
func (p *planner) assign(ti, wi int, off bool) Assignment {
	t := &p.tasks[ti]
	w := &p.ws[wi]
	w.Idle--
	w.Busy++
	p.holds[hold{t.ID, w.ID}] = struct{}{}
	a := Assignment{Task: t.ID, Replica: t.Replica, Worker: w.ID, FairnessOff: off && p.cfg.Fairness != None}
	a.Alone, _ = p.stab[wi].Fits(scaled(p.exps[ti], p.knowns[ti], w.Speed), false, p.cfg.Stability)
	if p.knowns[ti] {
		a.Expected = scaled(p.exps[ti], true, w.Speed)
		if t.CheckpointCost > 0 {
			mu := FaultRate(w.History.Lost, w.History.Exposure, p.cfg.FaultPrior, p.cfg.FaultPriorExposure)
			a.Checkpoint = OptimalCheckpoints(mu, a.Expected, t.CheckpointCost, p.cfg.MaxCheckpoints)
		}
	}
	return a
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

// FairShare interleaves the owners of tasks so that they share the slots
// (max-min fairness, counted in attempts): order lists the tasks in the
// order of priority, each owner's k-th in it comes at turn running[owner]
// + k, and the result goes by turn, ties keeping order. So the owner with
// the fewest attempts running is served first, an owner's own tasks keep
// their order (priority, longest first), and a backlog holds back only its
// owner's later tasks. With one owner order comes back as it is.
func FairShare(order []int, owner func(i int) int64, running map[int64]int) []int {
	if len(order) < 2 {
		return order
	}
	turns := make([]int, len(order))
	seen := make(map[int64]int, 4)
	for pos, ti := range order {
		o := owner(ti)
		seen[o]++
		turns[pos] = running[o] + seen[o]
	}
	if len(seen) == 1 {
		return order
	}
	pos := make([]int, len(order))
	for i := range pos {
		pos[i] = i
	}
	sort.SliceStable(pos, func(a, b int) bool { return turns[pos[a]] < turns[pos[b]] })
	out := make([]int, len(order))
	for i, p := range pos {
		out[i] = order[p]
	}
	return out
}
