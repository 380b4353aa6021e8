package headless

import (
	"slices"
	"time"

	"github.com/cyclepool/cyclepool/wasmworker"
)

// Pipelining (see wire.go, "Pipelined attempts"): while the attempts are
// short, an attempt goes to a slot process that is already running one,
// behind it, rather than to an idle process, so that a few slot processes
// run attempts back to back without sleeping on their pipes, instead of
// many processes each woken (and its caches cold) for every attempt.
const (
	// pipelineDepth is the most attempts given to one slot process at
	// once, the running one included.
	pipelineDepth = 8
	// pipelineShort: attempts are pipelined while the recent ones ran for
	// less than this on average.
	pipelineShort = 2 * time.Millisecond
	// pipelineWait: once the running attempt has run this long, the
	// attempts queued behind it are revoked and go to other slot
	// processes.
	pipelineWait = 5 * time.Millisecond
	// pipelineBytes is the largest payload (wasmworker.PayloadBytes) of an
	// attempt that may wait in a slot process's pipe: the run requests of
	// the attempts queued behind a running one (7 at most) then fit in a
	// pipe's 64 KiB buffer on Linux, so that writing one never blocks
	// until the running attempt ends.
	pipelineBytes = 8 << 10
	// maxSeq: a slot process is retired once its attempts' numbers reach
	// it, so that they never wrap around.
	maxSeq = 1 << 31
)

// pipelining holds the pipelining constants (tests change them).
type pipelining struct {
	depth, minBusy int
	short, wait    time.Duration
}

// ticket is one attempt given to a slot process. A slot process's tickets
// (slotProc.tickets) are in the order of their run requests; the first is
// the one whose replies come next, read by its Run.
type ticket struct {
	seq   uint32    // its run request's Seq; 0 until sent
	turn  chan bool // true: the ticket became the first; false: revoked (it never started)
	began time.Time // when it became the first
	kill  bool      // the end of its context killed the slot process
}

func newTicket() *ticket { return &ticket{turn: make(chan bool, 1)} }

// startedOn says whether t's attempt started in c (which is dead).
func (p *slotPool) startedOn(c *slotProc, t *ticket) bool {
	if t.seq == 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.gate == nil && !c.gateGone {
		return true // sent, and no gate to say more
	}
	return p.gateStarted(c) >= t.seq
}

// gateStarted returns the last attempt c started. p.mu is held.
func (p *slotPool) gateStarted(c *slotProc) uint32 {
	if c.gate == nil {
		return c.lastStarted
	}
	return c.gate.started()
}

// headPending reports whether t waits behind c's first ticket, which was
// sent but has not started (though c lives). p.mu is held.
func (p *slotPool) headPending(c *slotProc, t *ticket) bool {
	if c.gate == nil || len(c.tickets) < 2 || c.tickets[0] == t || c.isDead() || !slices.Contains(c.tickets, t) {
		return false
	}
	head := c.tickets[0]
	return head.seq != 0 && c.gate.started() < head.seq
}

// killedFor reports whether the end of t's context killed its slot process.
func (p *slotPool) killedFor(t *ticket) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return t.kill
}

// revoke revokes the attempts queued in c that have not started; they are
// told on their turn channel. It returns the last attempt started, and
// whether c's first ticket was sent but has not started (it is left to
// its Run, which learns it when c is killed). p.mu is held.
func (p *slotPool) revoke(c *slotProc) (started uint32, headRevoked bool) {
	switch {
	case c.gate != nil:
		started = c.gate.revoke(c.seq)
	case c.gateGone:
		started = c.lastStarted
	default:
		return 0, false // no queue without a gate
	}
	keep := c.tickets[:0]
	for i, t := range c.tickets {
		switch {
		case i == 0:
			headRevoked = t.seq != 0 && t.seq > started
			keep = append(keep, t)
		case t.seq > started:
			p.revoked++
			t.turn <- false
		default:
			keep = append(keep, t)
		}
	}
	clear(c.tickets[len(keep):])
	c.tickets = keep
	return started, headRevoked
}

