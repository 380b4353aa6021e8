package headless

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
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

	hooks slotHooks // for tests
}

// slotHooks are functions a test may set (before any Run) that a Run calls
// at points where the test wants to stop its attempt. Each is given the
// slot process that runs the attempt.
type slotHooks struct {
	running func(*slotProc) // the run request sent, before any reply is read
	done    func(*slotProc) // the done reply read, before the Run takes it
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
	if cfg.CPUShare > 0 && cfg.CPUShare < 100 {
		go p.dutyCycle(cfg.CPUShare)
	}
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
		// The outputs it spilled, if any, are nobody's now.
		p.dropSpills(c, t, job)
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
			// No limit of ours: as far as the worker can tell the task
			// brought its process down (the kernel's out-of-memory
			// killer, say). A loss of the task's, not the worker's.
			o = failOutcome(protocol.ReasonCrashed, "the slot process running the attempt died: %s", msg)
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
	if p.hooks.running != nil {
		p.hooks.running(c)
	}
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
			if p.hooks.done != nil {
				p.hooks.done(c)
			}
			if !stopKill() && p.killedFor(t) {
				return ended() // killed meanwhile: the kill's reason wins (and its files go)
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

// dropSpills removes the outputs t's attempt (of job) spilled in c for the
// worker to upload, once c is gone and the attempt ended without its
// outcome taking them (as Files): c was killed or died while it collected
// them, or after it sent them but before they were taken (a cancel or the
// wall time won). The attempt is the files' only owner then, and nobody
// would remove them before the worker exits. The files of c's other
// attempts are left alone: an attempt whose outcome was taken gave its
// files to its worker, which may be uploading them.
func (p *slotPool) dropSpills(c *slotProc, t *ticket, job *wasmworker.Job) {
	if t.seq == 0 || !job.Assign.Limits.Uploads() {
		return // never run, or spills nothing (slotChild.run)
	}
	dir, prefix := filepath.Dir(c.dir), spillPrefix(c.dir, t.seq)
	entries, err := os.ReadDir(dir)
	if err != nil {
		p.log.Warn("looking for the outputs an ended attempt spilled", "dir", dir, "err", err)
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		f := filepath.Join(dir, e.Name())
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			p.log.Warn("removing an output an ended attempt spilled", "file", f, "err", err)
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
