package sched

import (
	"math"
	"time"
)

// ExpectedTime is Workrs' E_x(mu, T) = (e^(mu T) - 1) / mu: the expected
// time to finish T seconds of work when faults arrive as a Poisson process
// of rate mu per second and each fault restarts the work from the
// beginning. For mu = 0 it is T.
func ExpectedTime(mu, T float64) float64 {
	if mu <= 0 {
		return T
	}
	return math.Expm1(mu*T) / mu
}

// ExpectedTimeCheckpointed is Workrs' Eq. (1)/(3): the work split into n
// segments of T/n by n-1 checkpoints of cost C each,
// E_Y = n E_x(mu, T/n) + (n-1) C.
func ExpectedTimeCheckpointed(mu, T float64, n int, C float64) float64 {
	if n < 1 {
		n = 1
	}
	return float64(n)*ExpectedTime(mu, T/float64(n)) + float64(n-1)*C
}

// lambertW0 is the principal branch of the Lambert W function for
// x >= -1/e, by Halley's iteration.
func lambertW0(x float64) float64 {
	const invE = 1 / math.E
	if x < -invE {
		return math.NaN()
	}
	if x == 0 {
		return 0
	}
	var w float64
	switch {
	case x < -0.3:
		// series around the branch point -1/e
		p := math.Sqrt(2 * (math.E*x + 1))
		w = -1 + p - p*p/3 + 11*p*p*p/72
	case x < 3:
		w = math.Log1p(x) * 0.8
	default:
		l := math.Log(x)
		w = l - math.Log(l)
	}
	for i := 0; i < 64; i++ {
		ew := math.Exp(w)
		f := w*ew - x
		wp1 := w + 1
		if wp1 == 0 {
			break
		}
		d := f / (ew*wp1 - (w+2)*f/(2*wp1))
		w -= d
		if math.Abs(d) <= 1e-15*(1+math.Abs(w)) {
			break
		}
	}
	return w
}

// OptimalSegmentsReal is the real-valued minimiser of E_Y over the number of
// segments N, in closed form. Setting dE_Y/dN = 0 (Workrs, Appendix A) with
// x = mu T / N gives e^x (1 - x) = 1 - mu C, whose positive root is
// x* = 1 + W0(-(1 - mu C)/e), so N* = mu T / x*. It returns +Inf when
// mu C <= 0 (free checkpoints) and 0 when mu C >= 1 (a checkpoint costs more
// than the expected time between faults: no root with x > 0).
func OptimalSegmentsReal(mu, T, C float64) float64 {
	if mu <= 0 || T <= 0 {
		return 0
	}
	k := mu * C
	if k <= 0 {
		return math.Inf(1)
	}
	if k >= 1 {
		return 0
	}
	x := 1 + lambertW0(-(1-k)/math.E)
	if x <= 0 {
		return math.Inf(1)
	}
	return mu * T / x
}

// CheckpointPlan is the optimal checkpointing of one task on one worker.
type CheckpointPlan struct {
	Segments    int           `json:"segments"`    // N: the run is split into N parts
	Checkpoints int           `json:"checkpoints"` // N - 1
	Interval    time.Duration `json:"interval"`    // T / N of work between checkpoints; 0 = none
	Expected    time.Duration `json:"expected"`    // E_Y at the optimum
	Baseline    time.Duration `json:"baseline"`    // E_x without checkpoints
}

// OptimalCheckpoints returns the integer optimum of E_Y for a task of run
// time T on a worker with fault rate mu (per second) and checkpoint cost C.
// E_Y is convex in N (Workrs, Eq. 4), so the integer optimum is the floor or
// the ceiling of the closed-form N*, whichever gives the smaller E_Y (ties
// go to fewer checkpoints). maxSegments bounds N (0 = no bound beyond one
// segment per second of work).
func OptimalCheckpoints(mu float64, T, C time.Duration, maxSegments int) CheckpointPlan {
	t, c := T.Seconds(), C.Seconds()
	limit := int(math.Max(1, math.Floor(t)))
	if maxSegments > 0 && maxSegments < limit {
		limit = maxSegments
	}
	best := 1
	if t > 0 && mu > 0 {
		ns := OptimalSegmentsReal(mu, t, c)
		lo := 1
		if !math.IsInf(ns, 1) && ns >= 1 {
			lo = int(math.Floor(ns))
		} else if math.IsInf(ns, 1) {
			lo = limit
		}
		lo = max(1, min(lo, limit))
		best = lo
		if hi := lo + 1; hi <= limit && ExpectedTimeCheckpointed(mu, t, hi, c) < ExpectedTimeCheckpointed(mu, t, lo, c) {
			best = hi
		}
	}
	p := CheckpointPlan{
		Segments:    best,
		Checkpoints: best - 1,
		Expected:    secs(ExpectedTimeCheckpointed(mu, t, best, c)),
		Baseline:    secs(ExpectedTime(mu, t)),
	}
	if best > 1 {
		p.Interval = T / time.Duration(best)
	}
	return p
}

// ListingOptimalSegments is Workrs' Listing 1 as printed: it walks N = 1, 2,
// ... while E_Y keeps falling and returns the last N that improved. It is
// kept to check the closed form against; OptimalCheckpoints is O(1).
func ListingOptimalSegments(mu, T, C float64) int {
	best := ExpectedTime(mu, T)
	n := 1
	for n < 1<<20 {
		e := ExpectedTimeCheckpointed(mu, T, n+1, C)
		if e > best || e == best {
			break
		}
		best = e
		n++
	}
	return n
}

// FaultRate estimates a worker's fault rate mu (faults per second) from its
// lost attempts and the time it spent running attempts, with a prior of
// priorFaults over priorExposure so that a new worker is neither trusted
// blindly nor condemned (the server uses 1 fault per 4 hours).
func FaultRate(lost int, exposure time.Duration, priorFaults float64, priorExposure time.Duration) float64 {
	den := exposure.Seconds() + priorExposure.Seconds()
	if den <= 0 {
		return 0
	}
	return (float64(lost) + priorFaults) / den
}

// CheckpointDue drives the task ABI's checkpoint_due(): it is true when at
// least interval of work has passed since the last checkpoint (or the start
// of the attempt). An interval of 0 never asks.
func CheckpointDue(sinceLast, interval time.Duration) bool {
	return interval > 0 && sinceLast >= interval
}
