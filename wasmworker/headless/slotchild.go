package headless

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// slotHookCalled records that this process called ServeSlotIfChild (and is
// not a slot process): its executable can serve as a slot process, so New
// may use isolation mode.
var slotHookCalled atomic.Bool

// ServeSlotIfChild makes this process a slot process when the Runner started
// it as one (CYCLEPOOL_SLOT_PROCESS=1 in the environment): it then serves
// attempts on its pipes and exits, never returning. Otherwise it returns at
// once. A binary that uses a Runner in isolation mode calls it first thing
// in main (a test binary: in TestMain, before m.Run), since the Runner starts
// slot processes from the process's own executable.
func ServeSlotIfChild() {
	if os.Getenv(slotEnv) != "1" {
		slotHookCalled.Store(true)
		return
	}
	os.Exit(serveSlot())
}

// slotChild is the state of a slot process: its directories and the pipe
// to the parent. Its engine runs one attempt at a time, without
// WithCloseOnContextDone: the parent kills the process to stop a module.
type slotChild struct {
	dir string // given by the parent, which removes it
	cur string // the attempt directory, with in/ and out/ empty between attempts

	// What the slot knows of cur, so that a small attempt costs few
	// system calls: the input files written for the current attempt (the
	// task cannot write to /in, so they are all there is) and whether
	// out/ was seen empty after the attempt.
	inFiles  []string
	outEmpty bool
	// seq is the Seq of the current attempt's run request, which names
	// the outputs it spills (spillPrefix).
	seq uint32

	dec *wireDecoder // requests; read by one goroutine at a time
	// ahead holds run requests read while an attempt waited for the
	// answer to its checkpoint (pipelined attempts), oldest first.
	ahead []*slotRequest
	gate  *gate // nil without one: every run request is run

	sendMu sync.Mutex
	enc    *wireEncoder
}

// serveSlot is the main function of a slot process; it returns the exit
// status.
func serveSlot() int {
	// One goroutine does the work (below): more Ps only add threads that
	// spin and wake each other around every blocking read of the pipe.
	// A garbage collection still runs: this goroutine allocates, and so
	// assists it and lets its workers run when it blocks.
	// Where the kernel cannot end a slot process with its worker, a
	// watcher does, and it needs a second P to run while an attempt runs
	// compiled code.
	procs := 1
	if watchParent() {
		procs = 2
	}
	runtime.GOMAXPROCS(procs)
	// Signals are for the worker, which stops its slots itself.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	in, out := os.Stdin, os.Stdout
	// Nothing else may write to the reply pipe.
	os.Stdin, os.Stdout = nil, os.Stderr
	c := &slotChild{dec: newWireDecoder(in), enc: newWireEncoder(out)}
	var init slotRequest
	if err := c.dec.Decode(&init); err != nil || init.Kind != reqInit {
		fmt.Fprintf(os.Stderr, "cyclepool slot process: bad first message (%v)\n", err)
		return 2
	}
	if init.Version != wireVersion {
		c.send(&slotReply{Kind: repHello, Version: wireVersion, Err: fmt.Sprintf("wire version %d, parent speaks %d", wireVersion, init.Version)})
		return 2
	}
	stopProfile := startSlotProfile()
	defer stopProfile()
	ctx := context.Background()
	e, err := newEngine(ctx, init.CacheDir, slog.New(slog.DiscardHandler), init.Dir, false)
	if e != nil {
		e.dataDir = init.DataDir
		// Outputs left for the worker to upload go to the pool's
		// directory, which the worker owns: a slot's own is removed when
		// its process ends, maybe before the upload.
		e.spoolDir = filepath.Dir(init.Dir)
	}
	if err == nil {
		c.dir = init.Dir
		c.cur, err = makeAttemptDir(c.dir)
	}
	if err != nil {
		c.send(&slotReply{Kind: repHello, Version: wireVersion, Err: err.Error()})
		return 1
	}
	if init.Gate {
		f := os.NewFile(3, "slot-gate")
		g, err := mapGate(f)
		if f != nil {
			f.Close() // the mapping stays
		}
		if err != nil {
			c.send(&slotReply{Kind: repHello, Version: wireVersion, Err: err.Error()})
			return 1
		}
		c.gate = g
	}
	e.slot = c
	e.memPool = &memPool{}
	c.send(&slotReply{Kind: repHello, Version: wireVersion, Pid: os.Getpid()})

	// One goroutine reads the requests and runs the attempts: a hand-off
	// to another goroutine would cost a wake-up of another thread per
	// message, which is most of the cost of a small attempt. While an
	// attempt runs nothing is read, except the answer to a checkpoint
	// (read by Checkpoint itself); the parent kills the process to stop an
	// attempt, and on Linux the kernel kills it when the parent dies
	// (slotSysProcAttr).
	for {
		var m *slotRequest
		if len(c.ahead) > 0 {
			m = c.ahead[0]
			c.ahead = c.ahead[1:]
		} else {
			m = new(slotRequest)
			if err := c.dec.Decode(m); err != nil {
				// The parent closed the pipe (or died): nothing more to do.
				stopProfile()
				return 0
			}
		}
		switch m.Kind {
		case reqLoad:
			c.load(ctx, e, m)
		case reqRun:
			if c.gate != nil && m.Seq != 0 && !c.gate.tryStart(m.Seq) {
				continue // revoked: the parent runs it elsewhere, or not at all
			}
			c.run(ctx, e, m)
		default:
			fmt.Fprintf(os.Stderr, "cyclepool slot process: unexpected message kind %d\n", m.Kind)
			return 2
		}
	}
}

