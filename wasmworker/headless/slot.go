package headless

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// Isolation mode: every attempt runs in a slot process, a long-lived child
// process of the same executable (see ServeSlotIfChild) that runs one
// attempt at a time, at full speed: without WithCloseOnContextDone, so a
// module in a tight loop never returns to Go. The worker (the parent) never
// runs wasm. It gives the attempt to an idle slot process over a pipe
// (wire.go), relays the child's progress and checkpoint requests to
// job.Host, and receives the outcome. To cancel an attempt, at its wall
// time limit and when the Runner closes, it kills the slot process
// (SIGKILL); a killed or crashed slot process is replaced when an attempt
// next needs one. Idle slot processes are kept for later attempts (at most
// as many as attempts ran at once) and exit after Config.IdleTimeout.
//
// Module bytes are fetched (and checked against the module id) by the
// parent, kept in memory up to maxModuleBytes, and sent to a slot process
// only the first time it needs the module; the slot process keeps it
// compiled in memory. Slot processes share the compilation cache directory:
// wazero's file cache writes each entry to a temporary file and renames it
// into place, so concurrent processes never see a partial entry.

// maxModuleBytes bounds the module bytes the parent keeps; past it, the
// least recently used modules are fetched again when needed.
const maxModuleBytes = 256 << 20

// helloTimeout bounds the start of a slot process.
const helloTimeout = 30 * time.Second

// slotPool is the parent's side of isolation mode.
type slotPool struct {
	log         *slog.Logger
	exe         string
	cacheDir    string
	dataDir     string // the data cache's directory, for the slot processes
	baseDir     string // holds one directory per slot process
	idleTimeout time.Duration

	closing context.Context // cancelled by Close
	close   context.CancelFunc
	runs    sync.WaitGroup // Run calls
	procs   sync.WaitGroup // slot processes not yet reaped

	mu          sync.Mutex
	closed      bool
	idle        []*slotProc // most recently used last
	pipe        pipelining
	recent      recentRuns // how long attempts ran
	followed    int        // attempts queued behind another (for tests)
	revoked     int        // of which revoked, to run elsewhere or not at all
	all         map[*slotProc]struct{}
	nextID      int
	modules     map[string]*moduleBytes
	moduleBytes int64 // total of len(b) in modules
}

// moduleBytes is a module fetched, or being fetched, by one caller while
// others wait on done.
type moduleBytes struct {
	done    chan struct{}
	b       []byte
	err     error
	lastUse time.Time
}

// slotProc is one slot process. Between acquire and release it belongs to
// one Run, which alone sends to it and reads its replies, on its own
// goroutine: a reader goroutine handing each reply over would cost a
// goroutine wake-up, often a thread's, per reply. Nobody reads while the
// process is idle (it says nothing then); reap notices its death.
type slotProc struct {
	id     int
	dir    string
	cmd    *exec.Cmd
	reqW   *os.File
	enc    *wireEncoder
	repR   *os.File     // closed by closeReplies
	dec    *wireDecoder // reads repR
	stderr *tailBuffer

	wmu sync.Mutex // serializes requests: enc, and numbering with the order sent

	// Guarded by the pool's mu.
	modules     map[string]bool // loaded in the child
	tickets     []*ticket       // attempts given to it, not yet ended, in order
	seq         uint32          // the last run request's Seq
	open        bool            // attempts may queue behind its current one
	gate        *gate           // nil without one, and once reaped
	gateGone    bool            // it had a gate, now unmapped: lastStarted is final
	lastStarted uint32          // the gate's last started, once reaped
	slow        *time.Timer     // runs slowHead
	slowArmed   bool
	idleSince   time.Time
	idleTimer   *time.Timer

	running atomic.Bool // it was given an attempt that has not ended

	pmu      sync.Mutex
	process  *os.Process
	killed   bool
	deadOnce sync.Once
	repOnce  sync.Once     // closes repR
	dead     chan struct{} // closed when killed or exited
	exited   chan struct{} // closed when reaped and its directory removed
}

