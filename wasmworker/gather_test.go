//go:build !js

package wasmworker

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
