package wasmworker

import "sync/atomic"

// goPool runs functions on goroutines that it keeps, idle, for the next
// ones (at most maxIdle of them). An attempt runs on a goroutine of its own
// (it waits for a slot, then for its runner); a new goroutine starts with a
// small stack, which the runner's deep calls (the headless runner decodes
// its slot process's replies there) grow, by copying, again for every
// attempt: 12% of a headless worker's CPU in the dispatch benchmark. A
// kept goroutine keeps its stack, as long as the collector does not shrink
// it while it waits (wait).
type goPool struct {
	work    chan func() // unbuffered: a send succeeds when an idle goroutine takes it
	idle    atomic.Int32
	maxIdle int32
}

func newGoPool(maxIdle int) *goPool {
	return &goPool{work: make(chan func()), maxIdle: int32(maxIdle)}
}

// run runs f on an idle goroutine, or on a new one when none is idle.
func (p *goPool) run(f func()) {
	select {
	case p.work <- f:
	default:
		go p.loop(f)
	}
}

func (p *goPool) loop(f func()) {
	for {
		f()
		if p.idle.Add(1) > p.maxIdle {
			p.idle.Add(-1)
			return
		}
		f = p.wait()
		p.idle.Add(-1)
	}
}

// waitFrame is the stack wait keeps in use while a goroutine is idle.
const waitFrame = 4 << 10

// wait takes the next function under a frame of waitFrame bytes. The
// collector halves the stack of a goroutine that uses less than a quarter
// of it, and an idle goroutine's stack, shrunk at every collection, grew
// again by copying in its next attempt's calls (docs/RATIONALE.md): with
// the frame, a stack of up to 4 × waitFrame (the headless runner's
// attempts need less) is kept. Zeroing the frame costs less than a copy.
//
//go:noinline
func (p *goPool) wait() func() {
	// The frame is the stack in use, not a value anybody needs: it is
	// written and read back only so that the compiler keeps it.
	var frame [waitFrame]byte
	frame[0] = 1
	f := <-p.work
	if frame[0] != 1 {
		panic("goPool: its wait frame changed")
	}
	return f
}
