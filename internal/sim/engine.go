// Package sim is a discrete-event simulator that drives the production
// policies of internal/sched with virtual workers (speed, battery, crash
// timelines) and a virtual clock, to reproduce the published results in
// ../shared/seeds with cyclepool's own code. Each scenario is deterministic
// for a given seed.
package sim

import (
	"container/heap"
	"time"
)

// epoch is the virtual time origin of every run.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Engine is the event loop: a virtual clock and a queue of events ordered
// by time, then by the order they were scheduled.
type Engine struct {
	now time.Time
	q   events
	seq int
}

type event struct {
	at  time.Time
	seq int
	fn  func()
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if !e[i].at.Equal(e[j].at) {
		return e[i].at.Before(e[j].at)
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// NewEngine returns an engine whose clock reads the epoch.
func NewEngine() *Engine { return &Engine{now: epoch} }

// Now is the virtual time; Engine is a sched.Clock.
func (e *Engine) Now() time.Time { return e.now }

// Elapsed is the virtual time since the start.
func (e *Engine) Elapsed() time.Duration { return e.now.Sub(epoch) }

// At runs fn at virtual time start+d.
func (e *Engine) At(d time.Duration, fn func()) { e.AtTime(epoch.Add(d), fn) }

// After runs fn d after now.
func (e *Engine) After(d time.Duration, fn func()) { e.AtTime(e.now.Add(d), fn) }

// AtTime runs fn at t (now, if t is in the past).
func (e *Engine) AtTime(t time.Time, fn func()) {
	if t.Before(e.now) {
		t = e.now
	}
	e.seq++
	heap.Push(&e.q, event{at: t, seq: e.seq, fn: fn})
}

// Run processes events until none is left or the clock would pass limit
// (from the start); it returns the number of events run.
func (e *Engine) Run(limit time.Duration) int {
	n := 0
	end := epoch.Add(limit)
	for e.q.Len() > 0 {
		ev := heap.Pop(&e.q).(event)
		if ev.at.After(end) {
			break
		}
		e.now = ev.at
		ev.fn()
		n++
	}
	return n
}
