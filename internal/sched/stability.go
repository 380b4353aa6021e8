package sched

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Class is a worker's node state after Hummel and Meyer, section 3.1.
type Class int

// The four node states, from most to least reliable.
const (
	VeryStable  Class = iota // constantly available and not expected to degrade
	Stable                   // first degradation mode
	Unstable                 // likely to disconnect: short tasks or replicas only
	TooUnstable              // too unreliable to contribute: no work at all
)

var classNames = [...]string{"very_stable", "stable", "unstable", "too_unstable"}

// String returns the class as used in the API: very_stable, stable,
// unstable or too_unstable.
func (c Class) String() string {
	if c < 0 || int(c) >= len(classNames) {
		return fmt.Sprintf("class(%d)", int(c))
	}
	return classNames[c]
}

// MarshalText encodes the class by name.
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Sample is one heartbeat's device state. Battery is the level in [0, 1] or
// negative when the device reports none (mains power, or the browser hides
// it).
type Sample struct {
	At         time.Time
	Battery    float64
	Charging   bool
	Online     bool
	Connection string // "ethernet", "wifi", "cellular", "2g", "slow-2g", "3g", "4g", "" when unknown
	Hidden     bool   // the volunteer page is not visible (browsers throttle it)
	// Every is the interval the worker keeps after this heartbeat: the
	// idle interval while it is paused and holds nothing, the normal one
	// otherwise (0: unknown, taken as the others'). The jitter test
	// measures each gap against the interval it was meant to last.
	Every time.Duration
}

// History is what the server remembers of a worker across attempts.
type History struct {
	Attempts int           // attempts given to the worker
	Lost     int           // of those, attempts lost (lease expired, socket closed)
	Exposure time.Duration // total time the worker spent running attempts
	Valid    int           // results that agreed with an accepted quorum
	Invalid  int           // results that lost a quorum
}

// StabilityConfig holds the thresholds of the classification. The paper
// names the inputs (remaining capacity, link condition, utilisation, history)
// but gives no numbers; DefaultStability documents ours.
type StabilityConfig struct {
	Window          time.Duration // heartbeats older than this are ignored by the regression
	MinSamples      int           // fewer samples: the trend is unknown
	BatteryFloor    float64       // below this level, on battery: too unstable
	MinTimeToEmpty  time.Duration // predicted empty sooner: too unstable
	LowTimeToEmpty  time.Duration // predicted empty sooner: unstable
	Heartbeat       time.Duration // expected heartbeat interval, for the jitter test
	MaxJitter       float64       // coefficient of variation of heartbeat gaps above this: unstable
	MaxLossUnstable float64       // lost/attempts at or above this (with MinAttempts): unstable
	MaxLossTooBad   float64       // lost/attempts at or above this (with MinAttempts): too unstable
	MinAttempts     int           // attempts needed before the loss ratio counts
	VeryStableAfter int           // attempts without loss needed for very stable
	SafetyFactor    float64       // a task fits when time to empty > SafetyFactor * its run time
	ShortTask       time.Duration // tasks up to this long may go to unstable workers
}

// DefaultStability is the configuration the server uses unless told
// otherwise: a 10 minute regression window with at least 3 heartbeats,
// a 10% battery floor, "too unstable" under 5 minutes to empty and
// "unstable" under 30, jitter above 0.5, losses of 20% (unstable) and 50%
// (too unstable) once 5 attempts are known, "very stable" after 10 attempts
// without a loss, a 1.5 safety factor and 2-minute short tasks.
func DefaultStability() StabilityConfig {
	return StabilityConfig{
		Window:          10 * time.Minute,
		MinSamples:      3,
		BatteryFloor:    0.10,
		MinTimeToEmpty:  5 * time.Minute,
		LowTimeToEmpty:  30 * time.Minute,
		Heartbeat:       10 * time.Second,
		MaxJitter:       0.5,
		MaxLossUnstable: 0.2,
		MaxLossTooBad:   0.5,
		MinAttempts:     5,
		VeryStableAfter: 10,
		SafetyFactor:    1.5,
		ShortTask:       2 * time.Minute,
	}
}