func newSlotPool(cfg Config, log *slog.Logger, tmp, dataDir string) (*slotPool, error) {
	exe, err := selfExecutable()
	if err != nil {
		return nil, fmt.Errorf("headless: finding this executable for slot processes: %w", err)
	}
	sweepStaleSlotDirs(tmp, log)
	base, err := os.MkdirTemp(tmp, fmt.Sprintf("cyclepool-slots-%d-", os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("headless: directory for slot processes: %w", err)
	}
	idle := cfg.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	p := &slotPool{log: log, exe: exe, cacheDir: cfg.CacheDir, dataDir: dataDir, baseDir: base, idleTimeout: idle,
		all: map[*slotProc]struct{}{}, modules: map[string]*moduleBytes{},
		pipe: pipelining{depth: pipelineDepth, minBusy: runtime.NumCPU(), short: pipelineShort, wait: pipelineWait}}
	p.closing, p.close = context.WithCancel(context.Background())
	return p, nil
}

// sweepStaleSlotDirs removes the slot directories of workers that are gone
// (killed before they could remove them).
func sweepStaleSlotDirs(tmp string, log *slog.Logger) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "cyclepool-slots-")
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() || !processGone(pid) {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		if err := os.RemoveAll(dir); err != nil {
			log.Debug("removing a stale slot directory", "dir", dir, "err", err)
		}
	}
}

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

// run runs one attempt in a slot process.
func (p *slotPool) run(ctx context.Context, job *wasmworker.Job) (out *wasmworker.Outcome) {
	start := time.Now()
	defer func() {
		if out.Duration <= 0 { // no run time from the slot process: the time spent here
			out.Duration = time.Since(start)
		}
	}()
	if job == nil || job.Assign == nil {
		return failOutcome(protocol.ReasonWorker, "no assignment")
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return failOutcome(protocol.ReasonWorker, "runner closed")
	}
	p.runs.Add(1)
	p.mu.Unlock()
	defer p.runs.Done()

	// No context of its own: derived contexts and AfterFuncs were a tenth
	// of the worker's CPU per attempt. What ends the Run early is ctx's end
	// (attempt stops the slot process on it), the wall time (attempt's
	// timer) and Close, which kills every slot process: Runs waiting on one,
	// queued in one or starting one learn it from it.
	stopped := func() *wasmworker.Outcome {
		if ctx.Err() != nil {
			return failOutcome(protocol.ReasonCancelled, "cancelled")
		}
		if p.closing.Err() != nil {
			return failOutcome(protocol.ReasonWorker, "the runner is closing")
		}
		return nil
	}

	mod, err := p.module(ctx, job)
	if err != nil {
		if o := stopped(); o != nil {
			return o
		}
		var me *moduleError
		if errors.As(err, &me) {
			return failOutcome(protocol.ReasonModule, "%v", err)
		}
		return failOutcome(protocol.ReasonWorker, "%v", err)
	}
	follow := gateSupported && wasmworker.PayloadBytes(job.Assign) <= pipelineBytes
	for try := 1; ; {
		c, t, err := p.acquire(ctx, job, follow)
		if err != nil {
			if o := stopped(); o != nil {
				return o
			}
			return failOutcome(protocol.ReasonWorker, "starting a slot process: %v", err)
		}
		o, again := p.attempt(ctx, c, t, job, mod)
		switch again {
		case againRevoked:
			// It never started: not a try. Once moved, it does not
			// queue again.
			if o := stopped(); o != nil {
				return o
			}
			follow = false
			continue
		case againDead:
			if try < 3 {
				try++
				p.log.Warn("slot process gone before the attempt started; trying another", "slot", c.id)
				continue
			}
		}
		return o
	}
}

// again says whether an attempt is to be tried in another slot process.
type again int

const (
	againNo      again = iota
	againRevoked       // revoked before it started
	againDead          // the slot process was gone before it started
)

