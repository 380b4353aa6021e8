package sim

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cyclepool/cyclepool/internal/sched"
)

// Job is one task of a simulated workload.
type Job struct {
	Name     string
	Module   string
	Work     time.Duration // run time on a worker of speed 1
	Deps     []int         // indexes of jobs that must finish first
	Priority sched.Priority
	Arrive   time.Duration // submission time
	Workflow int
}

// Node is one simulated worker.
type Node struct {
	ID    string
	Slots int
	Speed float64 // 0 counts as 1
	// Battery is the initial level (negative: mains power); it drains by
	// DrainPerSec per second of work.
	Battery     float64
	DrainPerSec float64
	// Link is the link quality in [0, 1] (0 counts as unknown).
	Link float64
	// Offline lists [from, to) periods when the node is gone; To = 0 means
	// for good. A node going offline loses the attempts it runs.
	Offline []Period
	// CrashDuringFirst makes the node leave for good at this fraction of
	// its first task (0 = never), as in Silva's Table 5.5.
	CrashDuringFirst float64
}

// Period is an interval of virtual time.
type Period struct{ From, To time.Duration }

// ClusterConfig is how the simulated platform behaves around the policies.
type ClusterConfig struct {
	Sched sched.Config
	// IdleCheck: a node that finished a task may take the next one only at
	// the next tick of its own idle checker of this period (Silva's
	// volunteer mode checker, 60 s); 0 = at once.
	IdleCheck time.Duration
	// StartDelay is added between assignment and start (Silva's 15 s
	// TRY_DEQUEUE window); 0 = none.
	StartDelay time.Duration
	// Detect returns when the loss of an attempt whose node vanished at
	// crash (attempt started at start) is noticed.
	Detect func(start, crash time.Duration) time.Duration
	// Requeue puts lost tasks back to ready (reactive fault tolerance);
	// false loses them (the paper's "no FT").
	Requeue bool
	// Retry is how soon the dispatcher runs again while tasks wait.
	Retry time.Duration
	// Limit stops the run at this virtual time.
	Limit time.Duration
}

// ClusterStats is what a cluster run measured.
type ClusterStats struct {
	Makespan   map[int]time.Duration // per workflow: last finish - first submission
	Waits      []time.Duration       // per started attempt: start - ready
	JobsDone   []int                 // per node
	Work       time.Duration         // all work executed, lost attempts included
	Useful     time.Duration         // work of finished attempts
	Finished   int
	Lost       int
	End        time.Duration
	Unfinished int
}

type jobState struct {
	Job
	left    int // unfinished dependencies
	ready   time.Time
	isReady bool
	done    bool
	exclude []string
}

type attempt struct {
	job   int
	node  int
	start time.Time
	gone  bool
}

type nodeState struct {
	Node
	busy      int
	online    bool
	available time.Time
	phase     time.Duration
	jobsDone  int
	started   int
	history   sched.History
}

