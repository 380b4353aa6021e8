//go:build !js

package wasmworker

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
	at       time.Time
	outcomes int
}

// fakeServer welcomes one worker, sends it one assign frame of n attempts
// and reports every result frame it receives.
func fakeServer(t *testing.T, n int) (url string, frames <-chan outcomeFrame) {
	t.Helper()
	ch := make(chan outcomeFrame, n)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		send := func(f *protocol.Frame) error {
			data, bin, err := protocol.Encode(f)
			if err != nil {
				return err
			}
			typ := websocket.MessageText
			if bin {
				typ = websocket.MessageBinary
			}
			return ws.Write(ctx, typ, data)
		}
		if _, _, err := ws.Read(ctx); err != nil { // hello
			return
		}
		if send(&protocol.Frame{Type: protocol.TypeWelcome, Welcome: &protocol.Welcome{WorkerID: "w", HeartbeatMS: 60000,
			LeaseMS: 60000}}) != nil {
			return
		}
		as := make([]protocol.Assign, n)
		for i := range as {
			as[i] = protocol.Assign{Attempt: int64(i + 1), Task: "wf/t", Module: "sha256:00"}
		}
		if send(&protocol.Frame{Type: protocol.TypeAssign, Assign: as}) != nil {
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
			if f.Type == protocol.TypeResult {
				ch <- outcomeFrame{at: time.Now(), outcomes: len(f.Results)}
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ch
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
		{"a long gather: all together", 10 * time.Second, 16, 20, func(n int) bool { return n == 20 }},
		{"no queue: no gather", 10 * time.Second, 0, 20, func(n int) bool { return n <= 8 }},
		{"a lone attempt does not wait", 10 * time.Second, 16, 1, func(n int) bool { return n == 1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url, frames := fakeServer(t, tc.attempts)
			w := New(Config{Servers: []string{url}, Slots: 4, Queue: tc.queue, Kind: protocol.KindHeadless,
				Runner: sleepRunner{20 * time.Millisecond}, Gather: tc.gather, Logger: slog.New(slog.DiscardHandler)})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Now()
			go w.Run(ctx)
			got, n, most := 0, 0, 0
			var last time.Time
			timeout := time.After(5 * time.Second)
			for got < tc.attempts {
				select {
				case f := <-frames:
					got += f.outcomes
					n++
					most = max(most, f.outcomes)
					last = f.at
				case <-timeout:
					t.Fatalf("%d of %d outcomes within 5 s (gather %v)", got, tc.attempts, tc.gather)
				}
			}
			if !tc.wantMost(most) {
				t.Errorf("%d outcomes came in %d frames, at most %d in one", got, n, most)
			}
			if took := last.Sub(start); took > 3*time.Second {
				t.Errorf("the last outcome came after %v: it waited for the gather to end", took)
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
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		send := func(f *protocol.Frame) error {
			data, _, err := protocol.Encode(f)
			if err != nil {
				return err
			}
			return ws.Write(ctx, websocket.MessageText, data)
		}
		if _, _, err := ws.Read(ctx); err != nil { // hello
			return
		}
		if send(&protocol.Frame{Type: protocol.TypeWelcome, Welcome: &protocol.Welcome{WorkerID: "w", HeartbeatMS: 60000,
			LeaseMS: 60000}}) != nil {
			return
		}
		as := []protocol.Assign{{Attempt: 1, Module: "sha256:00"}, {Attempt: 2, Module: "sha256:00"}, {Attempt: 3, Module: "sha256:00"}}
		if send(&protocol.Frame{Type: protocol.TypeAssign, Assign: as}) != nil {
			return
		}
		for {
			typ, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			f, err := protocol.Decode(data, typ == websocket.MessageBinary)
			if err != nil {
				return
			}
			frames <- f
			if f.Type == protocol.TypeFail {
				var acks []protocol.Ack
				for _, fl := range f.Fails {
					acks = append(acks, protocol.Ack{Attempt: fl.Attempt, Of: protocol.AckFail, OK: true})
				}
				if send(&protocol.Frame{Type: protocol.TypeAck, Acks: acks}) != nil {
					return
				}
			}
		}
	}))
	defer srv.Close()
	// Two slots: two attempts run, one waits in the queue.
	var ran sync.Map
	var trapped atomic.Int64
	w := New(Config{Servers: []string{srv.URL}, Slots: 2, Queue: 1, Kind: protocol.KindHeadless, Runner: blockRunner{&ran, &trapped},
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
	start := time.Now()
	w.HandBack("shutting down", 3*time.Second)
	if took := time.Since(start); took > 2*time.Second {
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