// passTurn removes t, c's first ticket, from c: the next ticket's attempt
// is then c's current one; when there is none, c becomes idle. ran is how
// long t's attempt took (0 when it did not end normally).
func (p *slotPool) passTurn(c *slotProc, t *ticket, ran time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ran > 0 {
		p.recent.add(ran)
	}
	if i := slices.Index(c.tickets, t); i >= 0 {
		c.tickets = slices.Delete(c.tickets, i, i+1)
	}
	if c.isDead() {
		// Those that did not start never will; those that did read their
		// end from the pipe.
		started, _ := p.revoke(c)
		if len(c.tickets) > 0 && c.tickets[0].seq > started {
			p.revoked++
			c.tickets[0].turn <- false
			c.tickets = slices.Delete(c.tickets, 0, 1)
		}
		if len(c.tickets) == 0 {
			c.closeReplies()
		}
	}
	if len(c.tickets) > 0 {
		next := c.tickets[0]
		next.began = time.Now()
		next.turn <- true
		return
	}
	c.open = false
	p.releaseLocked(c)
}

// slowHead runs pipelineWait after c's first ticket became the first, when
// others wait behind it: if it still runs, they are revoked and go
// elsewhere.
func (p *slotPool) slowHead(c *slotProc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.slowArmed = false
	if len(c.tickets) < 2 || c.isDead() {
		return
	}
	head := c.tickets[0]
	age := time.Since(head.began)
	if age < p.pipe.wait || head.seq == 0 || p.gateStarted(c) < head.seq {
		p.armSlow(c, max(p.pipe.wait-age, p.pipe.wait/4))
		return
	}
	p.revoke(c)
}

// armSlow arms c's slowHead timer, unless it is armed. p.mu is held.
func (p *slotPool) armSlow(c *slotProc, d time.Duration) {
	if c.slowArmed {
		return
	}
	c.slowArmed = true
	if c.slow == nil {
		c.slow = time.AfterFunc(d, func() { p.slowHead(c) })
	} else {
		c.slow.Reset(d)
	}
}

// recentRuns is a moving average of how long attempts ran in slot
// processes.
type recentRuns struct {
	n   int
	avg time.Duration
}

func (r *recentRuns) add(d time.Duration) {
	if r.n == 0 {
		r.avg = d
	} else {
		r.avg += (d - r.avg) / 8
	}
	r.n++
}

// followable returns the busy slot process an attempt of module moduleID
// may queue in, if any: none while fewer slot processes than the machine
// has cores are busy (so that pipelining never costs parallelism), else
// the one with the most attempts below the depth (a full pipe keeps a slot
// process from sleeping) whose current attempt is young. p.mu is held.
func (p *slotPool) followable(moduleID string) *slotProc {
	var best *slotProc
	busy := 0
	now := time.Now()
	for c := range p.all {
		n := len(c.tickets)
		if n == 0 || c.isDead() {
			continue
		}
		busy++
		if !c.open || n >= p.pipe.depth || c.seq >= maxSeq || !c.modules[moduleID] ||
			now.Sub(c.tickets[0].began) >= p.pipe.wait/2 {
			continue
		}
		if best == nil || n > len(best.tickets) || n == len(best.tickets) && c.id < best.id {
			best = c
		}
	}
	if busy < p.pipe.minBusy {
		return nil
	}
	return best
}

// follow queues t in c and sends its run request, unless c no longer
// takes it (then it reports false).
func (p *slotPool) follow(c *slotProc, t *ticket, job *wasmworker.Job) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	p.mu.Lock()
	n := len(c.tickets)
	if !c.open || n == 0 || n >= p.pipe.depth || c.seq >= maxSeq || !c.modules[job.ModuleID] || c.isDead() {
		p.mu.Unlock()
		return false
	}
	c.seq++
	t.seq = c.seq
	c.tickets = append(c.tickets, t)
	p.followed++
	p.armSlow(c, max(p.pipe.wait-time.Since(c.tickets[0].began), 0))
	p.mu.Unlock()
	if err := c.enc.Encode(&slotRequest{Kind: reqRun, ModuleID: job.ModuleID, Assign: job.Assign, Host: job.Host != nil, Seq: t.seq}); err != nil {
		// The pipe broke: the process is gone or going, and its current
		// attempt's Run revokes t (or gives it its turn, if it started).
		c.kill()
	}
	return true
}
