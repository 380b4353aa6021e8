package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/cyclepool/cyclepool/internal/sched"
)

// Row is one line of a scenario's table: a value per column of the
// Result (nil where there is none, e.g. no figure in the paper).
type Row struct {
	Table  string     `json:"table"`
	Case   string     `json:"case"`
	X      string     `json:"x"`
	Values []*float64 `json:"values"`
}

// Series is one line of a plot.
type Series struct {
	Name   string    `json:"name"`
	Dashed bool      `json:"dashed,omitempty"` // the paper's figures are dashed
	X      []float64 `json:"x"`
	Y      []float64 `json:"y"`
}

// Plot is what a scenario draws (see SVG).
type Plot struct {
	Title  string   `json:"title"`
	XLabel string   `json:"x_label"`
	YLabel string   `json:"y_label"`
	Series []Series `json:"series"`
}

// Result is the outcome of one scenario run.
type Result struct {
	Scenario string         `json:"scenario"`
	Title    string         `json:"title"`
	Seed     uint64         `json:"seed"`
	Params   map[string]any `json:"params"`
	Columns  []string       `json:"columns"`
	Rows     []Row          `json:"rows"`
	Plot     Plot           `json:"plot"`
	Notes    []string       `json:"notes,omitempty"`
}

// Scenario is a named, reproducible experiment.
type Scenario struct {
	Name    string
	Summary string
	Run     func(seed uint64) Result
}

// Scenarios lists every scenario in the order `cyclepool sim --list`
// prints them.
func Scenarios() []Scenario {
	return []Scenario{
		{"silva-makespan", "Silva Tables 5.3/5.4: makespan and waiting time vs nodes (1-9), 5/10/15 workflows of 4 two-minute tasks", SilvaMakespan},
		{"silva-failures", "Silva Table 5.5: 10 workflows on 9 nodes, 0/2/5/8 nodes failing during their first task", SilvaFailures},
		{"hummel-fairness", "Hummel/Meyer Table 1: variance of jobs per worker for each fairness strategy, 20 workers, 60 jobs", HummelFairness},
		{"workrs-checkpoints", "Workrs Fig. 9/11: 300 s job, mu=0.003, 6 s checkpoints, 0/5/15 checkpoints and the optimum", WorkrsCheckpoints},
		{"doall-crashes", "Do-All (Miu): total work / m for m tasks, p workers, f crashes", DoAllCrashes},
	}
}

// Lookup finds a scenario by name.
func Lookup(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

func v(x float64) *float64 { return &x }

func newRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15^stream))
}

func mean(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	var s float64
	for _, d := range ds {
		s += d.Minutes()
	}
	return s / float64(len(ds))
}

// silvaJobs builds w workflows of Silva's Fig. 5.1 (import -> georeferencing
// -> segmentation -> anomaly detection, segmentation also reading import),
// each task exactly 2 minutes, priorities uniform in {low, interactive}.
func silvaJobs(w int, rng *rand.Rand) []Job {
	var jobs []Job
	names := []string{"import", "georeferencing", "segmentation", "anomaly_detection"}
	deps := [][]int{nil, {0}, {0, 1}, {2}}
	for k := 0; k < w; k++ {
		base := len(jobs)
		for i, n := range names {
			p := sched.Batch
			if rng.IntN(2) == 1 {
				p = sched.Interactive
			}
			var d []int
			for _, x := range deps[i] {
				d = append(d, base+x)
			}
			jobs = append(jobs, Job{Name: n, Module: n, Work: 2 * time.Minute, Deps: d, Priority: p, Workflow: k})
		}
	}
	return jobs
}

func silvaConfig(paperDelays bool) ClusterConfig {
	c := sched.DefaultConfig()
	c.BatchAging = 0 // Silva: interactive first, FCFS within a priority
	cfg := ClusterConfig{Sched: c, Requeue: true}
	if paperDelays {
		cfg.IdleCheck = 60 * time.Second
		cfg.StartDelay = 15 * time.Second
	}
	return cfg
}

// silvaDetect is Silva's failure detector: progress every 15 s, a checker
// every 60 s that declares a task failed when its progress is older than
// 60 s (the thesis does not state the limit; we use one checker period).
func silvaDetect(phase time.Duration) func(start, crash time.Duration) time.Duration {
	return func(start, crash time.Duration) time.Duration {
		last := start + (crash-start)/(15*time.Second)*(15*time.Second)
		t := phase
		for t <= crash || t-last <= 60*time.Second {
			t += 60 * time.Second
		}
		return t
	}
}

