//go:build linux

package headless

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// Many Runs at once on a pipelining pool, short and longer attempts mixed,
// a quarter cancelled at random moments: every Run ends, with success or
// as cancelled (queued attempts are taken back and moved, slot processes
// killed and replaced all along).
func TestPipelinedStressEveryRunEnds(t *testing.T) {
	t.Parallel()
	spinWarm, _ := job(t, "spin", protocol.Assign{Args: []string{"1"}})
	r := pipelined(t, 5*time.Millisecond, spinWarm)
	var wg sync.WaitGroup
	deadline := time.Now().Add(5 * time.Second)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for time.Now().Before(deadline) {
				var j *wasmworker.Job
				switch rng.IntN(3) {
				case 0:
					j = rawJob(wasmtest.Noop())
				case 1:
					j, _ = job(t, "spin", protocol.Assign{Args: []string{"30000"}})
				default:
					j, _ = job(t, "spin", protocol.Assign{Args: []string{"400000"}})
				}
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(4) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, cancel)
				}
				done := make(chan *wasmworker.Outcome, 1)
				go func() { done <- r.Run(ctx, j) }()
				select {
				case o := <-done:
					if o.Reason != "" && o.Reason != protocol.ReasonCancelled {
						t.Errorf("outcome %s: %s", o.Reason, o.Message)
					}
				case <-time.After(15 * time.Second):
					t.Errorf("a Run hung")
					cancel()
					return
				}
				cancel()
			}
		}()
	}
	wg.Wait()
}