// slotProfileEnv names a directory: when set, each slot process writes a
// CPU profile of itself there, slot-PID.pprof, covering its first
// slotProfileSecondsEnv seconds (default 30) or its life if shorter (the
// parent usually ends slot processes with SIGKILL, which no profile
// survives; the time limit makes sure the profile is written).
const (
	slotProfileEnv        = "CYCLEPOOL_SLOT_CPUPROFILE"
	slotProfileSecondsEnv = "CYCLEPOOL_SLOT_CPUPROFILE_SECONDS"
)

// startSlotProfile starts the CPU profile asked for by slotProfileEnv and
// returns the function that stops it (idempotent; a no-op without one).
func startSlotProfile() func() {
	dir := os.Getenv(slotProfileEnv)
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("slot-%d.pprof", os.Getpid())))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cyclepool slot process: CPU profile: %v\n", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "cyclepool slot process: CPU profile: %v\n", err)
		f.Close()
		return func() {}
	}
	secs, err := strconv.Atoi(os.Getenv(slotProfileSecondsEnv))
	if err != nil || secs <= 0 {
		secs = 30
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}
	time.AfterFunc(time.Duration(secs)*time.Second, stop)
	return stop
}

// send writes a reply; a slot process whose parent is gone exits.
func (c *slotChild) send(m *slotReply) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.enc.Encode(m); err != nil {
		os.Exit(0)
	}
}

// load compiles a module (from the compilation cache when it is there).
func (c *slotChild) load(ctx context.Context, e *engine, m *slotRequest) {
	b := m.Module
	job := &wasmworker.Job{ModuleID: m.ModuleID, Fetch: func(context.Context) ([]byte, error) { return b, nil }}
	limitAddressSpace(compileRoom)
	_, err := e.compile(ctx, job)
	unlimitAddressSpace()
	r := &slotReply{Kind: repLoaded}
	if err != nil {
		var me *moduleError
		r.Err, r.ModuleErr = err.Error(), errors.As(err, &me)
	}
	c.send(r)
}

// The room in address space a slot process has to compile a module, and to
// run an attempt (see limitAddressSpace). Measured here, a slot process
// takes some 1.5 GiB of address space at start, and an attempt that grows
// its linear memory to a limit of 256 MiB adds about 530 MiB: the memory is
// a Go slice, and each growth copies it, the old one freed only at the next
// collection. An attempt gets three times its memory limit, three times
// its output limit (stdout is kept in Go memory as it grows, and the
// outputs are read into memory to be sent) and 512 MiB for the rest (its
// instance, tables, WASI, checkpoints); a compile gets 4 GiB, some times
// what compiling the largest module wasmcheck accepts takes.
const (
	compileRoom = 4 << 30
	runOverhead = 512 << 20
)

