//go:build js

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
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
type runner struct {
	tasks     js.Value
	b         *bridge
	log       *slog.Logger
	connected func() bool // whether the worker has a connection now

	mu      sync.Mutex
	runs    map[int64]*taskRun
	cpu     time.Duration
	ended   int // Run calls returned (their outcomes go to the worker then)
	trace   pathTrace
	stopped string // set once the volunteer stopped: every attempt is refused
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
	return &runner{tasks: tasks, b: b, log: log, runs: map[int64]*taskRun{}}
}

// pathTrace adds up where successful attempts' time went inside the browser
// (ms), for the benchmark (docs/BENCHMARKS.md, "Where a browser task's time
// goes"): Run's start to the task Web Worker being handed the attempt
// (module compile or cache, inputs), the postMessage to it, instantiation
// and WASI set-up, _start, collecting outputs, the postMessage back, and the
// done message to Run's return.
type pathTrace struct {
	N                                                        int
	Prepare, ToTask, Instantiate, Run, Collect, Back, Return float64
	LastRun                                                  float64 // the last attempt's _start
}

func (t pathTrace) js() map[string]any {
	return map[string]any{"n": t.N, "prepare": t.Prepare, "toTask": t.ToTask, "instantiate": t.Instantiate,
		"run": t.Run, "collect": t.Collect, "back": t.Back, "return": t.Return, "lastRun": t.LastRun}
}

// snapshot returns the running attempts, by attempt id, and the CPU time
// given so far.
func (r *runner) traced() pathTrace {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.trace
}

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

// Run runs one attempt in a task Web Worker and waits for its outcome, for
// the attempt's cancellation, for its wall time, or for the volunteer to
// pause; the last three terminate the task Web Worker.
func (r *runner) Run(ctx context.Context, job *wasmworker.Job) *wasmworker.Outcome {
	defer func() {
		r.mu.Lock()
		r.ended++
		r.mu.Unlock()
	}()
	return r.run(ctx, job)
}

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
	inputs := js.Global().Get("Array").New()
	seen := map[string]bool{}
	for _, in := range as.Inputs {
		if in.Name == "" || in.Name == "." || in.Name == ".." || strings.ContainsAny(in.Name, "/\\\x00") {
			return fail(start, protocol.ReasonWorker, "input name %q is not a plain file name", in.Name)
		}
		if seen[in.Name] {
			return fail(start, protocol.ReasonWorker, "input %q appears twice", in.Name)
		}
		seen[in.Name] = true
		inputs.Call("push", map[string]any{"name": in.Name, "data": bytesToJS(in.Data)})
	}
	wall := time.NewTimer(time.Duration(lim.WallMS) * time.Millisecond)
	defer wall.Stop()

	mod, err := await(ctx, r.tasks.Call("compile", as.Module, lim.MemoryPages))
	if ctx.Err() != nil {
		return fail(start, protocol.ReasonCancelled, "cancelled")
	}
	if err != nil {
		return fail(start, protocol.ReasonModule, "%v", err)
	}

	tr := &taskRun{attempt: as.Attempt, task: as.Task, stop: make(chan string, 1)}
	r.mu.Lock()
	r.runs[as.Attempt] = tr
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.runs, as.Attempt)
		r.mu.Unlock()
	}()

	args := make([]any, len(as.Args))
	for i, a := range as.Args {
		args[i] = a
	}
	share := r.b.share()
	params := map[string]any{
		"module": mod, "args": args, "stdin": bytesToJS(as.Stdin.Data), "inputs": inputs,
		"restore": bytesToJS(as.Restore.Data), "seed": strconv.FormatUint(as.Seed, 10), "ckptMs": as.CkptMS, "share": share,
		"limits": map[string]any{"memoryPages": lim.MemoryPages, "wallMs": lim.WallMS,
			"outputBytes": lim.OutputBytes, "logBytes": lim.LogBytes},
	}

	type doneMsg struct {
		out *wasmworker.Outcome
		at  time.Time
		t   [6]float64 // task.js's and worker.js's clock readings
	}
	done := make(chan doneMsg, 1)
	var handle js.Value
	onEvent := js.FuncOf(func(_ js.Value, a []js.Value) any {
		m := a[0]
		switch m.Get("type").String() {
		case "progress":
			f := m.Get("f").Float()
			r.mu.Lock()
			tr.progress = f
			r.mu.Unlock()
			if job.Host != nil {
				job.Host.Progress(f)
			}
		case "checkpoint":
			state := bytesFromJS(m.Get("state"))
			h := handle
			if r.connected != nil && !r.connected() {
				// Offline: the task goes on at once (the checkpoint is not
				// saved yet: 2 tells task.js to report 1 and wait another
				// interval) and the latest state is delivered on reconnecting.
				r.keep(ctx, job, tr, state)
				h.Call("answer", 2)
				return nil
			}
			r.mu.Lock()
			tr.kept = nil // superseded
			r.mu.Unlock()
			go func() {
				code := 1
				if job.Host != nil {
					if err := job.Host.Checkpoint(ctx, state); err == nil {
						code = 0
					} else {
						r.log.Debug("checkpoint not saved", "task", as.Task, "attempt", as.Attempt, "err", err)
					}
				}
				h.Call("answer", code)
			}()
		case "done":
			d := doneMsg{out: outcomeFromJS(m, start), at: time.Now()}
			if t := m.Get("t"); t.Type() == js.TypeObject {
				for i, k := range []string{"posted", "recv", "started", "ran", "sent", "back"} {
					if v := t.Get(k); v.Type() == js.TypeNumber {
						d.t[i] = v.Float()
					}
				}
			}
			done <- d
		}
		return nil
	})
	prepared := time.Now()
	handle = r.tasks.Call("run", params, onEvent)

	var out *wasmworker.Outcome
	select {
	case d := <-done:
		out = d.out
		if out.Reason == "" && d.t[0] > 0 && d.t[5] > 0 {
			ms := func(a, b time.Time) float64 { return float64(b.Sub(a)) / 1e6 }
			r.mu.Lock()
			tr := &r.trace
			tr.N++
			tr.Prepare += ms(start, prepared)
			tr.ToTask += d.t[1] - d.t[0]
			tr.Instantiate += d.t[2] - d.t[1]
			tr.Run += d.t[3] - d.t[2]
			tr.LastRun = d.t[3] - d.t[2]
			tr.Collect += d.t[4] - d.t[3]
			tr.Back += d.t[5] - d.t[4]
			tr.Return += ms(d.at, time.Now())
			r.mu.Unlock()
		}
	case <-ctx.Done():
		handle.Call("terminate")
		out = fail(start, protocol.ReasonCancelled, "cancelled")
	case <-wall.C:
		handle.Call("terminate")
		out = fail(start, protocol.ReasonWallTime, "wall time limit of %v exceeded", time.Duration(lim.WallMS)*time.Millisecond)
	case why := <-tr.stop:
		handle.Call("terminate")
		out = fail(start, protocol.ReasonWorker, "%s", why)
	}
	// A terminated task Web Worker sends nothing more; a finished one has
	// sent its last message. Either way the callback can go.
	onEvent.Release()
	r.mu.Lock()
	r.cpu += time.Duration(float64(out.Duration) * float64(share) / 100)
	r.mu.Unlock()
	return out
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