// cyclepoolDetect is the server's lease: heartbeats every 3 s renew a 15 s
// lease (server defaults).
func cyclepoolDetect(start, crash time.Duration) time.Duration {
	last := start + (crash-start)/(3*time.Second)*(3*time.Second)
	return last + 15*time.Second
}

const silvaRuns = 10

var silvaMakespan = map[int][]float64{
	5:  {52.03, 18.76, 14.79, 12.76, 11.63, 10.00, 9.59, 9.55, 9.23},
	10: {100.76, 44.19, 26.34, 20.97, 19.30, 16.57, 15.10, 13.50, 13.16},
	15: {149.75, 54.37, 45.06, 35.31, 28.12, 24.18, 20.76, 18.68, 18.08},
}

var silvaWait = map[int][]float64{
	5:  {11.01, 2.79, 1.80, 1.29, 1.01, 0.63, 0.54, 0.53, 0.44},
	10: {23.19, 9.05, 4.57, 3.23, 2.81, 2.13, 1.77, 1.39, 1.31},
	15: {35.44, 11.71, 9.27, 6.83, 5.04, 4.05, 3.20, 2.68, 2.53},
}

func nodesN(n int) []Node {
	ns := make([]Node, n)
	for i := range ns {
		ns[i] = Node{ID: fmt.Sprintf("n%02d", i), Slots: 1, Battery: -1}
	}
	return ns
}

func avgMakespan(st ClusterStats) float64 {
	var s float64
	for wf := 0; wf < len(st.Makespan); wf++ {
		s += st.Makespan[wf].Minutes()
	}
	return s / float64(len(st.Makespan))
}

// SilvaMakespan reproduces Silva's Tables 5.3 and 5.4.
func SilvaMakespan(seed uint64) Result {
	r := Result{
		Scenario: "silva-makespan", Title: "Silva Tables 5.3/5.4: average makespan of a workflow and waiting time of a task (minutes)", Seed: seed,
		Params:  map[string]any{"nodes": "1..9", "workflows": []int{5, 10, 15}, "tasks_per_workflow": 4, "task_minutes": 2, "idle_check_s": 60, "dequeue_window_s": 15, "runs_averaged": silvaRuns},
		Columns: []string{"ours, Silva's delays", "ours, cyclepool dispatch", "paper"},
		Plot:    Plot{Title: "Silva Table 5.3: average workflow makespan vs nodes", XLabel: "server nodes", YLabel: "makespan (min)"},
	}
	for _, w := range []int{5, 10, 15} {
		var ours, paper Series
		ours.Name, paper.Name, paper.Dashed = fmt.Sprintf("ours, %d workflows", w), fmt.Sprintf("paper, %d workflows", w), true
		for n := 1; n <= 9; n++ {
			var mk, wt [2]float64
			for run := 0; run < silvaRuns; run++ {
				for mode := 0; mode < 2; mode++ {
					jobs := silvaJobs(w, newRand(seed, uint64(1000*w+run))) // same priorities for every node count
					st := RunCluster(jobs, nodesN(n), silvaConfig(mode == 0), newRand(seed, uint64(100000+1000*w+10*n+run)))
					mk[mode] += avgMakespan(st) / silvaRuns
					wt[mode] += mean(st.Waits) / silvaRuns
				}
			}
			x := fmt.Sprintf("%d nodes", n)
			c := fmt.Sprintf("%d workflows", w)
			r.Rows = append(r.Rows, Row{"5.3 makespan", c, x, []*float64{v(mk[0]), v(mk[1]), v(silvaMakespan[w][n-1])}})
			r.Rows = append(r.Rows, Row{"5.4 waiting", c, x, []*float64{v(wt[0]), v(wt[1]), v(silvaWait[w][n-1])}})
			ours.X, ours.Y = append(ours.X, float64(n)), append(ours.Y, mk[0])
			paper.X, paper.Y = append(paper.X, float64(n)), append(paper.Y, silvaMakespan[w][n-1])
		}
		r.Plot.Series = append(r.Plot.Series, ours, paper)
	}
	sortRows(r.Rows)
	return r
}

func sortRows(rows []Row) {
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Table < rows[j].Table })
}

