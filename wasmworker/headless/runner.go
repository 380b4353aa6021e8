// Package headless is the wasmworker.Runner used by `cyclepool worker`: it
// runs task modules with wazero's optimizing compiler, keeps compiled code in
// a compilation cache on disk (so a module is compiled once per machine) and
// in memory (so it is compiled once per process), and implements the task ABI
// of docs/TASK_ABI.md: argv, stdin, stdout, /in, /out, the stderr log, the
// `cyclepool` host functions, deterministic clocks and random numbers, and
// the per-attempt limits.
//
// By default every attempt runs in a slot process (slot.go, slotchild.go,
// wire.go): a child process of the same binary that runs the module at full
// speed and that the worker kills to stop it. A binary using the Runner
// calls ServeSlotIfChild first thing in main.
package headless

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// Default limits, used for every limit the assignment leaves at zero.
const (
	DefaultMemoryPages = 4096             // 256 MiB
	DefaultWall        = time.Hour        // wall time
	DefaultOutputBytes = 64 << 20         // stdout plus files under /out
	DefaultLogBytes    = 1 << 20          // stderr
	maxMemoryPages     = uint32(1) << 16  // 4 GiB, the wasm32 maximum
	maxMessage         = 4 << 10          // longest Outcome.Message
	epochSeconds       = 1_700_000_000    // the wall clock's start, Unix seconds
	clockStep          = int64(1_000_000) // each clock read advances the clock by 1 ms
)

// Config configures a Runner.
type Config struct {
	// CacheDir holds wazero's compilation cache. Empty means an in-memory
	// cache only (modules are compiled again by each process).
	CacheDir string
	// CacheBytes bounds CacheDir, which New prunes (cacheprune.go); 0
	// means DefaultCompileCacheBytes.
	CacheBytes int64
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
	// InProcess runs attempts in this process, stopped by wazero's
	// WithCloseOnContextDone (much slower on tight loops, see
	// docs/TASK_ABI.md, "Cancellation"). The default runs every attempt in
	// a slot process (see slot.go).
	InProcess bool
	// TempDir is where attempt directories (/in and /out) are made. Empty
	// means /dev/shm when it is a writable tmpfs with room, else
	// os.TempDir().
	TempDir string
	// IdleTimeout is how long an idle slot process is kept; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// DataDir is where the data that tasks mount is kept between
	// attempts (data.go). Empty means a directory of the user's cache
	// (os.UserCacheDir), else of os.TempDir().
	DataDir string
	// DataCacheBytes bounds the data cache; 0 means
	// DefaultDataCacheBytes. Data in use is never evicted.
	DataCacheBytes int64
	// CPUShare is the percentage (1 to 100) of CPU time each slot process
	// running an attempt may use: a duty cycle stops it for the rest of
	// every 100 ms (cpushare.go), as a volunteer's browser does with its
	// share. 0 means 100. Below 100 it needs slot processes, on Linux.
	CPUShare int

	// unstoppable turns off wazero's WithCloseOnContextDone in in-process
	// mode. Only benchmarks use it: a running module then cannot be
	// stopped. (Slot processes always run without it.)
	unstoppable bool
}

// DefaultIdleTimeout is how long a slot process stays idle before it exits.
const DefaultIdleTimeout = 10 * time.Minute

// Runner runs task attempts with wazero. It is safe for concurrent use: each
// Run call is one slot.
//
// By default (isolation mode) the Runner itself never runs wasm: each
// attempt runs in a slot process, a child process of the same binary that
// runs modules at full speed, without termination checks, and that the
// Runner kills to cancel the attempt or end it at its wall time. With
// Config.InProcess the attempts run in this process instead.
type Runner struct {
	eng  *engine   // in-process mode
	pool *slotPool // isolation mode
	data *dataCache
}