// Stability is the classification of one worker with its reasons, as shown
// per worker in the API.
type Stability struct {
	Class Class `json:"class"`
	// TimeToEmpty is the predicted time until the battery is empty; negative
	// when no drain is predicted (mains power, charging, flat or unknown
	// trend).
	TimeToEmpty time.Duration `json:"time_to_empty"`
	// Slope is the fitted battery change per hour (negative when draining);
	// NaN when unknown.
	Slope   float64  `json:"slope_per_hour"`
	Reasons []string `json:"reasons"`
}

// BatteryTrend fits level = a + b*t by least squares over the samples with
// a known battery level inside the window ending at now, and returns the
// slope b per hour and the predicted time until the level reaches zero from
// the fitted value at now. ok is false with fewer than minSamples points or
// no spread in time. tte is negative when the fit does not drain.
func BatteryTrend(now time.Time, samples []Sample, window time.Duration, minSamples int) (slopePerHour float64, tte time.Duration, ok bool) {
	var xs, ys []float64
	for _, s := range samples {
		if s.Battery < 0 || s.At.After(now) || now.Sub(s.At) > window {
			continue
		}
		xs = append(xs, s.At.Sub(now).Hours()) // <= 0
		ys = append(ys, s.Battery)
	}
	if len(xs) < minSamples || len(xs) < 2 {
		return math.NaN(), -1, false
	}
	a, b, ok := linearFit(xs, ys)
	if !ok {
		return math.NaN(), -1, false
	}
	if b >= 0 {
		return b, -1, true
	}
	level := math.Max(a, 0) // fitted level at now (x = 0)
	hours := level / -b
	return b, time.Duration(hours * float64(time.Hour)), true
}

// linearFit returns intercept a and slope b of the least-squares line.
func linearFit(xs, ys []float64) (a, b float64, ok bool) {
	n := float64(len(xs))
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var sxx, sxy float64
	for i := range xs {
		dx := xs[i] - mx
		sxx += dx * dx
		sxy += dx * (ys[i] - my)
	}
	if sxx == 0 {
		return 0, 0, false
	}
	b = sxy / sxx
	return my - b*mx, b, true
}

// HeartbeatJitter is the coefficient of variation of the gaps between
// consecutive samples inside the window (0 with fewer than three samples).
// Where samples name their interval (Sample.Every), each gap counts in
// units of the interval the sample before it named, so that a worker
// moving between the normal and the idle interval keeps a steady rhythm.
func HeartbeatJitter(now time.Time, samples []Sample, window time.Duration) float64 {
	var in []Sample
	for _, s := range samples {
		if !s.At.After(now) && now.Sub(s.At) <= window {
			in = append(in, s)
		}
	}
	if len(in) < 3 {
		return 0
	}
	sort.Slice(in, func(i, j int) bool { return in[i].At.Before(in[j].At) })
	// The unit of a gap whose sample names no interval: the smallest named
	// (the normal interval), or seconds when none is.
	unit := time.Duration(0)
	for _, s := range in {
		if s.Every > 0 && (unit == 0 || s.Every < unit) {
			unit = s.Every
		}
	}
	if unit == 0 {
		unit = time.Second
	}
	gaps := make([]float64, len(in)-1)
	var sum float64
	for i := 1; i < len(in); i++ {
		every := in[i-1].Every
		if every <= 0 {
			every = unit
		}
		gaps[i-1] = float64(in[i].At.Sub(in[i-1].At)) / float64(every)
		sum += gaps[i-1]
	}
	mean := sum / float64(len(gaps))
	if mean == 0 {
		return 0
	}
	var v float64
	for _, g := range gaps {
		v += (g - mean) * (g - mean)
	}
	return math.Sqrt(v/float64(len(gaps))) / mean
}