// RunCluster simulates jobs on nodes with the production scheduler
// (sched.Schedule) and returns what it measured. rng drives the idle
// checker phases and the order of unknown tasks.
func RunCluster(jobs []Job, nodes []Node, cfg ClusterConfig, rng *rand.Rand) ClusterStats {
	eng := NewEngine()
	js := make([]*jobState, len(jobs))
	dependents := make([][]int, len(jobs))
	for i, j := range jobs {
		js[i] = &jobState{Job: j, left: len(j.Deps)}
		for _, d := range j.Deps {
			dependents[d] = append(dependents[d], i)
		}
	}
	ns := make([]*nodeState, len(nodes))
	for i, n := range nodes {
		ns[i] = &nodeState{Node: n, online: true, available: epoch}
		if ns[i].Slots == 0 {
			ns[i].Slots = 1
		}
		if cfg.IdleCheck > 0 {
			ns[i].phase = time.Duration(rng.Int64N(int64(cfg.IdleCheck)))
		}
	}
	st := ClusterStats{Makespan: map[int]time.Duration{}, JobsDone: make([]int, len(nodes))}
	var ready []int
	stats := &sched.RuntimeStats{}
	var running []*attempt
	drop := func(a *attempt) {
		for i, x := range running {
			if x == a {
				running = append(running[:i], running[i+1:]...)
				return
			}
		}
	}
	pending := false
	var dispatch func()
	kick := func() {
		if !pending {
			pending = true
			eng.After(0, dispatch)
		}
	}
	makeReady := func(i int) {
		js[i].isReady, js[i].ready = true, eng.Now()
		ready = append(ready, i)
		kick()
	}
	var finish func(a *attempt)
	lose := func(a *attempt) {
		if a.gone {
			return
		}
		a.gone = true
		drop(a)
		n := ns[a.node]
		n.busy--
		n.history.Attempts++
		n.history.Lost++
		st.Work += eng.Now().Sub(a.start)
		st.Lost++
		crash := eng.Elapsed()
		at := crash
		if cfg.Detect != nil {
			at = cfg.Detect(a.start.Sub(epoch), crash)
		}
		eng.At(at, func() {
			js[a.job].exclude = nil
			if cfg.Requeue {
				makeReady(a.job)
			}
		})
	}
	goOffline := func(i int, until time.Duration) {
		n := ns[i]
		if !n.online {
			return
		}
		n.online = false
		for _, a := range append([]*attempt(nil), running...) {
			if a.node == i {
				lose(a)
			}
		}
		if until > 0 {
			eng.At(until, func() { n.online = true; n.available = eng.Now(); kick() })
		}
	}
	finish = func(a *attempt) {
		if a.gone {
			return
		}
		a.gone = true
		drop(a)
		n := ns[a.node]
		n.busy--
		n.jobsDone++
		n.history.Attempts++
		d := eng.Now().Sub(a.start)
		n.history.Exposure += d
		st.Work += d
		st.Useful += d
		st.JobsDone[a.node]++
		j := js[a.job]
		stats.Observe(j.Module, j.Name, time.Duration(float64(d)*speed(n.Speed)))
		if n.Battery >= 0 {
			n.Battery -= n.DrainPerSec * d.Seconds()
		}
		j.done = true
		st.Finished++
		wf := j.Workflow
		if e := eng.Elapsed(); e > st.Makespan[wf] {
			st.Makespan[wf] = e
		}
		for _, k := range dependents[a.job] {
			js[k].left--
			if js[k].left == 0 && eng.Elapsed() >= js[k].Arrive {
				makeReady(k)
			}
		}
		if cfg.IdleCheck > 0 {
			// next tick of this node's idle checker
			e := eng.Elapsed() - n.phase
			k := e/cfg.IdleCheck + 1
			n.available = epoch.Add(n.phase + k*cfg.IdleCheck)
			eng.AtTime(n.available, kick)
		} else {
			n.available = eng.Now()
		}
		st.End = eng.Elapsed()
		kick()
	}
	dispatch = func() {
		pending = false
		if len(ready) == 0 {
			return
		}
		in := sched.Input{Stats: stats, Rand: rng}
		for _, i := range ready {
			j := js[i]
			in.Ready = append(in.Ready, sched.Task{ID: fmt.Sprint(i), Module: j.Module, Name: j.Name, Priority: j.Priority, ReadySince: j.ready, Exclude: j.exclude})
		}
		idx := map[string]int{}
		now := eng.Now()
		for i, n := range ns {
			if !n.online {
				continue
			}
			w := sched.Worker{ID: n.ID, Slots: n.Slots, Busy: n.busy, JobsDone: n.jobsDone, History: n.history, Speed: n.Speed, Link: link(n.Link)}
			if !n.available.After(now) {
				w.Idle = n.Slots - n.busy
			}
			w.Samples = []sched.Sample{{At: now, Battery: n.Battery, Online: true, Connection: "ethernet"}}
			in.Workers = append(in.Workers, w)
			idx[n.ID] = i
		}
		p := sched.Schedule(eng, in, cfg.Sched)
		taken := map[int]bool{}
		for _, a := range p.Assignments {
			var ji int
			fmt.Sscan(a.Task, &ji)
			ni := idx[a.Worker]
			n := ns[ni]
			n.busy++
			taken[ji] = true
			j := js[ji]
			j.isReady = false
			j.exclude = append(j.exclude, n.ID)
			at := &attempt{job: ji, node: ni}
			start := now.Add(cfg.StartDelay)
			eng.AtTime(start, func() {
				if at.gone {
					return
				}
				at.start = eng.Now()
				if !n.online { // vanished during the start delay
					running = append(running, at)
					lose(at)
					return
				}
				st.Waits = append(st.Waits, eng.Now().Sub(j.ready))
				running = append(running, at)
				n.started++
				run := time.Duration(float64(j.Work) / speed(n.Speed))
				if n.started == 1 && n.CrashDuringFirst > 0 {
					eng.After(time.Duration(float64(run)*n.CrashDuringFirst), func() { goOffline(ni, 0) })
				}
				eng.After(run, func() { finish(at) })
			})
		}
		if len(taken) > 0 {
			rest := ready[:0]
			for _, i := range ready {
				if !taken[i] {
					rest = append(rest, i)
				}
			}
			ready = rest
		}
		if len(ready) > 0 && cfg.Retry > 0 {
			eng.After(cfg.Retry, kick)
		}
	}
	for i := range js {
		i := i
		eng.At(js[i].Arrive, func() {
			if js[i].left == 0 && !js[i].done && !js[i].isReady {
				makeReady(i)
			}
		})
	}
	for i, n := range ns {
		for _, p := range n.Offline {
			i, p := i, p
			eng.At(p.From, func() { goOffline(i, p.To) })
		}
	}
	limit := cfg.Limit
	if limit == 0 {
		limit = 1000 * time.Hour
	}
	eng.Run(limit)
	first := map[int]time.Duration{}
	for _, j := range js {
		if f, ok := first[j.Workflow]; !ok || j.Arrive < f {
			first[j.Workflow] = j.Arrive
		}
		if !j.done {
			st.Unfinished++
		}
	}
	for wf, end := range st.Makespan {
		st.Makespan[wf] = end - first[wf]
	}
	return st
}

func link(l float64) float64 {
	if l <= 0 {
		return -1
	}
	return l
}

func speed(s float64) float64 {
	if s <= 0 {
		return 1
	}
	return s
}