// engine runs attempts in the calling process: a wazero runtime, its
// compiled modules and compilation cache. The in-process Runner is one; so
// is each slot process.
type engine struct {
	log    *slog.Logger
	cache  wazero.CompilationCache
	rt     wazero.Runtime
	tmpDir string // parent of per-attempt directories
	// spoolDir holds outputs left for the worker to upload (spill);
	// tmpDir when empty.
	spoolDir string
	// dataDir is the data cache's directory, where the blobs a task
	// mounts are (dataCache.prepare put them there).
	dataDir string
	slot    *slotChild // set in a slot process
	// memPool keeps the linear memory of the last attempt for the next
	// (slot processes only: their attempts run one after the other and
	// are never closed from another goroutine).
	memPool *memPool
	// slotCfg is the module configuration of a slot process's attempts
	// (see slotModuleConfig).
	slotCfg *slotModuleConfig

	closing context.Context // cancelled by Close, which stops running attempts
	close   context.CancelFunc
	running sync.WaitGroup

	mu                    sync.Mutex
	modules               map[string]*compiled // by module id
	closed                bool
	rtClosesOnContextDone bool // how rt was made, for memRT
	// memRT compiles, in memory only, the modules that the compilation
	// cache could not write to disk (the worker's disk is full): made on
	// first need (memoryRuntime).
	memRT wazero.Runtime
}

// compiled is a module compiled, or being compiled, by one caller while
// others wait on done.
type compiled struct {
	done chan struct{}
	mod  wazero.CompiledModule
	rt   wazero.Runtime // the runtime that compiled mod, which instantiates it
	err  error
}

// New creates a Runner. In isolation mode (the default) it starts no
// process yet: slot processes start when attempts need them. The binary
// must call ServeSlotIfChild first thing in main (a test binary: in
// TestMain); when it has not, New logs a warning and falls back to
// in-process mode. With cfg.InProcess it creates a wazero runtime with the
// compiler engine, the compilation cache in cfg.CacheDir, WASI preview 1 and
// the `cyclepool` host module.
func New(ctx context.Context, cfg Config) (*Runner, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := checkCPUShare(cfg.CPUShare, cfg.InProcess || !slotHookCalled.Load()); err != nil {
		return nil, err
	}
	if cfg.CacheDir != "" {
		bound := cfg.CacheBytes
		if bound <= 0 {
			bound = DefaultCompileCacheBytes
		}
		pruneCompileCache(cfg.CacheDir, bound, time.Now(), log)
	}
	tmp := cfg.TempDir
	if tmp == "" {
		tmp = defaultTempDir()
	}
	data, err := newDataCache(cfg.DataDir, cfg.DataCacheBytes, log)
	if err != nil {
		return nil, err
	}
	if !cfg.InProcess {
		if slotHookCalled.Load() {
			p, err := newSlotPool(cfg, log, tmp, data.dir)
			if err != nil {
				return nil, err
			}
			return &Runner{pool: p, data: data}, nil
		}
		log.Warn("headless: this binary does not call headless.ServeSlotIfChild; running attempts in-process (slower, see docs/TASK_ABI.md)")
	}
	e, err := newEngine(ctx, cfg.CacheDir, log, tmp, !cfg.unstoppable)
	if err != nil {
		return nil, err
	}
	e.dataDir = data.dir
	return &Runner{eng: e, data: data}, nil
}

// newEngine creates an engine.
func newEngine(ctx context.Context, cacheDir string, log *slog.Logger, tmpDir string, closeOnContextDone bool) (*engine, error) {
	var cache wazero.CompilationCache
	if cacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(cacheDir)
		if err != nil {
			return nil, fmt.Errorf("headless: compilation cache %s: %w", cacheDir, err)
		}
		cache = c
	} else {
		cache = wazero.NewCompilationCache()
	}
	rt, err := newRuntime(ctx, cache, closeOnContextDone)
	if err != nil {
		cache.Close(ctx)
		return nil, err
	}
	e := &engine{log: log, cache: cache, rt: rt, tmpDir: tmpDir, modules: map[string]*compiled{}, rtClosesOnContextDone: closeOnContextDone}
	e.closing, e.close = context.WithCancel(context.Background())
	return e, nil
}

// newRuntime creates a runtime with WASI and the cyclepool host module.
func newRuntime(ctx context.Context, cache wazero.CompilationCache, closeOnContextDone bool) (wazero.Runtime, error) {
	rc := wazero.NewRuntimeConfigCompiler().
		WithCompilationCache(cache).
		// Memory is limited per attempt by the allocator in limits.go; the
		// runtime itself allows the wasm32 maximum so that one compiled
		// module serves attempts with different limits.
		WithMemoryLimitPages(maxMemoryPages).
		WithCloseOnContextDone(closeOnContextDone)
	rt := wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("headless: instantiating WASI: %w", err)
	}
	if err := instantiateHost(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("headless: instantiating the cyclepool host module: %w", err)
	}
	return rt, nil
}

