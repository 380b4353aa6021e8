//go:build js

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
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
// finalizer, a string conversion), so an attempt crosses with one call of
// run and comes back through one long-lived event function, and its
// outputs as one packed byte array.
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
	runs     map[int64]*taskRun
	handlers map[int64]func(kind int, a []js.Value) // by attempt: its events
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
		b: b, log: log, runs: map[int64]*taskRun{}, handlers: map[int64]func(int, []js.Value){}}
	r.events = js.FuncOf(func(_ js.Value, a []js.Value) any {
		attempt := int64(a[0].Float())
		r.mu.Lock()
		h := r.handlers[attempt]
		r.mu.Unlock()
		if h != nil {
			h(a[1].Int(), a[2:])
		}
		return nil
	})
	tasks.Call("listen", r.events)
	return r
}

// traced returns where successful attempts' time went inside the browser
// (sums in ms, for the benchmark: docs/BENCHMARKS.md, "Where a browser
// task's millisecond goes"): worker.js adds up Run's preparation, the
// postMessage to the task Web Worker, instantiation and WASI set-up,
// _start, collecting outputs and the postMessage back; Go adds the done
// event to Run's return.
func (r *runner) traced() js.Value {
	r.mu.Lock()
	ret := r.returned
	r.mu.Unlock()
	return r.tasks.Call("traced", ret)
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

// Event kinds of worker.js's events function.
const (
	eventProgress   = 0
	eventCheckpoint = 1
	eventDone       = 2
	eventStarted    = 3 // after its module compiled, for an attempt whose run returned false
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
			if in.Name == "" || in.Name == "." || in.Name == ".." || strings.ContainsAny(in.Name, "/\\\x00") {
				return fail(start, protocol.ReasonWorker, "input name %q is not a plain file name", in.Name)
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
	wall := time.NewTimer(time.Duration(lim.WallMS) * time.Millisecond)
	defer wall.Stop()

	tr := &taskRun{attempt: as.Attempt, task: as.Task, stop: make(chan string, 1)}
	type doneMsg struct {
		out *wasmworker.Outcome
		at  time.Time
	}
	done := make(chan doneMsg, 1)
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
			state := bytesFromJS(a[0])
			if r.connected != nil && !r.connected() {
				// Offline: the task goes on at once (the checkpoint is not
				// saved yet: 2 tells task.js to report 1 and wait another
				// interval) and the latest state is delivered on reconnecting.
				r.keep(ctx, job, tr, state)
				r.answer.Invoke(float64(as.Attempt), 2)
				return
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
				r.answer.Invoke(float64(as.Attempt), code)
			}()
		case eventDone:
			done <- doneMsg{out: outcomeFromJS(a[0], a[1], a[2], start), at: time.Now()}
		case eventStarted:
			r.mu.Lock()
			r.runs[as.Attempt] = tr
			r.mu.Unlock()
		}
	}
	r.mu.Lock()
	r.handlers[as.Attempt] = handle
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.runs, as.Attempt)
		delete(r.handlers, as.Attempt)
		r.mu.Unlock()
	}()

	share := r.b.share()
	// The attempt counts as running (the page shows it) once its task Web
	// Worker has it: at once when its module is compiled already, or on
	// the started event.
	if r.run_.Invoke(float64(as.Attempt), as.Module, lim.MemoryPages, args, bytesOrNull(as.Stdin.Data), inputs,
		bytesOrNull(as.Restore.Data), float64(as.Seed>>32), float64(as.Seed&0xffffffff), as.CkptMS, share,
		lim.WallMS, lim.OutputBytes, lim.LogBytes, float64(time.Since(start))/1e6).Truthy() {
		r.mu.Lock()
		r.runs[as.Attempt] = tr
		r.mu.Unlock()
	}

	var out *wasmworker.Outcome
	select {
	case d := <-done:
		out = d.out
		if out.Reason == "" {
			r.mu.Lock()
			r.returned += float64(time.Since(d.at)) / 1e6
			r.mu.Unlock()
		}
	case <-ctx.Done():
		r.terminate.Invoke(float64(as.Attempt))
		out = fail(start, protocol.ReasonCancelled, "cancelled")
	case <-wall.C:
		r.terminate.Invoke(float64(as.Attempt))
		out = fail(start, protocol.ReasonWallTime, "wall time limit of %v exceeded", time.Duration(lim.WallMS)*time.Millisecond)
	case why := <-tr.stop:
		r.terminate.Invoke(float64(as.Attempt))
		out = fail(start, protocol.ReasonWorker, "%s", why)
	}
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

// outcomeFromJS converts worker.js's done event: the failure reason (null
// on success), its message, and the outputs and log packed by worker.js's
// pack.
func outcomeFromJS(reason, message, packed js.Value, start time.Time) *wasmworker.Outcome {
	o := &wasmworker.Outcome{Duration: time.Since(start)}
	if reason.Type() == js.TypeString {
		o.Reason, o.Message = reason.String(), message.String()
	}
	outputs, log, err := unpack(bytesFromJS(packed))
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