// attempt runs job in slot process c, as ticket t: t was sent already when
// c was running other attempts (t.seq != 0), else it is c's only ticket.
func (p *slotPool) attempt(ctx context.Context, c *slotProc, t *ticket, job *wasmworker.Job, mod []byte) (_ *wasmworker.Outcome, _ again) {
	// The end of ctx and the wall time stop the attempt: it is revoked when
	// it has not started, or its slot process is killed; every wait below
	// then ends because its reply pipe closes. (The wall time ends the Run:
	// it is not tried again.) Close kills the slot process itself.
	var wallExpired atomic.Bool
	var wallTimer *time.Timer
	// ckptCancel ends the wait for a checkpoint's acknowledgement, if any,
	// at the wall time.
	var ckptCancel atomic.Pointer[context.CancelFunc]
	stopCtx := context.AfterFunc(ctx, func() { p.stop(c, t) })
	disarmed, stoppedEarly := false, false
	// stopKill keeps the end of ctx and the wall time from stopping the
	// attempt from now on; it reports whether neither has (as the stop
	// function of a context.AfterFunc does).
	stopKill := func() bool {
		if !disarmed {
			disarmed = true
			if !stopCtx() {
				stoppedEarly = true
			}
			if wallTimer != nil && !wallTimer.Stop() {
				stoppedEarly = true
			}
		}
		return !stoppedEarly
	}
	defer stopKill()
	var log []byte
	memMsg := ""
	loading := false // the slot process is compiling the module
	l := effectiveLimits(job.Assign.Limits)
	wall := time.Duration(l.WallMS) * time.Millisecond

	// ended is the outcome once the slot process is gone.
	ended := func() (*wasmworker.Outcome, again) {
		killedByUs := c.wasKilled()
		c.kill() // in case it is alive with a broken pipe
		<-c.exited
		started := p.startedOn(c, t)
		p.passTurn(c, t, 0)
		var o *wasmworker.Outcome
		switch {
		case ctx.Err() != nil:
			o = failOutcome(protocol.ReasonCancelled, "cancelled")
		case p.closing.Err() != nil:
			o = failOutcome(protocol.ReasonWorker, "the runner is closing")
		case memMsg != "":
			o = failOutcome(protocol.ReasonMemory, "%s", memMsg)
		case c.outOfAddressSpace():
			// Not the kernel's or the machine's doing: the process passed
			// the address-space limit it set itself for this module.
			if loading {
				o = failOutcome(protocol.ReasonMemory, "memory limit exceeded: compiling the module took more than the %d MiB of address space a slot process allows for it",
					compileRoom>>20)
			} else {
				o = failOutcome(protocol.ReasonMemory, "memory limit exceeded: the attempt took more than the %d MiB of address space a slot process allows for a memory limit of %d pages (three times the memory and output limits, and %d MiB); memory outside the linear memory, such as a table's entries, counts too",
					runRoom(l)>>20, effectiveMemoryPages(l.MemoryPages), runOverhead>>20)
			}
		case wallExpired.Load():
			o = failOutcome(protocol.ReasonWallTime, "wall time limit of %v exceeded", wall)
		case !started:
			return failOutcome(protocol.ReasonWorker, "slot process gone: %s", c.describeExit(killedByUs)), againDead
		default:
			msg := c.describeExit(killedByUs)
			p.log.Warn("slot process died during an attempt", "task", job.Assign.Task, "attempt", job.Assign.Attempt,
				"slot", c.id, "exit", msg, "stderr", string(c.stderr.bytes()))
			o = failOutcome(protocol.ReasonWorker, "the slot process running the attempt died: %s", msg)
		}
		o.Log = log
		return o, againNo
	}

	if t.seq != 0 {
		// Queued behind another attempt: wait until it is this one's turn.
		if ok := <-t.turn; !ok {
			stopKill()
			return failOutcome(protocol.ReasonWorker, "revoked"), againRevoked
		}
	} else {
		if !c.hasModule(p, job.ModuleID) {
			loading = true
			if c.send(&slotRequest{Kind: reqLoad, ModuleID: job.ModuleID, Module: mod}) != nil {
				return ended()
			}
			m, ok := c.recv()
			if !ok {
				return ended()
			}
			loading = false
			if m.Kind != repLoaded {
				p.log.Error("slot process: unexpected reply to load", "kind", m.Kind)
				c.kill()
				return ended()
			}
			if m.Err != "" {
				if !stopKill() && p.killedFor(t) {
					return ended()
				}
				p.passTurn(c, t, 0)
				if m.ModuleErr {
					return failOutcome(protocol.ReasonModule, "%s", m.Err), againNo
				}
				return failOutcome(protocol.ReasonWorker, "loading the module in the slot process: %s", m.Err), againNo
			}
			p.mu.Lock()
			c.modules[job.ModuleID] = true
			p.mu.Unlock()
		}
		if p.sendRun(c, t, job) != nil {
			return ended()
		}
	}
	if job.Host != nil {
		job.Host.Started() // its request is c's current one: c runs it now
	}
	c.running.Store(true)
	defer c.running.Store(false)
	wallTimer = time.AfterFunc(wall, func() {
		wallExpired.Store(true)
		if f := ckptCancel.Load(); f != nil {
			(*f)()
		}
		p.stop(c, t)
	})
	for {
		m, ok := c.recv()
		if !ok {
			return ended()
		}
		switch m.Kind {
		case repLog:
			if room := l.LogBytes - int64(len(log)); room > 0 {
				log = append(log, m.Data[:min(int64(len(m.Data)), room)]...)
			}
		case repProgress:
			if job.Host != nil {
				job.Host.Progress(m.Fraction)
			}
		case repMemory:
			if memMsg == "" {
				memMsg = m.Message
			}
		case repCheckpoint:
			r := &slotRequest{Kind: reqCheckpointed}
			if job.Host == nil {
				r.Err = "no host"
			} else if err := p.checkpoint(ctx, job.Host, m.Data, &ckptCancel, &wallExpired); err != nil {
				r.Err = err.Error()
				if r.Err == "" {
					r.Err = "refused"
				}
			}
			if c.send(r) != nil {
				return ended()
			}
		case repDone:
			if !stopKill() && p.killedFor(t) {
				return ended() // killed meanwhile: the kill's reason wins
			}
			p.passTurn(c, t, max(m.Took, time.Nanosecond))
			// Duration: the time the attempt ran, as the slot process
			// measured it, without the wait behind others in its pipe.
			return &wasmworker.Outcome{Outputs: m.Outputs, Files: m.Files, Log: log, Reason: m.Reason, Message: m.Message, Duration: m.Took}, againNo
		default:
			p.log.Error("slot process: unexpected reply", "kind", m.Kind)
			c.kill()
			return ended()
		}
	}
}

