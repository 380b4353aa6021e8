//go:build !js

package wasmworker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// sleepRunner runs an attempt by sleeping for d.
type sleepRunner struct{ d time.Duration }

func (r sleepRunner) Run(ctx context.Context, job *Job) *Outcome {
	time.Sleep(r.d)
	return &Outcome{Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("ok")}}, Duration: r.d}
}

// outcomeFrame is a result frame as the fake server saw it.
type outcomeFrame struct {
	outcomes int
}

// fakeServer welcomes one worker (heartbeats every heartbeat), sends it
// the frames first, then hands every frame the worker sends to onFrame, on
// the server's goroutine, and sends back what onFrame returns.
func fakeServer(t *testing.T, heartbeat time.Duration, first []*protocol.Frame,
	onFrame func(*protocol.Frame) []*protocol.Frame) (url string) {
	t.Helper()
	return fakeServerWelcome(t, &protocol.Welcome{WorkerID: "w", HeartbeatMS: int(heartbeat.Milliseconds()), LeaseMS: 60000},
		first, onFrame)
}

// fakeServerWelcome is fakeServer with the welcome given.
func fakeServerWelcome(t *testing.T, welcome *protocol.Welcome, first []*protocol.Frame,
	onFrame func(*protocol.Frame) []*protocol.Frame) (url string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		send := func(fs ...*protocol.Frame) error {
			for _, f := range fs {
				data, bin, err := protocol.Encode(f)
				if err != nil {
					return err
				}
				typ := websocket.MessageText
				if bin {
					typ = websocket.MessageBinary
				}
				if err := ws.Write(ctx, typ, data); err != nil {
					return err
				}
			}
			return nil
		}
		if _, _, err := ws.Read(ctx); err != nil { // hello
			return
		}
		if send(&protocol.Frame{Type: protocol.TypeWelcome, Welcome: welcome}) != nil || send(first...) != nil {
			return
		}
		for {
			typ, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			f, err := protocol.Decode(data, typ == websocket.MessageBinary)
			if err != nil {
				t.Errorf("bad frame from the worker: %v", err)
				return
			}
			if send(onFrame(f)...) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// assign is an assign frame of the attempts from to to (inclusive).
func assign(from, to int64) *protocol.Frame {
	f := &protocol.Frame{Type: protocol.TypeAssign}
	for a := from; a <= to; a++ {
		f.Assign = append(f.Assign, protocol.Assign{Attempt: a, Task: "wf/t", Module: "sha256:00"})
	}
	return f
}

// ackFails acknowledges the outcomes of a fail frame.
func ackFails(f *protocol.Frame) []*protocol.Frame {
	ack := &protocol.Frame{Type: protocol.TypeAck}
	for _, fl := range f.Fails {
		ack.Acks = append(ack.Acks, protocol.Ack{Attempt: fl.Attempt, Of: protocol.AckFail, OK: true})
	}
	return []*protocol.Frame{ack}
}

// Outcomes wait for others (Config.Gather) while the worker has more to
// do, and go as soon as it has nothing else to do: a worker of 4 slots
// whose 20 attempts of 20 ms end in five waves sends them in one frame with
// a long gather, about a wave's in each frame without (or without a queue,
// where gathering would idle its slots), and the last of them well before
// the gather's end; a lone attempt's outcome never waits.
func TestGatherOutcomes(t *testing.T) {
	tests := []struct {
		name     string
		gather   time.Duration
		queue    int
		attempts int
		wantMost func(int) bool // the most outcomes in one frame
	}{
		{"no gather: a wave or two a frame", 0, 16, 20, func(n int) bool { return n <= 8 }},
		{"a long gather: all together", time.Hour, 16, 20, func(n int) bool { return n == 20 }},
		{"no queue: no gather", time.Hour, 0, 20, func(n int) bool { return n <= 8 }},
		{"a lone attempt does not wait", time.Hour, 16, 1, func(n int) bool { return n == 1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			frames := make(chan outcomeFrame, tc.attempts)
			url := fakeServer(t, time.Minute, []*protocol.Frame{assign(1, int64(tc.attempts))}, func(f *protocol.Frame) []*protocol.Frame {
				if f.Type == protocol.TypeResult {
					frames <- outcomeFrame{outcomes: len(f.Results)}
				}
				return nil
			})
			w := New(Config{Servers: []string{url}, Slots: 4, Queue: tc.queue, Kind: protocol.KindHeadless,
				Runner: sleepRunner{20 * time.Millisecond}, Gather: tc.gather, Logger: slog.New(slog.DiscardHandler)})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go w.Run(ctx)
			got, n, most := 0, 0, 0
			// Every outcome must come long before an hour's gather ends:
			// the gather ends when nothing is left to gather.
			timeout := time.After(time.Minute)
			for got < tc.attempts {
				select {
				case f := <-frames:
					got += f.outcomes
					n++
					most = max(most, f.outcomes)
				case <-timeout:
					t.Fatalf("%d of %d outcomes after a minute (gather %v): it waited for the gather to end", got, tc.attempts, tc.gather)
				}
			}
			if !tc.wantMost(most) {
				t.Errorf("%d outcomes came in %d frames, at most %d in one", got, n, most)
			}
		})
	}
}

// blockRunner runs an attempt until its context ends, then reports it
// cancelled, as a Runner must; the first attempt it ran reports a trap
// instead, as one that failed on its own just then would. It records the
// attempts it ran, and which trapped.
type blockRunner struct {
	ran     *sync.Map
	trapped *atomic.Int64
}

func (r blockRunner) Run(ctx context.Context, job *Job) *Outcome {
	r.ran.Store(job.Assign.Attempt, true)
	trap := r.trapped.CompareAndSwap(0, job.Assign.Attempt)
	<-ctx.Done()
	if trap {
		return &Outcome{Reason: protocol.ReasonTrap, Message: "unreachable"}
	}
	return &Outcome{Reason: protocol.ReasonCancelled, Message: "cancelled"}
}

// HandBack reports every attempt, running or queued, as stopped by the
// worker (reason worker), after a heartbeat that says the worker is
// paused; an attempt that ended on its own reports how it ended.
func TestHandBack(t *testing.T) {
	frames := make(chan *protocol.Frame, 64)
	url := fakeServer(t, time.Minute, []*protocol.Frame{assign(1, 3)}, func(f *protocol.Frame) []*protocol.Frame {
		frames <- f
		if f.Type == protocol.TypeFail {
			return ackFails(f)
		}
		return nil
	})
	// Two slots: two attempts run, one waits in the queue.
	var ran sync.Map
	var trapped atomic.Int64
	w := New(Config{Servers: []string{url}, Slots: 2, Queue: 1, Kind: protocol.KindHeadless, Runner: blockRunner{&ran, &trapped},
		Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for w.Stats().Connected == false || len(w.heartbeatSnapshot()) < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the worker did not take its three attempts")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// An hour to hand back: returning within a minute means it did not
	// wait for the time to run out, every report being acknowledged.
	start := time.Now()
	w.HandBack("shutting down", time.Hour)
	if took := time.Since(start); took > time.Minute {
		t.Errorf("HandBack took %v though every report was acknowledged", took)
	}
	paused := false
	reasons := map[int64]string{}
	for len(reasons) < 3 {
		select {
		case f := <-frames:
			switch f.Type {
			case protocol.TypeHeartbeat:
				if len(reasons) == 0 && f.Heartbeat.Device != nil && f.Heartbeat.Device.Paused {
					paused = true
				}
			case protocol.TypeFail:
				for _, fl := range f.Fails {
					reasons[fl.Attempt] = fl.Reason
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("reports: %v, want all three", reasons)
		}
	}
	if !paused {
		t.Error("no paused heartbeat before the reports")
	}
	for a := int64(1); a <= 3; a++ {
		want := protocol.ReasonWorker
		if a == trapped.Load() {
			want = protocol.ReasonTrap // it failed on its own
		}
		if reasons[a] != want {
			t.Errorf("attempt %d reported %q, want %q", a, reasons[a], want)
		}
	}
	n := 0
	ran.Range(func(any, any) bool { n++; return true })
	if n != 2 {
		t.Errorf("%d attempts ran, want 2 (the third queued)", n)
	}
}

// heartbeatSnapshot is what a heartbeat would list now.
func (w *Worker) heartbeatSnapshot() []protocol.Progress {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.heartbeatRunning()
}

// runnerFunc is a Runner made of a function.
type runnerFunc func(ctx context.Context, job *Job) *Outcome

func (f runnerFunc) Run(ctx context.Context, job *Job) *Outcome { return f(ctx, job) }

// runOrBlock runs attempts below 100 for a millisecond, and the others
// until they are stopped.
var runOrBlock = runnerFunc(func(ctx context.Context, job *Job) *Outcome {
	job.Host.Started()
	if job.Assign.Attempt < 100 {
		time.Sleep(time.Millisecond)
		return &Outcome{Outputs: []protocol.Blob{{Name: "stdout"}}, Duration: time.Millisecond}
	}
	<-ctx.Done()
	return &Outcome{Reason: protocol.ReasonCancelled, Message: "cancelled"}
})

// queueServer is a fake server that asks for heartbeats every heartbeat,
// assigns attempts 1 to 8, then next once their 8 results are in and a
// heartbeat asked for a queue of grown, and passes on the queue of every
// heartbeat that carries one. Not next at the results alone: the attempts
// of next could end, and change the queue again, before the heartbeat
// announcing the growth is built (it carries the queue as it is then), and
// the growth would never be seen.
func queueServer(t *testing.T, heartbeat time.Duration, grown int, next *protocol.Frame) (url string, queues <-chan int) {
	t.Helper()
	qs := make(chan int, 256)
	results, grew, sent := 0, false, false
	url = fakeServer(t, heartbeat, []*protocol.Frame{assign(1, 8)}, func(f *protocol.Frame) []*protocol.Frame {
		switch f.Type {
		case protocol.TypeHeartbeat:
			if f.Heartbeat.Queue != nil {
				qs <- *f.Heartbeat.Queue
				grew = grew || *f.Heartbeat.Queue == grown
			}
		case protocol.TypeResult:
			results += len(f.Results)
		}
		if results == 8 && grew && !sent {
			sent = true
			return []*protocol.Frame{next}
		}
		return nil
	})
	return url, qs
}

// The queue a heartbeat asks for follows the attempts: it grows to its
// most while they are short, and the heartbeats shrink it to one per slot
// once long ones have run for a while, before any of them ends.
func TestHeartbeatsCarryTheAdaptedQueue(t *testing.T) {
	url, queues := queueServer(t, 50*time.Millisecond, 64, assign(101, 104)) // long ones, after 8 short ones
	w := New(Config{Servers: []string{url}, Slots: 4, Queue: 4, MaxQueue: 64, Kind: protocol.KindHeadless, Runner: runOrBlock,
		Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	grew := false
	timeout := time.After(30 * time.Second) // a bound on a hang, not on speed
	for {
		select {
		case q := <-queues:
			if q == 64 {
				grew = true
			}
			if grew && q == 4 {
				return
			}
		case <-timeout:
			t.Fatalf("no heartbeat asked for a queue of 4 after one of 64 (grew: %v)", grew)
		}
	}
}

// A change of queue within a second of the last one announced still
// reaches the server, in a heartbeat once the second is over, rather than
// at the next tick (here a minute away): the queue grows to 64 on short
// attempts, is announced, then shrinks on long ones at once.
func TestQueueChangeHeldBackIsAnnouncedLater(t *testing.T) {
	url, queues := queueServer(t, time.Minute, 64, assign(200, 207))
	// Attempts from 200 on say they ran for 200 ms.
	runner := runnerFunc(func(ctx context.Context, job *Job) *Outcome {
		d := time.Millisecond
		if job.Assign.Attempt >= 200 {
			d = 200 * time.Millisecond
		}
		return &Outcome{Outputs: []protocol.Blob{{Name: "stdout"}}, Duration: d}
	})
	w := New(Config{Servers: []string{url}, Slots: 4, Queue: 4, MaxQueue: 64, Kind: protocol.KindHeadless, Runner: runner,
		Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	var grew time.Time
	timeout := time.After(30 * time.Second) // a bound on a hang, not on speed
	for {
		select {
		case q := <-queues:
			switch {
			case q == 64 && grew.IsZero():
				grew = time.Now()
			case !grew.IsZero() && q < 64:
				// The growth's heartbeat may reach the server a while
				// after it was sent, on a loaded machine: not 500 ms.
				if d := time.Since(grew); d < 500*time.Millisecond {
					t.Errorf("the shrink was announced %v after the growth, within the second", d)
				}
				return
			}
		case <-timeout:
			t.Fatalf("no heartbeat announced the shrink (grew at %v)", grew)
		}
	}
}

// Attempts stopped before their end (here cancelled by the server, most
// before they started) say nothing of how long tasks run: their durations
// of about 0 do not grow the queue.
func TestStoppedAttemptsLeaveTheQueueAlone(t *testing.T) {
	fails := make(chan int, 16)
	cancels := &protocol.Frame{Type: protocol.TypeCancel, Cancel: &protocol.Cancel{Attempts: []int64{101, 102, 103, 104, 105, 106},
		Reason: "cancelled by the owner"}}
	url := fakeServer(t, time.Minute, []*protocol.Frame{assign(101, 106), cancels}, func(f *protocol.Frame) []*protocol.Frame {
		if f.Type == protocol.TypeFail {
			fails <- len(f.Fails)
			return ackFails(f)
		}
		return nil
	})
	w := New(Config{Servers: []string{url}, Slots: 2, Queue: 4, MaxQueue: 64, Kind: protocol.KindHeadless, Runner: runOrBlock,
		Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	for n := 0; n < 6; {
		select {
		case k := <-fails:
			n += k
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 6 cancelled attempts reported", n)
		}
	}
	w.mu.Lock()
	q := w.queue
	w.mu.Unlock()
	if q != 4 {
		t.Errorf("queue %d after six cancelled attempts, want 4 as configured", q)
	}
}

// A fresh worker's first attempts wait for their runner (the first slot
// processes to start) longer than a long task runs: the heartbeats
// meanwhile do not take them for long tasks and shrink the queue, as they
// did when an attempt's age counted from the moment it took a slot.
func TestWaitingForTheRunnerIsNotRunning(t *testing.T) {
	queues := make(chan int, 256)
	results := make(chan int, 16)
	url := fakeServer(t, 20*time.Millisecond, []*protocol.Frame{assign(1, 4)}, func(f *protocol.Frame) []*protocol.Frame {
		switch f.Type {
		case protocol.TypeHeartbeat:
			if f.Heartbeat.Queue != nil {
				queues <- *f.Heartbeat.Queue
			}
		case protocol.TypeResult:
			results <- len(f.Results)
		}
		return nil
	})
	// Each attempt waits 400 ms (four times queueAhead) before it starts,
	// then runs for a millisecond.
	runner := runnerFunc(func(ctx context.Context, job *Job) *Outcome {
		time.Sleep(400 * time.Millisecond)
		job.Host.Started()
		time.Sleep(time.Millisecond)
		return &Outcome{Outputs: []protocol.Blob{{Name: "stdout"}}, Duration: time.Millisecond}
	})
	w := New(Config{Servers: []string{url}, Slots: 4, Queue: 32, MaxQueue: 64, Kind: protocol.KindHeadless, Runner: runner,
		Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	timeout := time.After(5 * time.Second)
	for n := 0; n < 4; {
		select {
		case q := <-queues:
			if q < 32 {
				t.Fatalf("a heartbeat shrank the queue to %d while the attempts waited for their runner", q)
			}
		case k := <-results:
			n += k
		case <-timeout:
			t.Fatalf("%d of 4 results", n)
		}
	}
}

// lockedBuffer is a bytes.Buffer that loggers on several goroutines may
// write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Attempts the server cancels are counted as cancelled, not failed, and
// the refusal of their reports (expected: the report only frees their
// slots) is no warning; a refused result still is one. Attempt 101 is
// cancelled while it runs, 102 while it waits for a slot, and 2 just after
// its result went out (the cancel crosses it); the result of 1 is refused.
func TestCancelledAttemptsAreNotFailures(t *testing.T) {
	refuse := func(of string, attempts ...int64) []*protocol.Frame {
		ack := &protocol.Frame{Type: protocol.TypeAck}
		for _, a := range attempts {
			ack.Acks = append(ack.Acks, protocol.Ack{Attempt: a, Of: of, OK: false, Error: "the attempt no longer holds its lease"})
		}
		return []*protocol.Frame{ack}
	}
	url := fakeServer(t, time.Minute, []*protocol.Frame{assign(101, 102)}, func(f *protocol.Frame) []*protocol.Frame {
		switch f.Type {
		case protocol.TypeHeartbeat:
			// The worker runs 101 (its one slot) and queues 102: cancel
			// both, and send attempt 1, whose result is refused.
			if len(f.Heartbeat.Running) == 2 {
				return []*protocol.Frame{{Type: protocol.TypeCancel, Cancel: &protocol.Cancel{Attempts: []int64{101, 102},
					Reason: "cancelled by the owner"}}, assign(1, 2)}
			}
		case protocol.TypeFail:
			var as []int64
			for _, fl := range f.Fails {
				as = append(as, fl.Attempt)
			}
			return refuse(protocol.AckFail, as...)
		case protocol.TypeResult:
			var out []*protocol.Frame
			for _, r := range f.Results {
				if r.Attempt == 2 {
					// Its cancel crossed its result: the refusal is expected.
					out = append(out, &protocol.Frame{Type: protocol.TypeCancel, Cancel: &protocol.Cancel{Attempts: []int64{2},
						Reason: "cancelled by the owner"}})
				}
				out = append(out, refuse(protocol.AckResult, r.Attempt)...)
			}
			return out
		}
		return nil
	})
	var logs lockedBuffer
	w := New(Config{Servers: []string{url}, Slots: 1, Queue: 1, Kind: protocol.KindHeadless, Runner: runOrBlock,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if !w.Stats().Connected {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if len(w.heartbeatSnapshot()) == 2 {
			w.DeviceChanged() // a heartbeat now
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker did not take its two attempts")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for st := w.Stats(); st.Done+st.Failed+st.Cancelled < 4 || st.Pending > 0; st = w.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want four attempts ended and acknowledged", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := w.Stats()
	if st.Done != 2 || st.Cancelled != 2 || st.Failed != 0 || st.Refused != 1 {
		t.Errorf("stats %+v, want 2 done, 2 cancelled, 0 failed, 1 refused", st)
	}
	w.mu.Lock()
	left := len(w.cancelled)
	w.mu.Unlock()
	if left != 0 {
		t.Errorf("%d cancelled outcomes still remembered after their acks", left)
	}
	if got := strings.Count(logs.String(), "result refused"); got != 1 {
		t.Errorf("%d warnings of a refused result, want 1 (attempt 1's):\n%s", got, logs.String())
	}
}

// stallingConn is a connection that buffers its writes (a bufferingConn,
// as the browser's) and whose first write after the hello stalls, then
// fails, as a socket on a network that went away: every later write fails
// at once.
type stallingConn struct {
	conn
	until  <-chan struct{} // the stall lasts until it is closed, and a little more
	writes atomic.Int32
	failed atomic.Bool
}

func (c *stallingConn) buffersWrites() {}

func (c *stallingConn) Write(ctx context.Context, binary bool, data []byte) error {
	if c.writes.Add(1) == 1 {
		return c.conn.Write(ctx, binary, data) // the hello
	}
	if c.failed.Load() {
		return errors.New("connection closed")
	}
	select {
	case <-c.until:
		time.Sleep(50 * time.Millisecond) // for the senders to queue behind this write
	case <-ctx.Done():
	}
	c.failed.Store(true)
	c.conn.CloseNow()
	return errors.New("send stalled")
}

// A connection whose writes fail while attempts end, each sending its
// outcome from its own goroutine, ends its session, and every goroutine of
// that session exits: none waits for good to report its error.
func TestFailingDirectWritesEndTheSession(t *testing.T) {
	url := fakeServer(t, 20*time.Millisecond, []*protocol.Frame{assign(1, 6)}, func(*protocol.Frame) []*protocol.Frame { return nil })
	var ran atomic.Int32
	allRan := make(chan struct{})
	w := New(Config{Servers: []string{url}, Slots: 6, Logger: slog.New(slog.DiscardHandler),
		Runner: runnerFunc(func(context.Context, *Job) *Outcome {
			if ran.Add(1) == 6 {
				close(allRan)
			}
			return &Outcome{}
		})})
	var dials atomic.Int32
	stalled := &stallingConn{until: allRan}
	w.dial = func(ctx context.Context, url, key string) (conn, error) {
		if dials.Add(1) > 1 {
			return nil, errors.New("no more connections in this test")
		}
		c, err := dial(ctx, url, key)
		stalled.conn = c
		return stalled, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for dials.Load() < 2 { // the session ended and the worker tried again
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if n := stalled.writes.Load(); n < 3 {
		t.Fatalf("%d writes: the test wants some to fail after the stalled one", n)
	}
	// The session's goroutines exit once it ended (polled: they may still
	// be on their way out).
	var stacks string
	for range 2000 {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "(*Worker).session.func") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("goroutines of the ended session are still there:\n%s", stacks)
}
