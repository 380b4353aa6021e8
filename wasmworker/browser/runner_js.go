//go:build js

package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall/js"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// Defaults for limits the assignment leaves at 0 (docs/TASK_ABI.md).
const (
	defaultMemoryPages = 4096
	defaultWallMS      = 3_600_000
	defaultOutputBytes = 64 << 20
	defaultLogBytes    = 1 << 20
)

// runner is the browser's wasmworker.Runner: every attempt runs in a task Web
// Worker (web/static/task.js), managed by self.cyclepoolTasks in worker.js.
// Every value that crosses syscall/js costs (a call, a reference with a
// finalizer, a string conversion) and every event that resumes Go costs
// more (its scheduler and timers), so an attempt crosses with one call of
// run as soon as it is assigned (worker.js queues it and runs as many at
// once as there are threads: wasmworker.Config.RunnerQueues), and comes
// back through one long-lived event function, with the other attempts that
// ended meanwhile, packed in one byte array.
type runner struct {
	tasks     js.Value
	run_      js.Value // tasks.run
	terminate js.Value // tasks.terminate
	answer    js.Value // tasks.answer
	events    js.Func  // given to tasks.listen: events of every attempt
	b         *bridge
	log       *slog.Logger
	connected func() bool // whether the worker has a connection now

	mu       sync.Mutex
	runs     map[int64]*taskRun                     // handed to worker.js, waiting or running
	handlers map[int64]func(kind int, a []js.Value) // by attempt: its progress and checkpoint events
	ends     map[int64]chan ended                   // by attempt: where its end goes
	cpu      time.Duration
	ended    int     // Run calls returned (their outcomes go to the worker then)
	returned float64 // ms from done events to Run's return, summed (the trace's last segment)
	stopped  string  // set once the volunteer stopped: every attempt is refused
}

// taskRun is one running attempt, as the page shows it.
type taskRun struct {
	attempt  int64
	task     string
	progress float64
	stop     chan string // a reason the worker stops it (pause, stop)
	kept     []byte      // the latest checkpoint made while disconnected, not yet delivered
	keeping  bool        // a goroutine waits to deliver kept
}

func newRunner(tasks js.Value, b *bridge, log *slog.Logger) *runner {
	r := &runner{tasks: tasks, run_: tasks.Get("run"), terminate: tasks.Get("terminate"), answer: tasks.Get("answer"),
		b: b, log: log, runs: map[int64]*taskRun{}, handlers: map[int64]func(int, []js.Value){}, ends: map[int64]chan ended{}}
	r.events = js.FuncOf(func(_ js.Value, a []js.Value) any {
		if a[1].Int() == eventEnded {
			r.onEnded(bytesFromJS(a[2]))
			return nil
		}
		attempt := int64(a[0].Float())
		r.mu.Lock()
		h := r.handlers[attempt]
		r.mu.Unlock()
		if h == nil {
			// No run of that attempt here (it ended, or was never
			// started): false tells worker.js that a checkpoint
			// waits for an answer nobody else will give.
			return false
		}
		h(a[1].Int(), a[2:])
		return nil
	})
	b.mu.Lock()
	threads := b.settings.Threads
	b.mu.Unlock()
	tasks.Call("listen", r.events, threads)
	return r
}

// ended is how an attempt ended, as worker.js reported it.
type ended struct {
	reason, message string // reason "" on success
	packed          []byte // outputs and log (worker.js's pack)
	ran             time.Duration
	held            time.Duration // of ran, held back by the CPU share; -1: not known
	at              time.Time
}