// Classify derives a worker's node state from its recent heartbeats and its
// history. Every rule that lowers the class adds a reason; the class is the
// worst any rule gives.
func Classify(now time.Time, samples []Sample, h History, cfg StabilityConfig) Stability {
	st := Stability{Class: VeryStable, TimeToEmpty: -1, Slope: math.NaN()}
	lower := func(c Class, format string, args ...any) {
		if c > st.Class {
			st.Class = c
		}
		st.Reasons = append(st.Reasons, fmt.Sprintf(format, args...))
	}
	var last *Sample
	for i := range samples {
		if !samples[i].At.After(now) && (last == nil || samples[i].At.After(last.At)) {
			last = &samples[i]
		}
	}
	if last == nil {
		lower(Stable, "no heartbeat yet")
	} else {
		if !last.Online {
			lower(TooUnstable, "offline")
		}
		if cfg.Heartbeat > 0 && now.Sub(last.At) > 3*cfg.Heartbeat {
			lower(Unstable, "last heartbeat %s ago", now.Sub(last.At).Round(time.Second))
		}
		switch last.Connection {
		case "slow-2g", "2g":
			lower(Unstable, "slow connection (%s)", last.Connection)
		case "cellular", "3g":
			lower(Stable, "cellular connection")
		}
		if last.Hidden {
			lower(Stable, "page hidden (throttled)")
		}
		onBattery := last.Battery >= 0 && !last.Charging
		if onBattery {
			lower(Stable, "on battery (%.0f%%)", last.Battery*100)
			if last.Battery < cfg.BatteryFloor {
				lower(TooUnstable, "battery %.0f%% below floor %.0f%%", last.Battery*100, cfg.BatteryFloor*100)
			}
			slope, tte, ok := BatteryTrend(now, samples, cfg.Window, cfg.MinSamples)
			if ok {
				st.Slope = slope
				st.TimeToEmpty = tte
				switch {
				case tte >= 0 && tte < cfg.MinTimeToEmpty:
					lower(TooUnstable, "battery predicted empty in %s", tte.Round(time.Second))
				case tte >= 0 && tte < cfg.LowTimeToEmpty:
					lower(Unstable, "battery predicted empty in %s", tte.Round(time.Second))
				}
			} else {
				lower(Unstable, "battery trend unknown (fewer than %d heartbeats)", cfg.MinSamples)
			}
		}
		if j := HeartbeatJitter(now, samples, cfg.Window); j > cfg.MaxJitter {
			lower(Unstable, "heartbeat jitter %.2f above %.2f", j, cfg.MaxJitter)
		}
	}
	if h.Attempts >= cfg.MinAttempts && h.Attempts > 0 {
		loss := float64(h.Lost) / float64(h.Attempts)
		switch {
		case loss >= cfg.MaxLossTooBad:
			lower(TooUnstable, "lost %d of %d attempts", h.Lost, h.Attempts)
		case loss >= cfg.MaxLossUnstable:
			lower(Unstable, "lost %d of %d attempts", h.Lost, h.Attempts)
		}
	}
	if h.Lost > 0 {
		lower(Stable, "lost %d attempt(s) before", h.Lost)
	} else if h.Attempts < cfg.VeryStableAfter {
		lower(Stable, "short history (%d attempts)", h.Attempts)
	}
	return st
}

// Fits reports whether a task expected to run for run may go to a worker of
// this stability, and why not. A worker predicted to die before the task
// ends (with cfg.SafetyFactor) gets nothing; an unstable worker gets only
// short tasks (up to cfg.ShortTask) or replicas; a too unstable one gets
// nothing. An unknown run time (0) counts as longer than a short task.
func (s Stability) Fits(run time.Duration, replica bool, cfg StabilityConfig) (bool, string) {
	switch s.Class {
	case TooUnstable:
		return false, "worker too unstable"
	case Unstable:
		if !replica && (run <= 0 || run > cfg.ShortTask) {
			return false, "unstable worker: short tasks or replicas only"
		}
	}
	if s.TimeToEmpty >= 0 {
		need := run
		if need <= 0 {
			need = cfg.ShortTask
		}
		if float64(s.TimeToEmpty) < cfg.SafetyFactor*float64(need) {
			return false, fmt.Sprintf("battery predicted empty in %s, task needs %s", s.TimeToEmpty.Round(time.Second), need.Round(time.Second))
		}
	}
	return true, ""
}