// checkpoint hands an attempt's checkpoint to its host, and waits for the
// host to save it until ctx ends, the wall time expires (expired, and
// cancel, which the wall timer calls) or the Runner closes.
func (p *slotPool) checkpoint(ctx context.Context, h wasmworker.Host, state []byte, cancel *atomic.Pointer[context.CancelFunc], expired *atomic.Bool) error {
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	cancel.Store(&ccancel)
	defer cancel.Store(nil)
	if expired.Load() {
		ccancel()
	}
	defer context.AfterFunc(p.closing, ccancel)()
	return h.Checkpoint(cctx, state)
}

// hasModule says whether c has loaded module id.
func (c *slotProc) hasModule(p *slotPool, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return c.modules[id]
}

// sendRun sends t's run request to c, numbering it; t is c's only ticket
// or is being queued behind the others.
func (p *slotPool) sendRun(c *slotProc, t *ticket, job *wasmworker.Job) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	p.mu.Lock()
	c.seq++
	t.seq = c.seq
	t.began = time.Now()
	c.open = c.gate != nil // others may queue behind it
	p.mu.Unlock()
	return c.enc.Encode(&slotRequest{Kind: reqRun, ModuleID: job.ModuleID, Assign: job.Assign, Host: job.Host != nil, Seq: t.seq})
}

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