// SilvaFailures reproduces Silva's Table 5.5.
func SilvaFailures(seed uint64) Result {
	r := Result{
		Scenario: "silva-failures", Title: "Silva Table 5.5: 10 workflows, 9 nodes, some failing during their first task (minutes)", Seed: seed,
		Params:  map[string]any{"nodes": 9, "workflows": 10, "failed": []int{8, 5, 2, 0}, "progress_s": 15, "detector_s": 60, "lease_s": 15, "runs_averaged": silvaRuns},
		Columns: []string{"ours, Silva's delays", "ours, cyclepool dispatch", "paper"},
		Plot:    Plot{Title: "Silva Table 5.5: makespan vs failed nodes (of 9)", XLabel: "failed nodes", YLabel: "makespan (min)"},
	}
	paper := map[int][2]float64{8: {19.77, 89.14}, 5: {3.35, 22.81}, 2: {1.83, 15.88}, 0: {1.31, 13.16}}
	var ours, cp, pap Series
	ours.Name, cp.Name, pap.Name, pap.Dashed = "ours, Silva's delays", "ours, cyclepool dispatch", "paper", true
	for _, f := range []int{0, 2, 5, 8} {
		var mk, wt [2]float64
		for run := 0; run < silvaRuns; run++ {
			for mode := 0; mode < 2; mode++ {
				rng := newRand(seed, uint64(7000+100*f+run))
				jobs := silvaJobs(10, newRand(seed, uint64(1000*10+run)))
				ns := nodesN(9)
				for _, i := range rng.Perm(9)[:f] {
					ns[i].CrashDuringFirst = 0.05 + 0.9*rng.Float64()
				}
				cfg := silvaConfig(mode == 0)
				if mode == 0 {
					cfg.Detect = silvaDetect(time.Duration(rng.Int64N(int64(60 * time.Second))))
				} else {
					cfg.Detect = cyclepoolDetect
				}
				st := RunCluster(jobs, ns, cfg, rng)
				mk[mode] += avgMakespan(st) / silvaRuns
				wt[mode] += mean(st.Waits) / silvaRuns
			}
		}
		x := fmt.Sprintf("%d of 9 failed", f)
		r.Rows = append(r.Rows, Row{"5.5 makespan", "10 workflows", x, []*float64{v(mk[0]), v(mk[1]), v(paper[f][1])}})
		r.Rows = append(r.Rows, Row{"5.5 waiting", "10 workflows", x, []*float64{v(wt[0]), v(wt[1]), v(paper[f][0])}})
		ours.X, ours.Y = append(ours.X, float64(f)), append(ours.Y, mk[0])
		cp.X, cp.Y = append(cp.X, float64(f)), append(cp.Y, mk[1])
		pap.X, pap.Y = append(pap.X, float64(f)), append(pap.Y, paper[f][1])
	}
	r.Plot.Series = []Series{ours, cp, pap}
	sortRows(r.Rows)
	return r
}

// hummelTable1 is the paper's Table 1 (variance), columns no error, no FT,
// reactive FT.
var hummelTable1 = map[sched.Strategy][3]float64{
	sched.None:                     {85.26, 17.64, 61.57},
	sched.NotBest:                  {0, 0.11, 0.11},
	sched.Worst:                    {36.42, 28.42, 38.11},
	sched.WorseThanAverage:         {0, 0.11, 0.11},
	sched.WorseThanMajority:        {0.32, 0.32, 0.32},
	sched.EqualOrWorseThanMajority: {0.73, 3.16, 3.16},
}

// hummelRun runs the paper's fairness experiment: 20 workers, 60 jobs of
// 116.632 s submitted one per 110 s, group size n, deadlock prevention after
// 10 s per candidate; fault 0 = no error, 1 = no FT, 2 = reactive FT.
func hummelRun(seed uint64, s sched.Strategy, n int, fault int, mostAble bool) ClusterStats {
	var jobs []Job
	for i := 0; i < 60; i++ {
		jobs = append(jobs, Job{Name: "rc5", Module: "rc5", Work: 116632 * time.Millisecond, Arrive: time.Duration(i) * 110 * time.Second, Priority: sched.Batch, Workflow: i})
	}
	ns := make([]Node, 20)
	lrng := newRand(seed, 31337)
	for i := range ns {
		// Linear capacity loss while working: one job costs 1% of the
		// battery. The link quality differs a little from node to node
		// (less than one job's drain), so that f values do not tie exactly.
		ns[i] = Node{ID: fmt.Sprintf("w%02d", i), Slots: 1, Battery: 1, DrainPerSec: 0.01 / 116.632, Link: 1 - 0.001*lrng.Float64()}
	}
	if fault > 0 {
		// The paper's timeline: offline after 100 s, back after 900 s,
		// offline again after 3080 s. We fault the node the baseline loads
		// first.
		ns[0].Offline = []Period{{100 * time.Second, 900 * time.Second}, {3080 * time.Second, 0}}
	}
	c := sched.DefaultConfig()
	c.Fairness, c.GroupSize, c.DeviceAware, c.BatchAging, c.MostAble = s, n, false, 0, mostAble
	cfg := ClusterConfig{Sched: c, Requeue: fault != 1, Detect: cyclepoolDetect, Retry: time.Second, Limit: 8000 * time.Second}
	return RunCluster(jobs, ns, cfg, newRand(seed, uint64(s)*100+uint64(n)))
}

