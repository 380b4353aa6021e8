package server

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

// maxSamples bounds the heartbeat history kept per connection for the
// stability classification.
const maxSamples = 200

// deviceSample turns a heartbeat's device state into a sched.Sample.
// Unknown fields count as the benign value (online, visible, no battery).
func deviceSample(at time.Time, d *protocol.Device) sched.Sample {
	s := sched.Sample{At: at, Battery: -1, Online: true}
	if d == nil {
		return s
	}
	if d.Battery != nil {
		s.Battery = *d.Battery
	}
	s.Charging = d.Charging == "yes"
	s.Online = d.Online != "no"
	s.Connection = d.Connection
	s.Hidden = d.Visibility == "hidden"
	return s
}

// addSample records a heartbeat's device state on c (hub.mu held). Samples
// closer than half a heartbeat interval to the previous one (a heartbeat
// sent early because the device changed) replace it, so that the jitter
// measures the regular heartbeats.
func (c *conn) addSample(s sched.Sample, heartbeat time.Duration) {
	if n := len(c.samples); n > 0 && s.At.Sub(c.samples[n-1].At) < heartbeat/2 {
		s.At = c.samples[n-1].At
		c.samples[n-1] = s
		return
	}
	if len(c.samples) >= maxSamples {
		c.samples = append(c.samples[:0], c.samples[len(c.samples)-maxSamples+1:]...)
	}
	c.samples = append(c.samples, s)
}

// runtimes is the in-memory copy of the run time averages (longest first,
// checkpoint optimum), refreshed from the database, and the measured cost
// of a checkpoint per module.
type runtimes struct {
	mu      sync.Mutex
	stats   *sched.RuntimeStats
	modules map[string]bool // modules seen among ready tasks, to load
	ckpt    map[string]time.Duration
}

func newRuntimes() *runtimes {
	return &runtimes{stats: &sched.RuntimeStats{}, modules: map[string]bool{}, ckpt: map[string]time.Duration{}}
}

// observeCheckpoint folds one checkpoint's cost into the module's moving
// average.
func (r *runtimes) observeCheckpoint(module string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.ckpt[module]; ok {
		d = (3*old + d) / 4
	}
	r.ckpt[module] = d
}

// refreshStats writes this replica's new run times and the dashboard's
// counts (tasks done, successes per worker), and reloads the averages of
// the modules recently seen, every few seconds.
func (s *Server) refreshStats(ctx context.Context) { every(ctx, 2*time.Second, s.refreshStatsOnce) }

// refreshStatsOnce is one run of refreshStats.
func (s *Server) refreshStatsOnce(ctx context.Context) {
	if _, err := s.store.FlushRuntimeStats(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("flush run times", "err", err)
	}
	if err := s.store.FlushTallies(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("write the dashboard's counts", "err", err)
	}
	s.rt.mu.Lock()
	mods := make([]string, 0, len(s.rt.modules))
	for m := range s.rt.modules {
		mods = append(mods, m)
	}
	clear(s.rt.modules)
	s.rt.mu.Unlock()
	if len(mods) == 0 {
		return
	}
	stats, err := s.store.RuntimeStats(ctx, mods)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("read run times", "err", err)
		}
		return
	}
	fresh := &sched.RuntimeStats{}
	for _, st := range stats {
		if st.Name != "" {
			fresh.Set(st.Module, st.Name, int(st.Runs), st.Mean)
		}
	}
	// The modules' averages cover their names without a row of their
	// own too: they replace those Set folded from the names.
	for _, st := range stats {
		if st.Name == "" {
			fresh.SetModule(st.Module, int(st.Runs), st.Mean)
		}
	}
	s.rt.mu.Lock()
	s.rt.stats = fresh
	s.rt.mu.Unlock()
}

// refreshRecords reloads the database records (reputation, attempts, lost
// attempts) of this replica's workers.
func (s *Server) refreshRecords(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	recs, err := s.store.Workers(ctx, ids)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			s.log.Warn("read worker records", "workers", len(ids), "err", err)
		}
		return
	}
	s.hub.setRecords(recs)
	// A record may allow more of a worker's slots (a reconnected worker
	// is held to one until its record is read: conn.allowed).
	s.wakeSlots()
}