// Run runs one attempt and reports how it ended. It returns promptly, with
// Reason protocol.ReasonCancelled, when ctx is cancelled.
func (r *Runner) Run(ctx context.Context, job *wasmworker.Job) *wasmworker.Outcome {
	if su := job.Assign.Setup; su != nil {
		// The data the task mounts, in the cache before the attempt
		// starts (and kept there until it ends).
		release, o := r.data.prepare(ctx, job.Server, su)
		if o != nil {
			return o
		}
		defer release()
	}
	if r.pool != nil {
		return r.pool.run(ctx, job)
	}
	return r.eng.run(ctx, job)
}

// Holding returns the data blobs in the Runner's cache (wasmworker.DataHolder).
func (r *Runner) Holding() []string { return r.data.holding() }

// Close stops the attempts still running (they end with ReasonWorker),
// waits for them as long as ctx allows, and releases everything: in
// isolation mode it kills every slot process and waits for them to exit.
// Later Runs fail.
func (r *Runner) Close(ctx context.Context) error {
	defer r.data.close()
	if r.pool != nil {
		return r.pool.closeAll(ctx)
	}
	return r.eng.closeAll(ctx)
}

// closeAll stops the attempts still running (they end with ReasonWorker),
// waits for them as long as ctx allows, and releases the runtime, every
// compiled module and the compilation cache.
func (e *engine) closeAll(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.modules = map[string]*compiled{}
	e.mu.Unlock()
	e.close()
	waited := make(chan struct{})
	go func() { e.running.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		return fmt.Errorf("headless: attempts still running: %w", ctx.Err())
	}
	e.mu.Lock()
	memRT := e.memRT
	e.mu.Unlock()
	if memRT != nil {
		_ = memRT.Close(ctx)
	}
	return errors.Join(e.rt.Close(ctx), e.cache.Close(ctx))
}

// memoryRuntime returns the runtime that compiles modules without the disk
// cache, made on first use.
func (e *engine) memoryRuntime(ctx context.Context) (wazero.Runtime, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.memRT == nil {
		rt, err := newRuntime(ctx, wazero.NewCompilationCache(), e.rtClosesOnContextDone)
		if err != nil {
			return nil, err
		}
		e.memRT = rt
	}
	return e.memRT, nil
}

// moduleError marks errors that make the attempt fail with ReasonModule.
type moduleError struct{ err error }

func (e *moduleError) Error() string { return e.err.Error() }
func (e *moduleError) Unwrap() error { return e.err }

// compile returns the compiled module for job.ModuleID, fetching and
// compiling it when this process has not done so yet. Concurrent calls for
// the same module wait for one compilation.
func (e *engine) compile(ctx context.Context, job *wasmworker.Job) (*compiled, error) {
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, errors.New("runner closed")
		}
		c, ok := e.modules[job.ModuleID]
		if !ok {
			c = &compiled{done: make(chan struct{})}
			e.modules[job.ModuleID] = c
			e.mu.Unlock()
			c.err = e.fetchAndCompile(ctx, job, c)
			e.mu.Lock()
			if c.err != nil && e.modules[job.ModuleID] == c {
				delete(e.modules, job.ModuleID) // let a later attempt try again
			}
			e.mu.Unlock()
			close(c.done)
			return c, c.err
		}
		e.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if c.err == nil {
			return c, nil
		}
		// The compiling caller failed. If that was its own cancellation,
		// try again ourselves; otherwise the module is bad for us too.
		if !errors.Is(c.err, context.Canceled) && !errors.Is(c.err, context.DeadlineExceeded) {
			return nil, c.err
		}
	}
}