// HummelFairness reproduces Hummel and Meyer's Table 1 (and Fig. 2 as the
// plot).
func HummelFairness(seed uint64) Result {
	r := Result{
		Scenario: "hummel-fairness", Title: "Hummel/Meyer Table 1: variance of jobs per worker (group size 10)", Seed: seed,
		Params:  map[string]any{"workers": 20, "jobs": 60, "job_s": 116.632, "interval_s": 110, "group_size": 10, "deadlock_per_candidate_s": 10, "fault_timeline_s": "offline 100-900, offline from 3080", "period_s": 8000},
		Columns: []string{"ours (first pick)", "paper", "ours (most-able pick)", "jobs finished (first pick)"},
		Plot:    Plot{Title: "Hummel/Meyer Fig. 2 setting: variance vs group size (no error)", XLabel: "group size n (first pick)", YLabel: "variance of jobs per worker"},
	}
	cases := []string{"no error", "no FT", "reactive FT"}
	for _, s := range sched.Strategies() {
		for f, c := range cases {
			st := hummelRun(seed, s, 10, f, false)
			ma := hummelRun(seed, s, 10, f, true)
			r.Rows = append(r.Rows, Row{"Table 1", c, s.String(), []*float64{v(sched.Variance(st.JobsDone)), v(hummelTable1[s][f]), v(sched.Variance(ma.JobsDone)), v(float64(st.Finished))}})
		}
		ser := Series{Name: s.String()}
		for n := 2; n <= 20; n += 2 {
			ser.X = append(ser.X, float64(n))
			ser.Y = append(ser.Y, sched.Variance(hummelRun(seed, s, n, 0, false).JobsDone))
		}
		r.Plot.Series = append(r.Plot.Series, ser)
	}
	sort.SliceStable(r.Rows, func(i, j int) bool { return r.Rows[i].Case < r.Rows[j].Case })
	r.Notes = append(r.Notes, "paper column 'reactive FT' is the paper's; its 'proactive FT' column (redundant execution) is not simulated")
	return r
}

// WorkrsCheckpoints reproduces Workrs Fig. 9 and Fig. 11 by Monte Carlo,
// beside the closed form of the paper's Eq. (1).
func WorkrsCheckpoints(seed uint64) Result {
	const mu, T, C = 0.003, 300.0, 6.0
	const runs = 20000
	r := Result{
		Scenario: "workrs-checkpoints", Title: "Workrs Fig. 9/11: expected execution time (s) of a 300 s job", Seed: seed,
		Params:  map[string]any{"T_s": T, "mu_per_s": mu, "C_s": C, "runs": runs},
		Columns: []string{"ours (simulated mean)", "Eq. 1 (paper's model)"},
		Plot:    Plot{Title: "Workrs: execution time vs checkpoints (T=300 s, mu=0.003, C=6 s)", XLabel: "checkpoints (N-1)", YLabel: "execution time (s)"},
	}
	rng := newRand(seed, 42)
	simulate := func(n int, mu float64, runs int) float64 {
		seg := T / float64(n)
		var total float64
		for k := 0; k < runs; k++ {
			t := 0.0
			for i := 0; i < n; i++ {
				for {
					x := math.Inf(1)
					if mu > 0 {
						x = rng.ExpFloat64() / mu
					}
					if x >= seg {
						t += seg
						break
					}
					t += x // work lost, restart the segment from the checkpoint
				}
				if i < n-1 {
					t += C
				}
			}
			total += t
		}
		return total / float64(runs)
	}
	// Fig. 9: no faults, 15 checkpoints cost about 90 s.
	r.Rows = append(r.Rows, Row{"Fig. 9 (no faults)", "0 checkpoints", "", []*float64{v(simulate(1, 0, 1)), v(sched.ExpectedTimeCheckpointed(0, T, 1, C))}})
	r.Rows = append(r.Rows, Row{"Fig. 9 (no faults)", "15 checkpoints", "paper: ~390 s", []*float64{v(simulate(16, 0, 1)), v(sched.ExpectedTimeCheckpointed(0, T, 16, C))}})
	// The optimum the dispatcher would choose, from a fault rate estimated
	// on a simulated 10-hour history of the worker.
	exposure := 10 * time.Hour
	faults := 0
	for t := rng.ExpFloat64() / mu; t < exposure.Seconds(); t += rng.ExpFloat64() / mu {
		faults++
	}
	muHat := sched.FaultRate(faults, exposure, 0, 0)
	plan := sched.OptimalCheckpoints(muHat, 300*time.Second, 6*time.Second, 0)
	exact := sched.OptimalCheckpoints(mu, 300*time.Second, 6*time.Second, 0)
	for _, k := range []int{0, 5, 15, exact.Checkpoints} {
		label := fmt.Sprintf("%d checkpoints", k)
		x := fmt.Sprintf("every %.1f s", T/float64(k+1))
		if k == exact.Checkpoints {
			label = fmt.Sprintf("optimum: %d checkpoints", k)
		}
		r.Rows = append(r.Rows, Row{"Fig. 11 (mu=0.003)", label, x, []*float64{v(simulate(k+1, mu, runs)), v(sched.ExpectedTimeCheckpointed(mu, T, k+1, C))}})
	}
	r.Notes = append(r.Notes,
		fmt.Sprintf("closed form N* = %.3f segments (real), integer optimum %d segments = %d checkpoints every %s", sched.OptimalSegmentsReal(mu, T, C), exact.Segments, exact.Checkpoints, exact.Interval),
		fmt.Sprintf("from an estimated mu = %.5f (%d faults in %s) the dispatcher plans %d checkpoints every %s", muHat, faults, exposure, plan.Checkpoints, plan.Interval.Round(100*time.Millisecond)),
		"the paper reports '5 checkpoints (one every 50 s)' as best; its Listing 1 returns N = 5 segments, i.e. 4 checkpoints every 60 s: the two differ by 1 s in Eq. 1")
	var simS, eqS Series
	simS.Name, eqS.Name, eqS.Dashed = "ours (simulated)", "Eq. 1", true
	for k := 0; k <= 20; k++ {
		simS.X, simS.Y = append(simS.X, float64(k)), append(simS.Y, simulate(k+1, mu, 4000))
		eqS.X, eqS.Y = append(eqS.X, float64(k)), append(eqS.Y, sched.ExpectedTimeCheckpointed(mu, T, k+1, C))
	}
	r.Plot.Series = []Series{simS, eqS}
	return r
}

