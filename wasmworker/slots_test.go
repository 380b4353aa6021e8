//go:build !js

package wasmworker

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// orderRunner records the order its attempts start in.
type orderRunner struct {
	mu    sync.Mutex
	order []int64
}

func (r *orderRunner) Run(ctx context.Context, job *Job) *Outcome {
	r.mu.Lock()
	r.order = append(r.order, job.Assign.Attempt)
	r.mu.Unlock()
	return &Outcome{Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("ok")}}}
}

// A worker starts its attempts in the order they were assigned: the
// server gives an attempt its deadline when a heartbeat lists it among the
// worker's slots lowest ids (docs/RATIONALE.md, "Why does the server end
// an attempt at its wall time on its own clock?"), so a later attempt that
// took the slot first would run while the clock of an earlier one, still
// waiting, ran on the server. Waiting on a channel, the last assigned of a
// frame often started first.
func TestAttemptsStartInTheOrderAssigned(t *testing.T) {
	for range 5 {
		r := &orderRunner{}
		ended := make(chan int, 8)
		url := fakeServer(t, time.Minute, []*protocol.Frame{assign(1, 4)}, func(f *protocol.Frame) []*protocol.Frame {
			if f.Type == protocol.TypeResult {
				ended <- len(f.Results)
			}
			return nil
		})
		w := New(Config{Servers: []string{url}, Slots: 1, Queue: 3, Kind: protocol.KindHeadless, Runner: r,
			Logger: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); w.Run(ctx) }()
		for n := 0; n < 4; {
			select {
			case k := <-ended:
				n += k
			case <-time.After(time.Minute):
				t.Fatalf("%d of 4 outcomes after a minute", n)
			}
		}
		cancel()
		<-done
		r.mu.Lock()
		order := slices.Clone(r.order)
		r.mu.Unlock()
		if !slices.Equal(order, []int64{1, 2, 3, 4}) {
			t.Fatalf("attempts assigned as 1, 2, 3, 4 to one slot started as %v", order)
		}
	}
}