// onEnded hands the attempts worker.js reports ended (packed by its
// flushEnded) to their Run calls.
func (r *runner) onEnded(b []byte) {
	at := time.Now()
	bad := func() { r.log.Error("worker.js: ended attempts cut short") }
	u32 := func() (uint32, bool) {
		if len(b) < 4 {
			return 0, false
		}
		v := binary.LittleEndian.Uint32(b)
		b = b[4:]
		return v, true
	}
	bytes := func() ([]byte, bool) {
		n, ok := u32()
		if !ok || n == 0xffffffff || uint64(n) > uint64(len(b)) {
			return nil, ok && n == 0xffffffff
		}
		v := b[:n:n]
		b = b[n:]
		return v, true
	}
	count, ok := u32()
	if !ok {
		bad()
		return
	}
	for range count {
		if len(b) < 24 {
			bad()
			return
		}
		attempt := int64(math.Float64frombits(binary.LittleEndian.Uint64(b)))
		ms := math.Float64frombits(binary.LittleEndian.Uint64(b[8:]))
		heldMs := math.Float64frombits(binary.LittleEndian.Uint64(b[16:]))
		b = b[24:]
		reason, ok1 := bytes()
		message, ok2 := bytes()
		packed, ok3 := bytes()
		if !ok1 || !ok2 || !ok3 {
			bad()
			return
		}
		if !(ms >= 0 && ms < math.MaxInt64/float64(time.Millisecond)) {
			ms = 0 // not a run time (NaN, negative, or past any wall time): none
		}
		e := ended{reason: string(reason), message: string(message), packed: packed,
			ran: time.Duration(ms * float64(time.Millisecond)), held: -1, at: at}
		if heldMs >= 0 && heldMs <= ms {
			e.held = time.Duration(heldMs * float64(time.Millisecond))
		}
		r.mu.Lock()
		ch := r.ends[attempt]
		r.mu.Unlock()
		if ch != nil {
			select {
			case ch <- e:
			default:
			}
		}
	}
}

// traced returns where successful attempts' time went inside the browser
// (sums in ms, for the benchmark's browser_path_ms_* figures:
// docs/BENCHMARKS.md): worker.js adds up Run's preparation, the
// postMessage to the task Web Worker, instantiation and WASI set-up,
// _start, collecting outputs and the postMessage back; Go adds the done
// event to Run's return.
func (r *runner) traced() js.Value {
	r.mu.Lock()
	ret := r.returned
	r.mu.Unlock()
	return r.tasks.Call("traced", ret)
}

// snapshot returns the attempts handed to worker.js (waiting for a task
// Web Worker or running) and the CPU time used.
func (r *runner) snapshot() ([]taskRun, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]taskRun, 0, len(r.runs))
	for _, t := range r.runs {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].attempt < out[j].attempt })
	return out, r.cpu
}

// Holding returns the data blobs the page keeps in the Cache API
// (wasmworker.DataHolder): the worker's hello lists them, so that tasks
// reading them come to this volunteer.
// The page reads its cache once at start; the first hello waits for that
// (at most a few seconds: then it says nothing of its data).
func (r *runner) Holding() []string {
	got := make(chan []string, 1)
	var then js.Func
	then = js.FuncOf(func(_ js.Value, args []js.Value) any {
		defer then.Release()
		list := args[0]
		out := make([]string, 0, list.Length())
		for i := range list.Length() {
			out = append(out, list.Index(i).String())
		}
		got <- out
		return nil
	})
	r.tasks.Call("held").Call("then", then)
	select {
	case ids := <-got:
		return ids
	case <-time.After(3 * time.Second):
		return nil
	}
}

// running returns the attempts running in task Web Workers now, as the
// page shows them.
func (r *runner) running() []taskRun {
	list := r.tasks.Call("running")
	n := list.Length()
	on := make(map[int64]bool, n)
	for i := range n {
		on[int64(list.Index(i).Float())] = true
	}
	all, _ := r.snapshot()
	out := all[:0]
	for _, t := range all {
		if on[t.attempt] {
			out = append(out, t)
		}
	}
	return out
}

// settingsChanged stops the running attempts when the volunteer's settings
// now forbid work (the battery ran down, the tab was hidden, ...).
// finished returns how many attempts Run has returned.
func (r *runner) finished() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

func (r *runner) settingsChanged() {
	if why := r.b.pause(); why != "" {
		r.stopAll("volunteer paused: " + why)
	}
}