// stop stops t's attempt, when its context ends: the attempts queued in c
// that have not started are revoked (t too, then), and c is killed when it
// runs t, or when it has not started its first ticket. A t that already
// gave c up (its attempt ended: c may run another Run's attempt now)
// changes nothing.
func (p *slotPool) stop(c *slotProc, t *ticket) {
	p.mu.Lock()
	if !slices.Contains(c.tickets, t) {
		p.mu.Unlock()
		return
	}
	// Revoking t would also revoke the first ticket if its slot process
	// has not read its run request yet (which then takes a kill): give it
	// a moment, as it reads it as soon as the attempt before it ends.
	for i := 0; i < 100 && p.headPending(c, t); i++ {
		p.mu.Unlock()
		time.Sleep(time.Millisecond)
		p.mu.Lock()
	}
	if !slices.Contains(c.tickets, t) { // it ended meanwhile
		p.mu.Unlock()
		return
	}
	started, headRevoked := p.revoke(c)
	inList := slices.Contains(c.tickets, t)
	kill := headRevoked || c.gate == nil && !c.gateGone || inList && (t.seq == 0 || t.seq >= started)
	t.kill = kill
	p.mu.Unlock()
	if kill {
		c.kill()
	}
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

// effectiveLimits fills in the defaults of limits left at zero.
func effectiveLimits(l protocol.Limits) protocol.Limits {
	if l.WallMS <= 0 {
		l.WallMS = DefaultWall.Milliseconds()
	}
	if l.LogBytes <= 0 {
		l.LogBytes = DefaultLogBytes
	}
	return l
}

func failOutcome(reason, format string, args ...any) *wasmworker.Outcome {
	return &wasmworker.Outcome{Reason: reason, Message: clip(fmt.Sprintf(format, args...))}
}

// module returns the bytes of job's module, fetching and checking them when
// they are not in memory. Concurrent calls for the same module wait for one
// fetch.
func (p *slotPool) module(ctx context.Context, job *wasmworker.Job) ([]byte, error) {
	for {
		p.mu.Lock()
		m, ok := p.modules[job.ModuleID]
		if !ok {
			m = &moduleBytes{done: make(chan struct{})}
			p.modules[job.ModuleID] = m
			p.mu.Unlock()
			m.b, m.err = p.fetch(ctx, job)
			p.mu.Lock()
			m.lastUse = time.Now()
			if m.err != nil {
				if p.modules[job.ModuleID] == m {
					delete(p.modules, job.ModuleID) // let a later attempt try again
				}
			} else {
				p.moduleBytes += int64(len(m.b))
				p.evictModules(job.ModuleID)
			}
			p.mu.Unlock()
			close(m.done)
			return m.b, m.err
		}
		p.mu.Unlock()
		select {
		case <-m.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.closing.Done():
			return nil, errors.New("runner closed")
		}
		if m.err == nil {
			p.mu.Lock()
			m.lastUse = time.Now()
			p.mu.Unlock()
			return m.b, nil
		}
		if !errors.Is(m.err, context.Canceled) && !errors.Is(m.err, context.DeadlineExceeded) {
			return nil, m.err
		}
	}
}

// fetch fetches and checks job's module; Close ends the fetch.
func (p *slotPool) fetch(ctx context.Context, job *wasmworker.Job) ([]byte, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.closing, cancel)()
	return fetchVerified(fctx, job)
}

// evictModules drops the least recently used module bytes, except keep's,
// while they add up to more than maxModuleBytes. p.mu is held.
func (p *slotPool) evictModules(keep string) {
	for p.moduleBytes > maxModuleBytes {
		var oldest string
		var t time.Time
		for id, m := range p.modules {
			if id == keep || m.b == nil {
				continue
			}
			if oldest == "" || m.lastUse.Before(t) {
				oldest, t = id, m.lastUse
			}
		}
		if oldest == "" {
			return
		}
		p.moduleBytes -= int64(len(p.modules[oldest].b))
		delete(p.modules, oldest)
	}
}