// DoAllCrashes runs m unit tasks on p workers of which f crash for good at
// random times during the run, with cyclepool's lease-based reassignment,
// and reports the total work executed (lost partial work included) over m.
func DoAllCrashes(seed uint64) Result {
	const unit = time.Minute
	r := Result{
		Scenario: "doall-crashes", Title: "Do-All under crashes: total work executed / m", Seed: seed,
		Params:  map[string]any{"task": "1 minute", "lease_s": 15, "crash_times": "uniform over the crash-free run time"},
		Columns: []string{"ours (work/m)", "paper lower bound (work >= m)", "paper AN bound / m (constant 1)"},
		Plot:    Plot{Title: "Do-All: total work / m vs crashed workers", XLabel: "crashed fraction f/p", YLabel: "work / m"},
	}
	for _, mp := range [][2]int{{100, 10}, {1000, 10}, {1000, 100}} {
		m, p := mp[0], mp[1]
		ser := Series{Name: fmt.Sprintf("m=%d p=%d", m, p)}
		for _, f := range []int{0, p / 4, p / 2, p - 1} {
			rng := newRand(seed, uint64(m*1000+p*10+f))
			jobs := make([]Job, m)
			for i := range jobs {
				jobs[i] = Job{Name: "t", Module: "doall", Work: unit, Priority: sched.Batch, Workflow: 0}
			}
			ns := nodesN(p)
			span := time.Duration(math.Ceil(float64(m)/float64(p))) * unit
			for _, i := range rng.Perm(p)[:f] {
				ns[i].Offline = []Period{{time.Duration(rng.Int64N(int64(span))), 0}}
			}
			c := sched.DefaultConfig()
			c.DeviceAware = false
			st := RunCluster(jobs, ns, ClusterConfig{Sched: c, Requeue: true, Detect: cyclepoolDetect}, rng)
			ratio := st.Work.Seconds() / (float64(m) * unit.Seconds())
			lp := math.Log2(float64(p))
			an := (float64(m)*lp + float64(p)*lp*lp/math.Max(1, math.Log2(lp))) / float64(m)
			r.Rows = append(r.Rows, Row{"work/m", fmt.Sprintf("m=%d p=%d", m, p), fmt.Sprintf("f=%d", f), []*float64{v(ratio), v(1), v(an)}})
			ser.X, ser.Y = append(ser.X, float64(f)/float64(p)), append(ser.Y, ratio)
		}
		r.Plot.Series = append(r.Plot.Series, ser)
	}
	return r
}