func (r *runner) stopAll(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if strings.HasPrefix(why, "the volunteer stopped") {
		r.stopped = why
	}
	for _, t := range r.runs {
		select {
		case t.stop <- why:
		default:
		}
	}
}

func fail(start time.Time, reason, format string, args ...any) *wasmworker.Outcome {
	return &wasmworker.Outcome{Reason: reason, Message: fmt.Sprintf(format, args...), Duration: time.Since(start)}
}

// Run hands one attempt to worker.js, which runs it in a task Web Worker
// once one is free, and waits for its outcome, for the attempt's
// cancellation, or for the volunteer to pause; the last two terminate the
// task Web Worker (or drop the attempt if it still waits). worker.js
// enforces the wall time, counted from the attempt's start.
func (r *runner) Run(ctx context.Context, job *wasmworker.Job) *wasmworker.Outcome {
	defer func() {
		r.mu.Lock()
		r.ended++
		r.mu.Unlock()
	}()
	return r.run(ctx, job)
}

// Event kinds of worker.js's events function.
const (
	eventProgress   = 0
	eventCheckpoint = 1
	eventEnded      = 4 // attempts that ended, packed (attempt 0)
)

func (r *runner) run(ctx context.Context, job *wasmworker.Job) *wasmworker.Outcome {
	start := time.Now()
	as := job.Assign
	r.mu.Lock()
	stopped := r.stopped
	r.mu.Unlock()
	if stopped != "" {
		return fail(start, protocol.ReasonWorker, "%s", stopped)
	}
	if why := r.b.pause(); why != "" {
		return fail(start, protocol.ReasonWorker, "volunteer paused: %s", why)
	}
	lim := as.Limits
	if lim.MemoryPages == 0 {
		lim.MemoryPages = defaultMemoryPages
	}
	if lim.WallMS <= 0 {
		lim.WallMS = defaultWallMS
	}
	if lim.OutputBytes <= 0 {
		lim.OutputBytes = defaultOutputBytes
	}
	if lim.LogBytes <= 0 {
		lim.LogBytes = defaultLogBytes
	}
	var inputs any // null when there are none (the usual case)
	if len(as.Inputs) > 0 {
		list := make([]any, 0, len(as.Inputs))
		seen := map[string]bool{}
		for _, in := range as.Inputs {
			if !inputNameOK(in.Name) {
				return fail(start, protocol.ReasonWorker, "input name %q is not a plain file name or a clean absolute path", in.Name)
			}
			if seen[in.Name] {
				return fail(start, protocol.ReasonWorker, "input %q appears twice", in.Name)
			}
			seen[in.Name] = true
			list = append(list, map[string]any{"name": in.Name, "data": bytesToJS(in.Data)})
		}
		inputs = list
	}
	var args any
	if len(as.Args) > 0 {
		list := make([]any, len(as.Args))
		for i, a := range as.Args {
			list[i] = a
		}
		args = list
	}
	tr := &taskRun{attempt: as.Attempt, task: as.Task, stop: make(chan string, 1)}
	done := make(chan ended, 1)
	handle := func(kind int, a []js.Value) {
		switch kind {
		case eventProgress:
			f := a[0].Float()
			r.mu.Lock()
			tr.progress = f
			r.mu.Unlock()
			if job.Host != nil {
				job.Host.Progress(f)
			}
		case eventCheckpoint:
			state, seq := bytesFromJS(a[0]), a[1].Int() // seq: which checkpoint the answer is for
			if r.connected != nil && !r.connected() {
				// Offline: the task goes on at once (the checkpoint is not
				// saved yet: 2 tells task.js to report 1 and wait another
				// interval) and the latest state is delivered on reconnecting.
				r.keep(ctx, job, tr, state)
				r.answer.Invoke(float64(as.Attempt), 2, seq)
				return
			}
			r.mu.Lock()
			tr.kept = nil // superseded
			r.mu.Unlock()
			go func() {
				r.answer.Invoke(float64(as.Attempt), r.checkpoint(ctx, job, tr, state), seq)
			}()
		}
	}
	r.mu.Lock()
	r.handlers[as.Attempt] = handle
	r.ends[as.Attempt] = done
	r.runs[as.Attempt] = tr
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.runs, as.Attempt)
		delete(r.handlers, as.Attempt)
		delete(r.ends, as.Attempt)
		r.mu.Unlock()
	}()

	share := r.b.share()
	var setup any // null for most tasks; else the protocol.Setup as JSON, for worker.js to fetch its data
	if as.Setup != nil {
		b, err := json.Marshal(as.Setup)
		if err != nil {
			return fail(start, protocol.ReasonWorker, "bad setup: %v", err)
		}
		setup = string(b)
	}
	r.run_.Invoke(float64(as.Attempt), as.Module, lim.MemoryPages, args, bytesOrNull(as.Stdin.Data), inputs,
		bytesOrNull(as.Restore.Data), float64(as.Seed>>32), float64(as.Seed&0xffffffff), as.CkptMS, share,
		lim.WallMS, lim.OutputBytes, lim.LogBytes, float64(time.Since(start))/1e6, setup)

	var out *wasmworker.Outcome
	held := time.Duration(-1) // the part of out.Duration the share held back, when task.js says
	select {
	case e := <-done:
		out, held = outcomeOf(e), e.held
		if out.Reason == protocol.ReasonWallTime && out.Message == "" {
			out.Message = fmt.Sprintf("wall time limit of %v exceeded", time.Duration(lim.WallMS)*time.Millisecond)
		}
		if out.Reason == "" {
			r.mu.Lock()
			r.returned += float64(time.Since(e.at)) / 1e6
			r.mu.Unlock()
		}
	case <-ctx.Done():
		r.terminate.Invoke(float64(as.Attempt))
		out = fail(start, protocol.ReasonCancelled, "cancelled")
	case why := <-tr.stop:
		out = fail(start, protocol.ReasonWorker, "%s", why)
		if !r.terminate.Invoke(float64(as.Attempt)).Bool() {
			// It had ended already, its outcome held in worker.js for
			// the next event (terminate sent it just now): deliver that
			// rather than throw a finished result away.
			select {
			case e := <-done:
				out, held = outcomeOf(e), e.held
			case <-time.After(time.Second):
			}
		}
	}
	if out.Reason != "" && out.Reason != protocol.ReasonCancelled {
		// In the page's console: what a volunteer (or a test) sees of it.
		msg := out.Message
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		r.log.Warn("attempt failed", "attempt", as.Attempt, "task", as.Task, "reason", out.Reason, "message", msg, "ran", out.Duration)
	}
	// The CPU time given: the run time less what the share held back, as
	// task.js measured it; for an attempt cut short, the share's part.
	worked := time.Duration(float64(out.Duration) * float64(share) / 100)
	if held >= 0 {
		worked = max(out.Duration-held, 0)
	}
	r.mu.Lock()
	r.cpu += worked
	r.mu.Unlock()
	return out
}