// acquire gives job a slot process and a ticket in it. With follow, while
// attempts are short, it queues the attempt behind those of a busy slot
// process that has the module loaded (sending its run request at once);
// otherwise it takes an idle slot process, preferring the most recently
// used one that has the module loaded, or starts one.
func (p *slotPool) acquire(ctx context.Context, job *wasmworker.Job, follow bool) (*slotProc, *ticket, error) {
	t := newTicket()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, nil, errors.New("runner closed")
		}
		if follow && p.recent.n > 0 && p.recent.avg < p.pipe.short {
			if c := p.followable(job.ModuleID); c != nil {
				p.mu.Unlock()
				if p.follow(c, t, job) {
					return c, t, nil
				}
				continue
			}
		}
		if len(p.idle) == 0 {
			p.mu.Unlock()
			c, err := p.spawn(ctx)
			if err != nil {
				return nil, nil, err
			}
			p.mu.Lock()
			c.tickets = append(c.tickets, t)
			p.mu.Unlock()
			return c, t, nil
		}
		i := len(p.idle) - 1
		for j := i; j >= 0; j-- {
			if p.idle[j].modules[job.ModuleID] {
				i = j
				break
			}
		}
		c := p.idle[i]
		p.idle = slices.Delete(p.idle, i, i+1)
		if c.isDead() {
			p.mu.Unlock()
			continue
		}
		c.tickets = append(c.tickets, t)
		if !c.modules[job.ModuleID] || c.gate == nil || !c.wmu.TryLock() {
			p.mu.Unlock()
			return c, t, nil // attempt loads the module and sends the run request
		}
		// Send the run request now, so that the Runs that come meanwhile
		// can queue behind it (c.wmu, taken before the run request is
		// numbered, keeps them behind).
		c.seq++
		t.seq = c.seq
		t.began = time.Now()
		c.open = true
		t.turn <- true
		p.mu.Unlock()
		err := c.enc.Encode(&slotRequest{Kind: reqRun, ModuleID: job.ModuleID, Assign: job.Assign, Host: job.Host != nil, Seq: t.seq})
		c.wmu.Unlock()
		if err != nil {
			c.kill() // attempt learns it from the reply pipe
		}
		return c, t, nil
	}
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

// releaseLocked makes c idle again; p.mu is held.
func (p *slotPool) releaseLocked(c *slotProc) {
	if c.isDead() {
		return
	}
	if p.closed || c.seq >= maxSeq {
		c.kill()
		return
	}
	c.idleSince = time.Now()
	p.idle = append(p.idle, c)
	if c.idleTimer == nil {
		c.idleTimer = time.AfterFunc(p.idleTimeout, func() { p.retire(c) })
	} else {
		c.idleTimer.Reset(p.idleTimeout)
	}
}