// historyOf is what the classification knows of a worker's past.
func historyOf(r store.WorkerRecord) sched.History {
	return sched.History{Attempts: int(r.Attempts), Lost: int(r.TasksLost), Valid: int(r.ResultsValid), Invalid: int(r.ResultsInvalid)}
}

// efficiency computes a workflow's resource efficiency after Heymann et
// al. (useful work over the time its workers were held, a worker being held
// from the start of its first attempt of the workflow to the end of its
// last) and the suggested parallelism (Table 1) from the run time of each
// task's successful attempt. Both are nil until an attempt succeeded.
func efficiency(spans []store.AttemptSpan) (*float64, *int) {
	type span struct{ first, last time.Time }
	held := map[string]*span{}
	work := map[string]time.Duration{}
	runs := map[string]time.Duration{}
	for _, a := range spans {
		h := held[a.Worker]
		if h == nil {
			h = &span{a.Start, a.End}
			held[a.Worker] = h
		}
		if a.Start.Before(h.first) {
			h.first = a.Start
		}
		if a.End.After(h.last) {
			h.last = a.End
		}
		if a.Succeeded {
			work[a.Worker] += a.End.Sub(a.Start)
			runs[a.Task] = a.End.Sub(a.Start)
		}
	}
	if len(runs) == 0 {
		return nil, nil
	}
	var wt []sched.WorkerTime
	for w, h := range held {
		wt = append(wt, sched.WorkerTime{Work: work[w], Up: h.last.Sub(h.first)})
	}
	e := sched.Efficiency(wt)
	rs := make([]time.Duration, 0, len(runs))
	for _, d := range runs {
		rs = append(rs, d)
	}
	p := sched.ParallelismCap(rs)
	return &e, &p
}

// planInput is one dispatch round's view of this replica's reserved slots.
type planWorker struct {
	w    sched.Worker
	rep  sched.Reputation
	idle int
	// setup: the worker runs tasks with a setup (protocol.FeatureSetup).
	setup bool
}

