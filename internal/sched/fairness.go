package sched

import (
	"fmt"
	"sort"
	"time"
)

// Strategy is one of the fairness strategies of Hummel and Meyer, section
// 3.2, or None. A strategy decides whether a worker refrains from taking a
// job, by comparing its own performance value f(T0) with those of its
// neighbours f(T1..Tn-1).
type Strategy int

// The strategies. Their formulas are in Refrains.
const (
	None                     Strategy = iota // no fairness: every idle worker takes work
	NotBest                                  // refrain if any neighbour is better
	Worst                                    // refrain if every neighbour is better
	WorseThanAverage                         // refrain if the neighbours' average is better
	WorseThanMajority                        // refrain if more than half the neighbours are better
	EqualOrWorseThanMajority                 // refrain if more than half are better or equal
)

var strategyNames = [...]string{"none", "not-best", "worst", "worse-than-average", "worse-than-majority", "equal-or-worse-than-majority"}

// Strategies lists every strategy, None first, in the order of the paper's
// Table 1.
func Strategies() []Strategy {
	return []Strategy{None, NotBest, Worst, WorseThanAverage, WorseThanMajority, EqualOrWorseThanMajority}
}

// String returns the strategy's configuration name.
func (s Strategy) String() string {
	if s < 0 || int(s) >= len(strategyNames) {
		return fmt.Sprintf("strategy(%d)", int(s))
	}
	return strategyNames[s]
}

// ParseStrategy reads a strategy by its configuration name.
func ParseStrategy(name string) (Strategy, error) {
	for i, n := range strategyNames {
		if n == name {
			return Strategy(i), nil
		}
	}
	return None, fmt.Errorf("unknown fairness strategy %q (want one of %v)", name, strategyNames)
}

// Refrains applies the strategy: it reports whether a worker with
// performance value self should refrain from taking a job, given the values
// of its neighbours (the group without itself, n-1 values). With no
// neighbours (n = 1) a worker never refrains.
//
//	not best:   exists i: f(Ti) > f(T0)
//	worst:      for all i: f(Ti) > f(T0)
//	worse avg:  mean f(Ti) > f(T0)
//	worse maj:  |{i: f(Ti) > f(T0)}| > (n-1)/2
//	eq/w maj:   |{i: f(Ti) >= f(T0)}| > (n-1)/2
func (s Strategy) Refrains(self float64, neighbours []float64) bool {
	k := len(neighbours)
	if s == None || k == 0 {
		return false
	}
	better, betterEq := 0, 0
	sum := 0.0
	for _, f := range neighbours {
		if f > self {
			better++
		}
		if f >= self {
			betterEq++
		}
		sum += f
	}
	switch s {
	case NotBest:
		return better > 0
	case Worst:
		return better == k
	case WorseThanAverage:
		return sum/float64(k) > self
	case WorseThanMajority:
		return float64(better) > float64(k)/2
	case EqualOrWorseThanMajority:
		return float64(betterEq) > float64(k)/2
	}
	return false
}

// Group returns the indexes of the neighbours of ids[self] for group size n,
// as in the paper: the ids are sorted into a ring and a worker takes the
// floor((n-1)/2) ids preceding its own and the ceil((n-1)/2) following it.
// The result never contains self and has min(n, len(ids))-1 entries.
func Group(ids []string, self int, n int) []int {
	m := len(ids)
	if n > m {
		n = m
	}
	if n <= 1 {
		return nil
	}
	order := make([]int, m)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return ids[order[a]] < ids[order[b]] })
	pos := 0
	for p, i := range order {
		if i == self {
			pos = p
		}
	}
	before, after := (n-1)/2, n-1-(n-1)/2
	out := make([]int, 0, n-1)
	for d := 1; d <= before; d++ {
		out = append(out, order[((pos-d)%m+m)%m])
	}
	for d := 1; d <= after; d++ {
		out = append(out, order[(pos+d)%m])
	}
	return out
}

// Performance is the aggregate f(T) of the paper, higher meaning more able
// to take work: the remaining capacity (battery level on battery, 1 on mains
// or charging) times the link quality in [0, 1] times (1 - loadWeight*load),
// load being the busy share of the worker's slots. A small loadWeight (the
// default 0.1) keeps a busy worker comparable with idle ones, as in the
// paper where f is an aggregate and not a busy flag. The paper's energy model drains the battery with work, so
// f also falls as a worker does more jobs; on mains power JobsDone stands in
// for that drain: each job done lowers f by jobWeight.
func Performance(battery float64, charging bool, link float64, busy, slots, jobsDone int, jobWeight, loadWeight float64) float64 {
	capacity := 1.0
	if battery >= 0 && !charging {
		capacity = battery
	}
	idle := 1.0
	if slots > 0 {
		idle = 1 - loadWeight*float64(busy)/float64(slots)
	}
	if link < 0 {
		link = 1
	}
	f := capacity * link * idle
	if battery < 0 || charging {
		f -= jobWeight * float64(jobsDone)
	}
	return f
}

// DeadlockTimeout is the paper's deadlock prevention bound: fairness is
// switched off for a job that has waited longer than perCandidate times the
// number of candidate workers (the paper uses ten seconds per candidate).
func DeadlockTimeout(perCandidate time.Duration, candidates int) time.Duration {
	if candidates < 1 {
		candidates = 1
	}
	return perCandidate * time.Duration(candidates)
}

// Variance is the fairness metric of the paper: the sample variance
// (divided by n-1) of the number of jobs each worker processed. It is 0 for
// fewer than two workers.
func Variance(jobs []int) float64 {
	n := len(jobs)
	if n < 2 {
		return 0
	}
	var sum float64
	for _, j := range jobs {
		sum += float64(j)
	}
	mean := sum / float64(n)
	var v float64
	for _, j := range jobs {
		d := float64(j) - mean
		v += d * d
	}
	return v / float64(n-1)
}