// retire ends c if it is still idle and has been for idleTimeout.
func (p *slotPool) retire(c *slotProc) {
	p.mu.Lock()
	i := slices.Index(p.idle, c)
	if i < 0 || time.Since(c.idleSince) < p.idleTimeout {
		p.mu.Unlock()
		return
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	p.mu.Unlock()
	p.log.Debug("slot process idle too long: ending it", "slot", c.id)
	c.kill()
}

// spawn starts a slot process and waits for its hello.
func (p *slotPool) spawn(ctx context.Context) (c *slotProc, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("runner closed")
	}
	p.nextID++
	c = &slotProc{id: p.nextID, dir: filepath.Join(p.baseDir, fmt.Sprintf("slot-%d", p.nextID)),
		stderr: &tailBuffer{max: 8 << 10}, modules: map[string]bool{},
		dead: make(chan struct{}), exited: make(chan struct{})}
	p.all[c] = struct{}{}
	p.procs.Add(1)
	p.mu.Unlock()
	forget := func() {
		os.RemoveAll(c.dir)
		p.mu.Lock()
		delete(p.all, c)
		if c.gate != nil {
			c.gate.unmap()
			c.gate, c.gateGone = nil, true
		}
		p.mu.Unlock()
		c.markDead()
		close(c.exited)
		p.procs.Done()
	}
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		forget()
		return nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		forget()
		return nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		forget()
		return nil, err
	}
	cmd := exec.Command(p.exe, "cyclepool-slot-process")
	cmd.Env = append(os.Environ(), slotEnv+"=1")
	cmd.Stdin, cmd.Stdout = reqR, repW // wire.go
	var gateFile *os.File
	if gateSupported {
		f, g, err := newGateFile(c.dir)
		if err != nil {
			p.log.Warn("slot process without a gate: attempts are not pipelined", "err", err)
		} else {
			gateFile = f
			cmd.ExtraFiles = []*os.File{f} // fd 3
			p.mu.Lock()
			c.gate = g
			p.mu.Unlock()
		}
	}
	cmd.Stderr = c.stderr
	cmd.SysProcAttr = slotSysProcAttr()
	c.cmd, c.reqW, c.enc = cmd, reqW, newWireEncoder(reqW)
	c.repR, c.dec = repR, newWireDecoder(repR)
	err = cmd.Start()
	reqR.Close()
	repW.Close()
	if gateFile != nil {
		gateFile.Close() // the mapping stays
	}
	if err != nil {
		reqW.Close()
		repR.Close()
		forget()
		return nil, err
	}
	c.pmu.Lock()
	c.process = cmd.Process
	if c.killed {
		cmd.Process.Kill()
	}
	c.pmu.Unlock()
	go p.reap(c)

	fail := func(err error) (*slotProc, error) {
		c.kill()
		<-c.exited
		if tail := strings.TrimSpace(string(c.stderr.bytes())); tail != "" {
			err = fmt.Errorf("%w; its stderr: %s", err, lastLines(tail, 3))
		}
		return nil, err
	}
	if err := c.send(&slotRequest{Kind: reqInit, Version: wireVersion, CacheDir: p.cacheDir, Dir: c.dir, DataDir: p.dataDir, Gate: gateFile != nil}); err != nil {
		return fail(err)
	}
	// The hello is read here; the end of ctx, or the time limit, kills the
	// process, which ends the read.
	var late atomic.Bool
	t := time.AfterFunc(helloTimeout, func() { late.Store(true); c.kill() })
	stop := context.AfterFunc(ctx, c.kill)
	m, ok := c.recv()
	t.Stop()
	stop()
	switch {
	case ctx.Err() != nil:
		return fail(ctx.Err())
	case late.Load():
		return fail(fmt.Errorf("slot process did not start within %v", helloTimeout))
	case !ok:
		return fail(fmt.Errorf("slot process exited at start (%s)", c.describeExitWait()))
	case m.Kind != repHello:
		return fail(fmt.Errorf("slot process said %d, not hello", m.Kind))
	case m.Err != "":
		return fail(fmt.Errorf("slot process: %s", m.Err))
	case m.Version != wireVersion:
		return fail(fmt.Errorf("slot process speaks wire version %d, not %d", m.Version, wireVersion))
	}
	p.log.Debug("slot process started", "slot", c.id, "pid", cmd.Process.Pid)
	return c, nil
}

// closeReplies closes the reading end of c's reply pipe, once.
func (c *slotProc) closeReplies() {
	c.repOnce.Do(func() { c.repR.Close() })
}

// reap waits for c to exit and forgets it.
func (p *slotPool) reap(c *slotProc) {
	c.cmd.Wait()
	c.markDead()
	c.reqW.Close()
	// The replies still in the pipe belong to attempts that ended before
	// the process did (a kill for an attempt queued behind them): their
	// Runs read them, then EOF. The pipe is closed once none is left.
	p.mu.Lock()
	drained := len(c.tickets) == 0
	p.mu.Unlock()
	if drained {
		c.closeReplies()
	}
	if err := os.RemoveAll(c.dir); err != nil {
		p.log.Warn("removing a slot directory", "dir", c.dir, "err", err)
	}
	p.mu.Lock()
	delete(p.all, c)
	if i := slices.Index(p.idle, c); i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
	}
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	if c.slow != nil {
		c.slow.Stop()
	}
	if c.gate != nil {
		c.lastStarted, c.gateGone = c.gate.started(), true
		c.gate.unmap()
		c.gate = nil
	}
	p.mu.Unlock()
	close(c.exited)
	p.procs.Done()
}

