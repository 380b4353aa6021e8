package sched

import (
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// RuntimeStats keeps the running average run time per module and per
// (module, task name), across iterations and workflows, for the "Random and
// Average" policy of Heymann et al. It is a plain value: the dispatcher
// loads it from the database (or keeps it in memory) and the simulator
// updates it as tasks finish. The zero value is empty and ready to use.
type RuntimeStats struct {
	byModule map[string]*avg
	byName   map[[2]string]*avg
}

type avg struct {
	n    int
	mean float64 // seconds
}

// Observe adds one finished run of the task name of module.
func (s *RuntimeStats) Observe(module, name string, run time.Duration) {
	if s.byModule == nil {
		s.byModule = map[string]*avg{}
		s.byName = map[[2]string]*avg{}
	}
	add := func(a *avg) {
		a.n++
		a.mean += (run.Seconds() - a.mean) / float64(a.n)
	}
	m := s.byModule[module]
	if m == nil {
		m = &avg{}
		s.byModule[module] = m
	}
	add(m)
	k := [2]string{module, name}
	t := s.byName[k]
	if t == nil {
		t = &avg{}
		s.byName[k] = t
	}
	add(t)
}

// Set installs a known average (n runs averaging mean) for a task name, as
// the dispatcher does when it loads the averages kept in the database.
func (s *RuntimeStats) Set(module, name string, n int, mean time.Duration) {
	if n <= 0 {
		return
	}
	if s.byModule == nil {
		s.byModule = map[string]*avg{}
		s.byName = map[[2]string]*avg{}
	}
	s.byName[[2]string{module, name}] = &avg{n: n, mean: mean.Seconds()}
	m := s.byModule[module]
	if m == nil {
		m = &avg{}
		s.byModule[module] = m
	}
	m.mean = (m.mean*float64(m.n) + mean.Seconds()*float64(n)) / float64(m.n+n)
	m.n += n
}

// SetModule installs a known average (n runs averaging mean) over all the
// task names of module, in place of the one Set and Observe computed from
// the names they were given.
func (s *RuntimeStats) SetModule(module string, n int, mean time.Duration) {
	if n <= 0 {
		return
	}
	if s.byModule == nil {
		s.byModule = map[string]*avg{}
		s.byName = map[[2]string]*avg{}
	}
	s.byModule[module] = &avg{n: n, mean: mean.Seconds()}
}

// Expected returns the expected run time of the task name of module: its own
// average when known, else the module's, else ok is false.
func (s *RuntimeStats) Expected(module, name string) (time.Duration, bool) {
	if s == nil || s.byModule == nil {
		return 0, false
	}
	if t := s.byName[[2]string{module, name}]; t != nil && t.n > 0 {
		return secs(t.mean), true
	}
	if m := s.byModule[module]; m != nil && m.n > 0 {
		return secs(m.mean), true
	}
	return 0, false
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// LongestFirst orders the tasks of equal priority rank by decreasing expected
// run time. expected returns a task's expected run time and whether it is
// known. Tasks with unknown run time come first within their rank, in
// random order (rng; nil keeps their given order), so that their averages
// become known; ties between known times keep the given order (oldest
// first). It returns the permutation (indexes into n tasks).
func LongestFirst(n int, rank func(i int) int, expected func(i int) (time.Duration, bool), rng *rand.Rand) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	key := make([]float64, n)
	for i := range key {
		if d, ok := expected(i); ok {
			key[i] = d.Seconds()
		} else {
			key[i] = math.Inf(1)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ra, rb := rank(idx[a]), rank(idx[b])
		if ra != rb {
			return ra < rb
		}
		return key[idx[a]] > key[idx[b]]
	})
	// Shuffle each run of unknown tasks of one rank; known ties keep their
	// given (oldest first) order.
	if rng != nil {
		for i := 0; i < n; {
			j := i
			for j < n && math.IsInf(key[idx[j]], 1) && rank(idx[j]) == rank(idx[i]) {
				j++
			}
			if j-i > 1 {
				run := idx[i:j]
				rng.Shuffle(len(run), func(a, b int) { run[a], run[b] = run[b], run[a] })
			}
			if j == i {
				j++
			}
			i = j
		}
	}
	return idx
}

// WorkerTime is one worker's account for the efficiency of a workflow.
type WorkerTime struct {
	Work      time.Duration // time spent doing useful work
	Up        time.Duration // time from the worker's start to its end
	Suspended time.Duration // time it could not work
}

// Efficiency is Heymann et al.'s resource efficiency
// E = sum(Twork) / (sum(Tup) - sum(Tsusp)), in [0, 1]; 0 when nothing was up.
func Efficiency(ws []WorkerTime) float64 {
	var work, avail time.Duration
	for _, w := range ws {
		work += w.Work
		avail += w.Up - w.Suspended
	}
	if avail <= 0 {
		return 0
	}
	return math.Min(1, float64(work)/float64(avail))
}

// Workload describes the run times of one iteration's tasks as Table 1 of
// Heymann et al. needs them: the share of the total work done by the
// largest 20% tasks, and whether those largest tasks are similar (their
// run times differ by at most 20%).
func Workload(runs []time.Duration) (share float64, similar bool) {
	n := len(runs)
	if n == 0 {
		return 0, true
	}
	s := append([]time.Duration(nil), runs...)
	sort.Slice(s, func(i, j int) bool { return s[i] > s[j] })
	k := int(math.Ceil(0.2 * float64(n)))
	var top, all time.Duration
	for i, d := range s {
		all += d
		if i < k {
			top += d
		}
	}
	if all <= 0 {
		return 0, true
	}
	share = float64(top) / float64(all)
	largest, smallest := s[0], s[k-1]
	similar = largest <= 0 || float64(largest-smallest) <= 0.2*float64(largest)
	return share, similar
}

// table1 is Heymann et al.'s Table 1: the percentage of workers, with
// respect to the number of tasks, for efficiency above 80% and execution
// time within 1.1 of the time with one worker per task. Columns: workload
// <30%, 30%, 40%, ..., 90%. A value of 100 is "Ntask".
var table1 = [2][8]int{
	{100, 70, 55, 45, 40, 35, 30, 25}, // largest tasks of similar size
	{60, 45, 35, 30, 25, 20, 20, 20},  // largest tasks of different size
}

// WorkerShare looks up Table 1: the fraction of the number of tasks to use as
// workers for a workload share (work done by the largest 20% tasks) and
// whether the largest tasks are similar. A share falls in the column of the
// 10% below it (e.g. 0.47 reads the 40% column).
func WorkerShare(share float64, similar bool) float64 {
	col := 0
	if share >= 0.30 {
		col = int(math.Floor(share*10+1e-9)) - 2 // 0.3 -> 1, ..., 0.9 -> 7
		if col > 7 {
			col = 7
		}
	}
	row := 1
	if similar {
		row = 0
	}
	return float64(table1[row][col]) / 100
}

// ParallelismCap is the suggested number of workers for a workflow whose
// iteration has these task run times (Table 1 of Heymann et al.), at least
// 1 and at most the number of tasks.
func ParallelismCap(runs []time.Duration) int {
	n := len(runs)
	if n == 0 {
		return 0
	}
	share, similar := Workload(runs)
	c := int(math.Ceil(WorkerShare(share, similar)*float64(n) - 1e-9))
	return max(1, min(n, c))
}

// AdjustWorkers is the fine correction of Heymann et al.'s Fig. 2, applied
// at the end of an iteration after the first: when the workload did not
// change and the iteration took at most 1.1 times the time measured with
// the Table 1 count, a worker is removed while efficiency is below 0.8 and
// added back otherwise, never above tableCap.
func AdjustWorkers(workers, tableCap int, workloadChanged bool, execRatio, efficiency float64) int {
	if workloadChanged {
		return tableCap
	}
	if execRatio <= 1.1 {
		if efficiency < 0.8 {
			workers--
		} else {
			workers++
		}
	}
	return max(1, min(tableCap, workers))
}
