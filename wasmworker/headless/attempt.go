package headless

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	experimentalsysfs "github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// argv0 is argv[0] of every task: a constant, so that it is the same on
// every runner.
const argv0 = "task"

// attempt is the state of one Run.
type attempt struct {
	e      *engine
	job    *wasmworker.Job
	mod    *compiled
	limits protocol.Limits
	wall   time.Duration
	dir    string // temp dir holding in/ and out/
	ownDir bool   // dir is the attempt's own (not a slot's reused one): removed at the end
	setup  *setupFS

	stop     context.CancelCauseFunc // stops the module early, with a limit error
	mem      *memoryLimit
	stdout   *cappedWriter
	stderr   *cappedWriter
	out      outCount // what the task wrote under /out, counted as it writes
	clock    deterministicClock
	view     fsView // what the task sees of its files' identity and times
	ckptMu   sync.Mutex
	lastCkpt time.Time // start of the attempt or last saved checkpoint

	// deadline is the end of the wall time in a slot process, where no
	// timer enforces it (the parent kills the process): it only decides
	// the outcome of a module that returned after it.
	deadline time.Time
	// touched says whether the task used /in and /out (see touchFS):
	// ownTouched, or in a slot process its slotModuleConfig's.
	touched    *touched
	ownTouched touched
	stdin      bytes.Reader
	files      []wasmworker.OutputFile // outputs spilled to files (spill)
	inline     int64                   // bytes of the outputs kept for the result frame (spills)
}

// touched records whether a task used /in and /out.
type touched struct{ in, out bool }

// testAttemptEnded, when set (by tests, in-process mode), is called with
// every attempt as it ends.
var testAttemptEnded func(*attempt)

// limitError is the cause given to stop when a limit is broken.
type limitError struct{ reason, msg string }

func (e *limitError) Error() string { return e.msg }

func newAttempt(e *engine, job *wasmworker.Job, mod *compiled) *attempt {
	l := job.Assign.Limits
	if l.MemoryPages == 0 {
		l.MemoryPages = DefaultMemoryPages
	}
	l.MemoryPages = min(l.MemoryPages, maxMemoryPages)
	if l.WallMS <= 0 {
		l.WallMS = DefaultWall.Milliseconds()
	}
	if l.OutputBytes <= 0 {
		l.OutputBytes = DefaultOutputBytes
	}
	if l.LogBytes <= 0 {
		l.LogBytes = DefaultLogBytes
	}
	a := &attempt{e: e, job: job, mod: mod, limits: l, wall: time.Duration(l.WallMS) * time.Millisecond}
	a.touched = &a.ownTouched
	a.view.clock = &a.clock
	return a
}

func (a *attempt) cleanup() {
	if a.e.slot != nil && !a.ownDir {
		return // the slot's directories are reused; the slot empties them
	}
	if a.dir != "" {
		if err := os.RemoveAll(a.dir); err != nil {
			a.e.log.Warn("removing attempt directory", "dir", a.dir, "err", err)
		}
	}
}

func (a *attempt) fail(reason, format string, args ...any) *wasmworker.Outcome {
	o := &wasmworker.Outcome{Reason: reason, Message: clip(fmt.Sprintf(format, args...))}
	if a.stderr != nil {
		o.Log = a.stderr.bytes()
	}
	return o
}

