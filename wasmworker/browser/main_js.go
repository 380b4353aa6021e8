//go:build js

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall/js"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// bridge holds what the page last told the worker.
type bridge struct {
	mu       sync.Mutex
	settings Settings
	device   DeviceState
	changed  func() // called (without the lock) when settings or device change
	initc    chan initMsg
	stopc    chan struct{}
	stopOnce sync.Once
}

type initMsg struct {
	server, volunteer string
	id, token         string // the identity this page's worker had before, if the page kept it
}

// receive is called by worker.js for every message from the page. It runs
// on the JavaScript event loop and must not block.
func (b *bridge) receive(_ js.Value, args []js.Value) any {
	m := args[0]
	switch m.Get("type").String() {
	case "init":
		b.mu.Lock()
		b.settings = readSettings(m.Get("settings"))
		b.device = readDevice(m.Get("device"))
		b.mu.Unlock()
		init := initMsg{server: m.Get("server").String(), volunteer: m.Get("volunteer").String()}
		if id := m.Get("identity"); id.Type() == js.TypeObject {
			init.id, init.token = stringOf(id.Get("id")), stringOf(id.Get("token"))
		}
		b.initc <- init
	case "device":
		b.mu.Lock()
		b.device = readDevice(m.Get("device"))
		f := b.changed
		b.mu.Unlock()
		if f != nil {
			go f()
		}
	case "settings":
		b.mu.Lock()
		b.settings = readSettings(m.Get("settings"))
		f := b.changed
		b.mu.Unlock()
		if f != nil {
			go f()
		}
	case "stop":
		b.stopOnce.Do(func() { close(b.stopc) })
	}
	return nil
}

// pause returns why work is not allowed now ("" when it is).
func (b *bridge) pause() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return PauseReason(b.settings, b.device)
}

func (b *bridge) share() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.settings.Share
}

func (b *bridge) protocolDevice() protocol.Device {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.device.Protocol(b.settings)
}

func readSettings(v js.Value) Settings {
	s := Settings{Threads: intOr(v.Get("threads"), 1), Share: intOr(v.Get("share"), 100),
		Charging: v.Get("charging").Truthy(), Floor: intOr(v.Get("floor"), 30),
		Metered: v.Get("metered").Truthy(), Hidden: v.Get("hidden").Truthy()}
	s.Threads = min(max(s.Threads, 1), 64)
	s.Share = min(max(s.Share, 10), 100)
	return s
}

func readDevice(v js.Value) DeviceState {
	return DeviceState{Battery: numOrNil(v.Get("battery")), Charging: strOr(v.Get("charging")),
		Connection: strOr(v.Get("connection")), Downlink: numOrNil(v.Get("downlink")), RTT: numOrNil(v.Get("rtt")),
		SaveData: strOr(v.Get("saveData")), Online: strOr(v.Get("online")), Visibility: strOr(v.Get("visibility")),
		Cores: intOr(v.Get("cores"), 0), MemoryGiB: numOrNil(v.Get("memoryGiB")), UserAgent: strOr(v.Get("userAgent")),
		Mobile: v.Get("mobile").Truthy()}
}

func intOr(v js.Value, d int) int {
	if v.Type() != js.TypeNumber {
		return d
	}
	return v.Int()
}

func numOrNil(v js.Value) *float64 {
	if v.Type() != js.TypeNumber {
		return nil
	}
	f := v.Float()
	return &f
}

// stringOf returns v if it is a string, else "".
func stringOf(v js.Value) string {
	if v.Type() != js.TypeString {
		return ""
	}
	return v.String()
}

func strOr(v js.Value) string {
	if v.Type() != js.TypeString {
		return protocol.Unknown
	}
	return v.String()
}

// queuePerThread is the number of attempts accepted ahead of time per
// thread at first, so that a task Web Worker that finishes starts its next
// attempt at once instead of after a dispatch round trip. The queue then
// adapts to the attempts (wasmworker.Config.MaxQueue): up to
// maxQueuePerThread per thread while they are short and small, so that the
// server claims and commits them in larger batches, and down to one per
// thread when they are long. A closed or frozen tab cannot keep that room:
// the server gives nothing to a worker it has not heard from for a little
// over two heartbeat intervals (server/hub.go, reserve), long before the
// lapsed leases of its attempts requeue their tasks, so their retries go to
// live workers (TestBrowserTabClosedResumesFromCheckpoint). Why the queue
// adapts: docs/RATIONALE.md; the browser's figures: docs/BENCHMARKS.md.
const (
	queuePerThread    = 4
	maxQueuePerThread = 32
)

// gather is how long a finished attempt's outcome may wait for others
// while the worker has more to do, so that they travel in one frame and
// the server commits them in one batch (and claims their successors in
// one round): 3 ms cut the CPU per task by 10 to 15% against 1 ms. A lone
// outcome (nothing else running or queued) goes at once.
const gather = 8 * time.Millisecond