// plan decides which ready task replicas go to which reserved slots, with
// the policies of internal/sched: stability classes, fairness, longest
// first, distinct workers for replicas, adaptive replication and the
// checkpoint optimum, and owners' fair share (running: the attempts
// running by owner). Workers offer one slot per round (sched.ScheduleRounds),
// so that work spreads over the workers as the slots of each allow.
func (d *dispatcher) plan(now time.Time, cands []store.Candidate, workers []planWorker, running map[int64]int) []store.Pick {
	d.rt.mu.Lock()
	stats := d.rt.stats
	for _, c := range cands {
		d.rt.modules[c.Module] = true
	}
	ckptCost := make(map[string]time.Duration, len(d.rt.ckpt))
	for m, d := range d.rt.ckpt {
		ckptCost[m] = d
	}
	d.rt.mu.Unlock()

	// Indexes, not Candidates: a value that large is kept out of the
	// map's table, in an allocation per entry.
	byID := make(map[string]int, len(cands))
	tasks := make([]sched.Task, 0, len(cands)) // a replica each, mostly
	// Workers that cannot lay out a task's setup (older builds) never get
	// a task that has one.
	var noSetup []string
	for _, w := range workers {
		if !w.setup {
			noSetup = append(noSetup, w.w.ID)
		}
	}
	for i, c := range cands {
		id := strconv.FormatInt(c.TaskID, 10)
		byID[id] = i
		prio := sched.Batch
		ready := c.ReadySince
		if c.Priority == "interactive" {
			prio = sched.Interactive
			ready = ready.Add(d.headStart())
		}
		// The average run time, looked up once rather than in every
		// round's Schedule (the same stats serve every round); 0 when
		// unknown, which Schedule looks up itself.
		est, _ := stats.Expected(c.Module, c.Name)
		exclude := c.Exclude
		if len(noSetup) > 0 && (c.Setup || d.needsSetup.has(c.TaskID)) {
			exclude = append(slices.Clone(c.Exclude), noSetup...)
		}
		for j := range c.Pending {
			r := j
			if c.Replicas > 1 {
				r += len(c.Exclude)
			}
			tasks = append(tasks, sched.Task{ID: id, Replica: r, Workflow: c.WorkflowID, Owner: c.Owner, Module: c.Module, Name: c.Name,
				Priority: prio, ReadySince: ready, CheckpointCost: ckptCost[c.Module], Exclude: slices.Clone(exclude),
				Estimate: est, Data: c.Blobs})
		}
	}
	ws := make([]sched.Worker, len(workers))
	for i := range workers {
		ws[i] = workers[i].w
		ws[i].Idle = workers[i].idle
		ws[i].Busy = ws[i].Slots - workers[i].idle
	}
	var picks []store.Pick
	started := map[string]bool{} // fresh replicated tasks given a first replica in this plan
	vcfg := d.cfg.Verify
	// One slot per worker and round (ScheduleRounds), so that work spreads
	// over the workers; a fresh replicated task that a trusted worker
	// starts alone has its other replicas withdrawn.
	sched.ScheduleRounds(sched.FixedClock(now), sched.Input{Ready: tasks, Workers: ws, Stats: stats, Rand: d.rng(), Running: running}, d.schedConfig(),
		func(a sched.Assignment) bool {
			c := &cands[byID[a.Task]]
			pk := store.Pick{TaskID: c.TaskID, Worker: a.Worker}
			if a.Checkpoint.Interval > 0 {
				pk.CkptMS = max(a.Checkpoint.Interval, time.Second).Milliseconds()
			}
			keep := true
			if c.Replicas > 1 && c.Fresh && !started[a.Task] {
				started[a.Task] = true
				// Alone only where the task alone may go: an unstable
				// worker takes long tasks only as one replica of several.
				vc := vcfg
				vc.Replicas = c.Replicas
				wi := slices.IndexFunc(workers, func(w planWorker) bool { return w.w.ID == a.Worker })
				if a.Alone && sched.InitialReplicas(vc, workers[wi].rep) == 1 {
					pk.Solo = true
					keep = false
				}
			}
			picks = append(picks, pk)
			return keep
		})
	return picks
}

// rng returns the random source that orders tasks of unknown run time.
func (d *dispatcher) rng() *rand.Rand {
	return rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
}

// schedConfig is the policy configuration of this server.
func (d *dispatcher) schedConfig() sched.Config {
	cfg := sched.DefaultConfig()
	cfg.Fairness = d.cfg.Fairness
	cfg.BatchAging = d.headStart()
	cfg.Stability.Heartbeat = d.cfg.Heartbeat
	return cfg
}

// planWorkers describes the workers of the reserved slots for plan, in id
// order, with their device history, record and idle slots.
func (d *dispatcher) planWorkers(reserved map[string][]*conn) []planWorker {
	ids := make([]string, 0, len(reserved))
	for id := range reserved {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	cs := make([]*conn, len(ids))
	for i, id := range ids {
		cs[i] = reserved[id][0]
	}
	states := d.hub.states(cs) // copies: the plan runs without the hub's lock
	out := make([]planWorker, 0, len(ids))
	for i, id := range ids {
		st := &states[i]
		rep := st.record.Reputation(d.cfg.Verify)
		out = append(out, planWorker{
			w: sched.Worker{ID: id, Slots: st.slots, Samples: st.samples, History: historyOf(st.record),
				Rep: rep, JobsDone: st.tasksDone, Link: -1, Holds: st.data},
			rep:   rep,
			idle:  len(reserved[id]),
			setup: st.setup,
		})
	}
	return out
}

// headStart is the store's interactive head start (5 minutes without a
// store, in tests).
func (d *dispatcher) headStart() time.Duration {
	if d.store == nil {
		return 5 * time.Minute
	}
	return d.store.InteractiveHeadStart()
}