// runRoom is the address space an attempt with limits l may add.
func runRoom(l protocol.Limits) uint64 {
	out := l.OutputBytes
	if out <= 0 {
		out = DefaultOutputBytes
	}
	return 3*uint64(effectiveMemoryPages(l.MemoryPages))*65536 + 3*uint64(out) + runOverhead
}

// effectiveMemoryPages is the memory limit of an attempt whose limits say
// pages (as newAttempt applies it).
func effectiveMemoryPages(pages uint32) uint32 {
	if pages == 0 {
		pages = DefaultMemoryPages
	}
	return min(pages, maxMemoryPages)
}

// run runs one attempt and then empties the attempt directory.
func (c *slotChild) run(ctx context.Context, e *engine, m *slotRequest) {
	job := &wasmworker.Job{Assign: m.Assign, ModuleID: m.ModuleID,
		Fetch: func(context.Context) ([]byte, error) {
			return nil, errors.New("the worker did not send it to the slot process")
		}}
	if m.Host {
		job.Host = c
	}
	var l protocol.Limits
	if m.Assign != nil {
		l = m.Assign.Limits
		job.Upload = l.Uploads()
	}
	c.seq = m.Seq
	limitAddressSpace(runRoom(l))
	start := time.Now()
	o := e.run(ctx, job)
	unlimitAddressSpace()
	c.send(&slotReply{Kind: repDone, Outputs: o.Outputs, Files: o.Files, Reason: o.Reason, Message: o.Message, Took: time.Since(start)})
	c.tidy()
}

// attemptDir returns the directory of the next attempt, with empty in/ and
// out/.
func (c *slotChild) attemptDir() (string, error) {
	if c.cur == "" {
		d, err := makeAttemptDir(c.dir)
		if err != nil {
			return "", err
		}
		c.cur, c.inFiles = d, nil
	}
	c.outEmpty = false
	return c.cur, nil
}

// tidy empties in/ and out/ after an attempt (after its outcome was sent,
// so that it costs the attempt nothing); when that fails, the next attempt
// gets a new directory. The input files are removed by name, and out/ is
// left alone when it was seen empty after the attempt.
func (c *slotChild) tidy() {
	if c.cur == "" {
		return
	}
	var err error
	for _, name := range c.inFiles {
		if err = os.Remove(filepath.Join(c.cur, "in", name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			break
		}
		err = nil
	}
	c.inFiles = c.inFiles[:0]
	if err == nil && !c.outEmpty {
		err = emptyDir(filepath.Join(c.cur, "out"))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cyclepool slot process: emptying %s: %v; using a new directory\n", c.cur, err)
		os.RemoveAll(c.cur)
		c.cur = ""
	}
}

// sendLog relays bytes of the attempt's stderr.
func (c *slotChild) sendLog(p []byte) { c.send(&slotReply{Kind: repLog, Data: p}) }

// memoryRefused tells the parent that the memory limit was hit.
func (c *slotChild) memoryRefused(msg string) { c.send(&slotReply{Kind: repMemory, Message: msg}) }

// Progress implements wasmworker.Host by relaying to the parent.
func (c *slotChild) Progress(f float64) { c.send(&slotReply{Kind: repProgress, Fraction: f}) }

// Started implements wasmworker.Host: the parent tells its worker when it
// hands the attempt over, so the slot process says nothing.
func (c *slotChild) Started() {}

// Checkpoint implements wasmworker.Host by relaying to the parent and
// waiting for its answer (the parent kills the process if the attempt ends
// meanwhile).
func (c *slotChild) Checkpoint(_ context.Context, state []byte) error {
	c.send(&slotReply{Kind: repCheckpoint, Data: state})
	// The attempt runs on the goroutine that reads the requests; while an
	// attempt runs, the parent sends nothing but this answer and the run
	// requests of pipelined attempts, kept for later in order.
	var m *slotRequest
	for {
		m = new(slotRequest)
		if err := c.dec.Decode(m); err != nil {
			os.Exit(0) // the parent is gone
		}
		if m.Kind == reqRun {
			c.ahead = append(c.ahead, m)
			continue
		}
		if m.Kind != reqCheckpointed {
			fmt.Fprintf(os.Stderr, "cyclepool slot process: unexpected message kind %d during an attempt\n", m.Kind)
			os.Exit(2)
		}
		break
	}
	if m.Err != "" {
		return errors.New(m.Err)
	}
	return nil
}