// fetchVerified fetches the module bytes of job and checks that they hash to
// job.ModuleID. A module the server does not have, or bytes that do not
// match, are moduleErrors (the task's); a fetch that failed otherwise (the
// network, the server's trouble) is the worker's, and charges the task
// nothing.
func fetchVerified(ctx context.Context, job *wasmworker.Job) ([]byte, error) {
	want, ok := strings.CutPrefix(job.ModuleID, "sha256:")
	if !ok || len(want) != 64 {
		return nil, &moduleError{fmt.Errorf("module id %q is not sha256:<64 hex digits>", job.ModuleID)}
	}
	if job.Fetch == nil {
		return nil, &moduleError{errors.New("no way to fetch the module")}
	}
	b, err := job.Fetch(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, wasmworker.ErrNoSuchModule) {
			return nil, &moduleError{fmt.Errorf("fetching module %s: %w", job.ModuleID, err)}
		}
		return nil, fmt.Errorf("could not fetch module %s: %w", job.ModuleID, err)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != strings.ToLower(want) {
		return nil, &moduleError{fmt.Errorf("module bytes hash to sha256:%s, not %s", got, job.ModuleID)}
	}
	return b, nil
}

func (e *engine) fetchAndCompile(ctx context.Context, job *wasmworker.Job, c *compiled) error {
	start := time.Now()
	b, err := fetchVerified(ctx, job)
	if err != nil {
		return err
	}
	fetched := time.Now()

	c.mod, err = e.rt.CompileModule(ctx, b)
	c.rt = e.rt
	var pathErr *fs.PathError
	if err != nil && ctx.Err() == nil && errors.As(err, &pathErr) {
		// The compilation cache could not write the compiled module to
		// disk (the worker's disk is full, or its cache directory is
		// read-only): the worker's trouble, not the module's. Compiled in
		// memory instead, the task runs all the same.
		e.log.Warn("the compilation cache cannot write to disk; compiling in memory", "module", job.ModuleID, "err", err)
		rt, rerr := e.memoryRuntime(ctx)
		if rerr != nil {
			return fmt.Errorf("compiling module %s in memory: %w", job.ModuleID, rerr)
		}
		c.mod, err = rt.CompileModule(ctx, b)
		c.rt = rt
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &moduleError{fmt.Errorf("compiling module %s: %w", job.ModuleID, err)}
	}
	if _, ok := c.mod.ExportedFunctions()["_start"]; !ok {
		c.mod.Close(context.Background())
		return &moduleError{fmt.Errorf("module %s exports no _start function (a task is a WASI command)", job.ModuleID)}
	}
	e.log.Debug("module compiled", "module", job.ModuleID, "bytes", len(b),
		"fetch", fetched.Sub(start), "compile", time.Since(fetched))
	return nil
}

// run runs one attempt in this process.
func (e *engine) run(ctx context.Context, job *wasmworker.Job) (out *wasmworker.Outcome) {
	start := time.Now()
	defer func() { out.Duration = time.Since(start) }()
	fail := func(reason, format string, args ...any) *wasmworker.Outcome {
		return &wasmworker.Outcome{Reason: reason, Message: clip(fmt.Sprintf(format, args...))}
	}
	if job == nil || job.Assign == nil {
		return fail(protocol.ReasonWorker, "no assignment")
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return fail(protocol.ReasonWorker, "runner closed")
	}
	e.running.Add(1)
	e.mu.Unlock()
	defer e.running.Done()
	c, err := e.compile(ctx, job)
	if err != nil {
		if ctx.Err() != nil {
			return fail(protocol.ReasonCancelled, "cancelled before the module was ready")
		}
		var me *moduleError
		if errors.As(err, &me) {
			return fail(protocol.ReasonModule, "%v", err)
		}
		return fail(protocol.ReasonWorker, "%v", err)
	}
	a := newAttempt(e, job, c)
	defer a.cleanup()
	return a.run(ctx)
}

// instantiateHost instantiates the `cyclepool` host module. Its functions
// find the attempt that calls them in the call's context (see attemptKey).
func instantiateHost(ctx context.Context, rt wazero.Runtime) error {
	i32, f64 := api.ValueTypeI32, api.ValueTypeF64
	_, err := rt.NewHostModuleBuilder("cyclepool").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostProgress), []api.ValueType{f64}, nil).
		WithParameterNames("fraction").Export("progress").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostCheckpointDue), nil, []api.ValueType{i32}).
		Export("checkpoint_due").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostCheckpoint), []api.ValueType{i32, i32}, []api.ValueType{i32}).
		WithParameterNames("ptr", "len").Export("checkpoint").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostRestore), []api.ValueType{i32, i32}, []api.ValueType{i32}).
		WithParameterNames("ptr", "cap").Export("restore").
		Instantiate(ctx)
	return err
}

// clip shortens s to at most maxMessage bytes.
func clip(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage] + "…"
}
