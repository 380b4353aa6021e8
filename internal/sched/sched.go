// Package sched holds cyclepool's scheduling policies as pure functions:
// device stability (Hummel and Meyer, section 3.1), fairness strategies
// (same paper, section 3.2), longest-first ordering and the parallelism cap
// (Heymann et al., "Random and Average"), the optimal checkpoint count
// (Workrs, section IV-E and Appendix A) and result verification by replicas
// and quorum.
//
// Nothing here touches a database, starts a goroutine or reads the wall
// clock: time comes from a Clock passed in and randomness from a *rand.Rand
// passed in, so the dispatcher in server/ and the simulator in internal/sim
// run the same code. Plan is the entry point a dispatcher calls once per
// round.
package sched

import "time"

// Clock gives the current time. The dispatcher passes a wall clock, the
// simulator a virtual one.
type Clock interface {
	Now() time.Time
}

// FixedClock is a Clock that always reads the same instant.
type FixedClock time.Time

// Now returns the fixed instant.
func (c FixedClock) Now() time.Time { return time.Time(c) }

// ClockFunc adapts a function to Clock.
type ClockFunc func() time.Time

// Now calls f.
func (f ClockFunc) Now() time.Time { return f() }