func (a *attempt) run(parent context.Context) *wasmworker.Outcome {
	as := a.job.Assign
	prepare := a.prepareDirs
	if as.Setup != nil {
		prepare = a.prepareSetup
	}
	if err := prepare(); err != nil {
		var be *badInputError
		if errors.As(err, &be) {
			return a.fail(protocol.ReasonWorker, "bad assignment: %v", err)
		}
		return a.fail(protocol.ReasonWorker, "preparing /in and /out: %v", err)
	}

	defer func() {
		if testAttemptEnded != nil {
			testAttemptEnded(a)
		}
	}()

	// ctx ends the module: the parent's cancellation, the wall time limit,
	// or stop when a limit is broken. In a slot process nothing but stop
	// can end it (the module has no termination checks; the parent kills
	// the process at the wall time and to cancel), so it needs no timer:
	// the deadline is looked at once the module has returned.
	var ctx context.Context
	var stop context.CancelCauseFunc
	if a.e.slot != nil {
		ctx, stop = context.WithCancelCause(parent)
		a.deadline = time.Now().Add(a.wall)
	} else {
		wallCtx, cancelWall := context.WithTimeout(parent, a.wall)
		defer cancelWall()
		ctx, stop = context.WithCancelCause(wallCtx)
		defer context.AfterFunc(a.e.closing, func() {
			stop(&limitError{protocol.ReasonWorker, "the runner is closing"})
		})()
	}
	defer stop(nil)
	a.stop = stop

	a.mem = &memoryLimit{limit: uint64(a.limits.MemoryPages) * 65536, pool: a.e.memPool}
	if a.e.slot != nil {
		a.mem.onRefuse = a.e.slot.memoryRefused
	}
	// Standard output is held in memory: at most what a result frame
	// carries, whatever the output limit (larger outputs go to files).
	stdoutMax := min(a.limits.OutputBytes, protocol.InlineOutputBytes)
	a.stdout = &cappedWriter{limit: stdoutMax, onFull: func() {
		if stdoutMax < a.limits.OutputBytes {
			stop(&limitError{protocol.ReasonOutput, fmt.Sprintf("stdout limit of %d bytes exceeded: standard output is kept in memory; write larger outputs to files under /out", stdoutMax)})
			return
		}
		stop(&limitError{protocol.ReasonOutput, fmt.Sprintf("output limit of %d bytes exceeded by stdout", a.limits.OutputBytes)})
	}}
	a.stderr = &cappedWriter{limit: a.limits.LogBytes, onFull: func() {
		stop(&limitError{protocol.ReasonLog, fmt.Sprintf("log limit of %d bytes exceeded (stderr)", a.limits.LogBytes)})
	}}
	a.out = outCount{dir: filepath.Join(a.dir, "out"), limit: a.limits.OutputBytes, stdout: a.stdout.size,
		stop: func(le *limitError) { stop(le) }}
	if a.e.slot != nil {
		a.stderr.tee = a.e.slot.sendLog // so that a killed slot's log is not lost
	}
	a.clock.rand.state = as.Seed
	a.stdin.Reset(as.Stdin.Data)

	var cfg wazero.ModuleConfig
	if as.Setup != nil {
		cfg = a.setupModuleConfig()
	} else if a.e.slot != nil {
		// Attempts run one after the other: they share a configuration
		// that reads the current one.
		sc := a.e.slotCfg
		if sc == nil || sc.dir != a.dir {
			sc = newSlotModuleConfig(a.dir)
			a.e.slotCfg = sc
		}
		sc.cur, sc.touched = a, touched{}
		defer func() { sc.cur = nil }()
		a.touched = &sc.touched
		cfg = sc.base
	} else {
		cfg = moduleConfig(a.dir, a.touched, func() *outCount { return &a.out }, func() *fsView { return &a.view }, &a.stdin, a.stdout, a.stderr,
			a.clock.walltime, a.clock.nanotime, a.clock.nanosleep, &a.clock.rand)
	}
	cfg = cfg.WithArgs(append([]string{argv0}, as.Args...)...)

	ctx = context.WithValue(ctx, attemptKey{}, a)
	ictx := experimental.WithMemoryAllocator(ctx, a.mem)
	inst, err := a.instantiate(ictx, cfg)
	if err != nil {
		if parent.Err() != nil {
			return a.fail(protocol.ReasonCancelled, "cancelled")
		}
		if a.mem.refused() {
			return a.fail(protocol.ReasonMemory, "%s", a.mem.message())
		}
		var ee *sys.ExitError
		if errors.As(err, &ee) { // proc_exit from a wasm start function
			return a.exitOutcome(ctx, parent, ee)
		}
		return a.fail(protocol.ReasonModule, "instantiating module: %v", err)
	}
	defer inst.Close(context.Background())

	a.ckptMu.Lock()
	a.lastCkpt = time.Now()
	a.ckptMu.Unlock()
	if a.e.slot == nil && a.job.Host != nil {
		a.job.Host.Started() // in a slot process, the parent tells it
	}
	_, err = inst.ExportedFunction("_start").Call(ctx)
	if err != nil {
		var ee *sys.ExitError
		if errors.As(err, &ee) {
			return a.exitOutcome(ctx, parent, ee)
		}
		if o := a.stopped(ctx, parent); o != nil {
			return o
		}
		return a.fail(protocol.ReasonTrap, "trap: %v", err)
	}
	return a.exitOutcome(ctx, parent, nil)
}

// moduleConfig is the configuration of a module that runs in dir (with in/
// and out/), records its use of them in t, counts its writes to out/ in
// out's (see outCount), shows its files through view's (see fsView) and
// reads and writes the given stdio, clocks and random source: everything
// but argv.
func moduleConfig(dir string, t *touched, out func() *outCount, view func() *fsView, stdin io.Reader, stdout, stderr io.Writer,
	walltime sys.Walltime, nanotime sys.Nanotime, nanosleep sys.Nanosleep, rand io.Reader) wazero.ModuleConfig {
	fsc := wazero.NewFSConfig().(experimentalsysfs.FSConfig).
		WithSysFSMount(&viewFS{sortedFS{touchFS{&roTreeFS{&experimentalsysfs.ReadFS{FS: experimentalsysfs.DirFS(filepath.Join(dir, "in"))}}, &t.in}}, view, mountIn}, "/in").(experimentalsysfs.FSConfig).
		WithSysFSMount(&viewFS{sortedFS{&downLinkFS{touchFS{countFS{experimentalsysfs.DirFS(filepath.Join(dir, "out")), out}, &t.out}}}, view, mountOut}, "/out")
	return wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(). // _start is called by run, to tell instantiation from running
		WithStdin(stdin).
		WithStdout(stdout).
		WithStderr(stderr).
		WithFSConfig(fsc).
		WithWalltime(walltime, clockResolution).
		WithNanotime(nanotime, clockResolution).
		WithNanosleep(nanosleep).
		WithOsyield(func() {}).
		WithRandSource(rand)
}