// outcomeFromJS converts task.js's done message.
func outcomeFromJS(m js.Value, start time.Time) *wasmworker.Outcome {
	o := &wasmworker.Outcome{Reason: m.Get("reason").String(), Message: m.Get("message").String(),
		Log: bytesFromJS(m.Get("log")), Duration: time.Since(start)}
	if o.Reason == "" {
		outs := m.Get("outputs")
		for i := 0; i < outs.Length(); i++ {
			e := outs.Index(i)
			data := bytesFromJS(e.Get("data"))
			o.Outputs = append(o.Outputs, protocol.Blob{Name: e.Get("name").String(), Size: len(data), Data: data})
		}
	}
	return o
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

// await waits for a JavaScript promise.
func await(ctx context.Context, p js.Value) (js.Value, error) {
	type result struct {
		v   js.Value
		err error
	}
	ch := make(chan result, 1)
	var then, catch js.Func
	then = js.FuncOf(func(_ js.Value, a []js.Value) any {
		ch <- result{v: a[0]}
		return nil
	})
	catch = js.FuncOf(func(_ js.Value, a []js.Value) any {
		msg := "error"
		if len(a) > 0 {
			msg = a[0].Call("toString").String()
		}
		ch <- result{err: errors.New(msg)}
		return nil
	})
	p.Call("then", then, catch)
	release := func() { then.Release(); catch.Release() }
	select {
	case r := <-ch:
		release()
		return r.v, r.err
	case <-ctx.Done():
		go func() { <-ch; release() }() // released once the promise settles
		return js.Undefined(), ctx.Err()
	}
}