// checkpoint saves a checkpoint made while connected and returns the answer
// for task.js: 0 saved, 1 refused or failed, 2 not saved yet and kept. The
// task waits for that answer, so when the connection ends before the
// server's ack (the ack is then lost with it) the task goes on at once, as
// one made offline, rather than wait for a reconnection: the state is kept
// and delivered on reconnecting.
func (r *runner) checkpoint(ctx context.Context, job *wasmworker.Job, tr *taskRun, state []byte) int {
	if job.Host == nil {
		return 1
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	saved := make(chan error, 1)
	go func() { saved <- job.Host.Checkpoint(cctx, state) }()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case err := <-saved:
			if err != nil {
				r.log.Debug("checkpoint not saved", "task", tr.task, "attempt", tr.attempt, "err", err)
				return 1
			}
			return 0
		case <-t.C:
		}
		if r.connected == nil || r.connected() {
			continue
		}
		cancel()
		if err := <-saved; err == nil {
			return 0 // acknowledged just before the connection ended
		}
		if ctx.Err() != nil {
			return 1
		}
		r.keep(ctx, job, tr, state)
		return 2
	}
}

// keep holds a checkpoint made while disconnected and, once connected again,
// delivers the latest such checkpoint if the attempt is still running (a
// finished attempt's result supersedes it).
func (r *runner) keep(ctx context.Context, job *wasmworker.Job, tr *taskRun, state []byte) {
	r.mu.Lock()
	tr.kept = state
	wait := !tr.keeping
	tr.keeping = true
	r.mu.Unlock()
	if !wait || job.Host == nil {
		return
	}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !r.connected() {
				continue
			}
			r.mu.Lock()
			state, running := tr.kept, r.runs[tr.attempt] == tr
			tr.kept, tr.keeping = nil, false
			r.mu.Unlock()
			if state != nil && running {
				if err := job.Host.Checkpoint(ctx, state); err != nil {
					r.log.Debug("kept checkpoint not saved", "task", tr.task, "attempt", tr.attempt, "err", err)
				}
			}
			return
		}
	}()
}