// slotModuleConfig is the module configuration of the attempts of a slot
// process in one directory, built once: its stdio, clocks, random source
// and touch records are those of the attempt in cur, so that an attempt
// only adds its argv (building a configuration takes a dozen copies of it
// and was a few percent of a small attempt's CPU).
type slotModuleConfig struct {
	dir     string
	base    wazero.ModuleConfig
	cur     *attempt // the attempt running, set by run
	touched touched  // cur's
}

func newSlotModuleConfig(dir string) *slotModuleConfig {
	sc := &slotModuleConfig{dir: dir}
	sc.base = moduleConfig(dir, &sc.touched, func() *outCount { return &sc.cur.out }, func() *fsView { return &sc.cur.view }, curStdin{sc}, curStdout{sc}, curStderr{sc},
		func() (int64, int32) { return sc.cur.clock.walltime() },
		func() int64 { return sc.cur.clock.nanotime() },
		func(ns int64) { sc.cur.clock.nanosleep(ns) },
		curRand{sc})
	return sc
}

// The stdio and random source of a slotModuleConfig's current attempt.
type (
	curStdin  struct{ sc *slotModuleConfig }
	curStdout struct{ sc *slotModuleConfig }
	curStderr struct{ sc *slotModuleConfig }
	curRand   struct{ sc *slotModuleConfig }
)

func (r curStdin) Read(p []byte) (int, error)   { return r.sc.cur.stdin.Read(p) }
func (w curStdout) Write(p []byte) (int, error) { return w.sc.cur.stdout.Write(p) }
func (w curStderr) Write(p []byte) (int, error) { return w.sc.cur.stderr.Write(p) }
func (r curRand) Read(p []byte) (int, error)    { return r.sc.cur.clock.rand.Read(p) }

// size returns the number of bytes captured.
func (w *cappedWriter) size() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(len(w.buf))
}

// instantiate instantiates the module, turning a panic of wazero's memory
// set-up (our allocator refuses the module's declared minimum) into an error.
func (a *attempt) instantiate(ctx context.Context, cfg wazero.ModuleConfig) (inst api.Module, err error) {
	defer func() {
		if p := recover(); p != nil {
			if !a.mem.refused() {
				panic(p)
			}
			inst, err = nil, fmt.Errorf("memory allocation refused: %v", p)
		}
	}()
	return a.mod.rt.InstantiateModule(ctx, a.mod.mod, cfg)
}

// stopped returns the outcome of a module stopped from outside (cancel, a
// broken limit, the wall time), or nil when it was not stopped.
func (a *attempt) stopped(ctx, parent context.Context) *wasmworker.Outcome {
	if parent.Err() != nil {
		return a.fail(protocol.ReasonCancelled, "cancelled")
	}
	if a.mem.refused() {
		return a.fail(protocol.ReasonMemory, "%s", a.mem.message())
	}
	var le *limitError
	if errors.As(context.Cause(ctx), &le) {
		return a.fail(le.reason, "%s", le.msg)
	}
	if ctx.Err() != nil || !a.deadline.IsZero() && time.Now().After(a.deadline) {
		return a.fail(protocol.ReasonWallTime, "wall time limit of %v exceeded", a.wall)
	}
	return nil
}

// exitOutcome is the outcome of a module that exited (ee nil: _start returned).
func (a *attempt) exitOutcome(ctx, parent context.Context, ee *sys.ExitError) *wasmworker.Outcome {
	if o := a.stopped(ctx, parent); o != nil {
		return o
	}
	if ee != nil && ee.ExitCode() != 0 {
		o := a.fail(protocol.ReasonExit, "exit code %d", ee.ExitCode())
		if last := lastLine(o.Log); last != "" {
			o.Message = clip(o.Message + ": " + last)
		}
		return o
	}
	outputs, err := a.collectOutputs()
	if err == nil && a.setup != nil {
		outputs, err = a.collectSetupOutputs(outputs)
	}
	if err != nil {
		a.dropSpilled()
		var le *limitError
		if errors.As(err, &le) {
			return a.fail(le.reason, "%s", le.msg)
		}
		if errors.Is(err, syscall.ENAMETOOLONG) {
			// The task's doing, on any worker: it can make a tree deeper
			// than a host path reaches (it moves a deep tree to the end
			// of another). As the worker's, the attempt would be handed
			// back, charged to no one, for ever.
			return a.fail(protocol.ReasonOutput, "output path too long: the task left a file or directory among its outputs deeper than the worker's file system can reach (a path of the host holds at most 4,096 bytes)")
		}
		return a.fail(protocol.ReasonWorker, "collecting outputs: %v", err)
	}
	return &wasmworker.Outcome{Outputs: outputs, Files: a.files, Log: a.stderr.bytes()}
}

// lastLine returns the last non-empty line of a log, at most 200 bytes.
func lastLine(log []byte) string {
	s := strings.TrimRight(string(log), "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