// closeAll kills every slot process and waits for the Runs and the
// processes to end.
func (p *slotPool) closeAll(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	procs := make([]*slotProc, 0, len(p.all))
	for c := range p.all {
		procs = append(procs, c)
	}
	p.idle = nil
	p.modules = map[string]*moduleBytes{}
	p.mu.Unlock()
	p.close()
	for _, c := range procs {
		c.kill()
	}
	waited := make(chan struct{})
	go func() { p.runs.Wait(); p.procs.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		return fmt.Errorf("headless: attempts or slot processes still running: %w", ctx.Err())
	}
	return os.RemoveAll(p.baseDir)
}

// pids returns the process ids of the slot processes, only those running
// an attempt when busy is true (for tests).
func (p *slotPool) pids(busy ...bool) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for c := range p.all {
		if len(busy) > 0 && busy[0] && !c.running.Load() {
			continue
		}
		c.pmu.Lock()
		if c.process != nil {
			pids = append(pids, c.process.Pid)
		}
		c.pmu.Unlock()
	}
	return pids
}

// send writes a request to c.
func (c *slotProc) send(m *slotRequest) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.enc.Encode(m)
}

// recv reads c's next reply; ok is false once its pipe ended (the process
// exited or was killed). Only c's owner calls it.
func (c *slotProc) recv() (m *slotReply, ok bool) {
	m = new(slotReply)
	if err := c.dec.Decode(m); err != nil {
		return nil, false
	}
	return m, true
}

// kill kills the process (SIGKILL); it is reaped by reap.
func (c *slotProc) kill() {
	c.pmu.Lock()
	c.killed = true
	if c.process != nil {
		c.process.Kill()
	}
	c.pmu.Unlock()
	c.markDead()
}

func (c *slotProc) markDead() { c.deadOnce.Do(func() { close(c.dead) }) }

func (c *slotProc) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// wasKilled reports whether kill was called.
func (c *slotProc) wasKilled() bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.killed
}

// describeExit says how c ended, after it was reaped; killed says whether
// the Runner had killed it.
func (c *slotProc) describeExit(killed bool) string {
	st := c.cmd.ProcessState
	msg := "unknown exit"
	if st != nil {
		msg = st.String()
	}
	tail := strings.TrimSpace(string(c.stderr.bytes()))
	switch {
	case strings.Contains(tail, "out of memory"):
		msg += " (out of memory)"
	case !killed && st != nil && strings.Contains(st.String(), "killed"):
		msg += " (SIGKILL from outside the worker, perhaps the kernel's out-of-memory killer)"
	}
	if tail != "" {
		msg += "; stderr: " + lastLines(tail, 3)
	}
	return msg
}

// outOfAddressSpace reports whether c, exited, ran out of the address
// space it limited itself to (limitAddressSpace): the Go runtime, refused
// address space, ends the process with "fatal error: out of memory".
func (c *slotProc) outOfAddressSpace() bool {
	return addressSpaceLimited && strings.Contains(string(c.stderr.bytes()), "fatal error: out of memory")
}

// describeExitWait is describeExit once c has exited.
func (c *slotProc) describeExitWait() string {
	killed := c.wasKilled()
	<-c.exited
	return c.describeExit(killed)
}

// lastLines returns the first line that starts with "fatal error" or
// "panic", else the last n lines of s, joined with " | ".
func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "fatal error") || strings.HasPrefix(l, "panic") {
			return clip(l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return clip(strings.Join(lines, " | "))
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	b   []byte
}

// Write implements io.Writer.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.b...)
}