// outcomeOf converts how an attempt ended: the failure reason ("" on
// success), its message, and the outputs and log packed by worker.js's
// pack. Its duration is its run time in its task Web Worker (not its wait
// for one).
func outcomeOf(e ended) *wasmworker.Outcome {
	o := &wasmworker.Outcome{Duration: e.ran, Reason: e.reason, Message: e.message}
	outputs, log, err := unpack(e.packed)
	if err != nil {
		return &wasmworker.Outcome{Reason: protocol.ReasonWorker, Message: err.Error(), Duration: o.Duration}
	}
	o.Log = log
	if o.Reason == "" {
		o.Outputs = outputs
	}
	return o
}

// unpack reads what worker.js's pack wrote: a uint32 count of outputs, per
// output a uint32 name length, the name, a uint32 data length, the data;
// then a uint32 log length and the log (all little endian). The blobs share
// b's memory.
func unpack(b []byte) (outputs []protocol.Blob, log []byte, err error) {
	next := func() ([]byte, error) {
		if len(b) < 4 {
			return nil, errors.New("task outcome cut short")
		}
		n := binary.LittleEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(n) {
			return nil, errors.New("task outcome cut short")
		}
		v := b[4 : 4+n : 4+n]
		b = b[4+n:]
		return v, nil
	}
	if len(b) < 4 {
		return nil, nil, errors.New("task outcome cut short")
	}
	count := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(count) > uint64(len(b)/8) {
		return nil, nil, fmt.Errorf("task outcome claims %d outputs", count)
	}
	outputs = make([]protocol.Blob, 0, count)
	for range count {
		name, err := next()
		if err != nil {
			return nil, nil, err
		}
		data, err := next()
		if err != nil {
			return nil, nil, err
		}
		outputs = append(outputs, protocol.Blob{Name: string(name), Size: len(data), Data: data})
	}
	if log, err = next(); err != nil {
		return nil, nil, err
	}
	return outputs, log, nil
}

// bytesOrNull is b as a Uint8Array, or null when b is empty.
// inputNameOK accepts an input's name: a plain file name (a file of /in)
// or a clean absolute path outside /in and /out (an upstream output at a
// path of the task's own tree, with a setup).
func inputNameOK(name string) bool {
	if rest, ok := strings.CutPrefix(name, "/"); ok {
		return rest != "" && path.Clean(name) == name && !strings.ContainsAny(name, "\\\x00") &&
			rest != "in" && rest != "out" && !strings.HasPrefix(rest, "in/") && !strings.HasPrefix(rest, "out/")
	}
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\\\x00")
}

func bytesOrNull(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return bytesToJS(b)
}

func bytesToJS(b []byte) js.Value {
	u := js.Global().Get("Uint8Array").New(len(b))
	if len(b) > 0 {
		js.CopyBytesToJS(u, b)
	}
	return u
}

func bytesFromJS(v js.Value) []byte {
	if v.IsUndefined() || v.IsNull() {
		return nil
	}
	b := make([]byte, v.Get("length").Int())
	if len(b) > 0 {
		js.CopyBytesToGo(b, v)
	}
	return b
}