func main() {
	self := js.Global()
	b := &bridge{initc: make(chan initMsg, 1), stopc: make(chan struct{})}
	receive := js.FuncOf(b.receive)
	self.Call("cyclepoolReady", receive)
	init := <-b.initc
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	r := newRunner(self.Get("cyclepoolTasks"), b, log)
	b.mu.Lock()
	threads := b.settings.Threads
	b.mu.Unlock()
	w := wasmworker.New(wasmworker.Config{Servers: []string{init.server}, Slots: threads, Queue: queuePerThread * threads,
		MaxQueue: maxQueuePerThread * threads, RunnerQueues: true,
		Kind: protocol.KindBrowser, Runner: r, Device: b.protocolDevice, Volunteer: init.volunteer, Logger: log,
		ID: init.id, Token: init.token,
		Gather: gather})
	r.connected = func() bool { return w.Stats().Connected }
	// A change of settings or device state (the charger unplugged, the tab
	// hidden) stops what the settings now forbid and reaches the server in a
	// heartbeat at once, before it assigns more work.
	b.mu.Lock()
	b.changed = func() {
		r.settingsChanged()
		w.DeviceChanged()
	}
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() {
		_ = w.Run(ctx)
		close(runDone)
	}()

	since := time.Now().UnixMilli()
	// The page hears of the status when it changed: an idle page (waiting
	// for work, or paused) no longer renders and saves its totals four
	// times a second (half of its CPU in headless Chromium, 60 ms a second
	// against 30, measured after the page's first 25 seconds).
	stringify := js.Global().Get("JSON").Get("stringify")
	last := ""
	postStatus := func() (posted bool) {
		st := w.Stats()
		why := b.pause()
		_, cpu := r.snapshot()
		running := r.running()
		list := make([]any, len(running))
		shown := make([]string, len(running))
		for i, a := range running {
			list[i] = map[string]any{"task": a.task, "progress": a.progress, "attempt": a.attempt}
			shown[i] = fmt.Sprint(a.attempt, a.task, a.progress)
		}
		counts := r.tasks.Get("counts")
		trace := r.traced()
		// The page keeps the identity for its next visit (one tab at a time:
		// web/static/page.js).
		id, token := w.Identity()
		key := fmt.Sprint(id, st.Connected, st.Server, st.Done, st.Failed, st.Cancelled, st.Refused, shown, cpu.Milliseconds(), why,
			stringify.Invoke(counts).String(), stringify.Invoke(trace).String())
		if key == last {
			return false
		}
		last = key
		self.Call("postMessage", map[string]any{
			"type": "status", "since": since, "connected": st.Connected, "server": st.Server,
			"done": st.Done, "failed": st.Failed, "cancelled": st.Cancelled, "refused": st.Refused, "running": list,
			"cpuMs": cpu.Milliseconds(), "paused": why != "", "pausedBecause": why, "threads": threads,
			"identity": map[string]any{"id": id, "token": token},
			"taskWorkers": map[string]any{"started": counts.Get("started"), "terminated": counts.Get("terminated"),
				"busy": counts.Get("busy"), "ahead": counts.Get("ahead"), "batches": counts.Get("batches"),
				"sent": counts.Get("sent"), "givenBack": counts.Get("givenBack")},
			"modules": map[string]any{"fetched": counts.Get("fetched"), "cached": counts.Get("cached")},
			"data": map[string]any{"fetched": counts.Get("dataFetched"), "cached": counts.Get("dataCached"),
				"evicted": counts.Get("dataEvicted"), "unkept": counts.Get("dataUnkept")},
			"trace": trace,
		})
		return true
	}
	// Looked at four times a second while the status changes, once a
	// second after two seconds without a change: looking costs the Go
	// worker a wake-up and a few calls into JavaScript, which an idle page
	// paid four times a second for nothing.
	const busyEvery, idleEvery = 250 * time.Millisecond, time.Second
	tick := time.NewTimer(busyEvery)
	defer tick.Stop()
	unchanged := 0
	for {
		select {
		case <-tick.C:
			if postStatus() {
				unchanged = 0
			} else {
				unchanged++
			}
			if unchanged >= 8 {
				tick.Reset(idleEvery)
			} else {
				tick.Reset(busyEvery)
			}
			continue
		case <-b.stopc:
		}
		break
	}
	// Stop: hand running attempts back (reason worker: they are queued again
	// without using up an attempt) and wait, for at most two seconds (the
	// page ends this Web Worker after three), until the server acknowledged
	// every outcome, those reports included. Disconnected, there is nobody
	// to wait for: the leases lapse and the server requeues the attempts.
	r.stopAll("the volunteer stopped computing")
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		running, _ := r.snapshot()
		st := w.Stats() // after the snapshot: an outcome counted there is counted here
		if len(running) == 0 && st.Done+st.Failed >= r.finished() && (st.Pending == 0 || !st.Connected) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	postStatus()
	cancel()
	select {
	case <-runDone:
	case <-time.After(time.Second):
	}
	receive.Release()
}
