package wasmworker

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"
)

// goid returns the calling goroutine's id, from its stack trace's header
// ("goroutine 7 [running]:").
func goid() string {
	buf := make([]byte, 64)
	return string(bytes.Fields(buf[:runtime.Stack(buf, false)])[1])
}

// waitIdle waits until p has n idle goroutines.
func waitIdle(t *testing.T, p *goPool, n int32) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); p.idle.Load() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle goroutines, want %d", p.idle.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Attempts that run one after the other run on one goroutine, whose stack
// they keep; at most maxIdle goroutines wait for more.
func TestGoPoolReusesGoroutines(t *testing.T) {
	p := newGoPool(2)
	ids := make(chan string, 1)
	first := ""
	for i := range 5 {
		p.run(func() { ids <- goid() })
		id := <-ids
		if i == 0 {
			first = id
		} else if id != first {
			t.Fatalf("run %d on goroutine %s, the first on %s: not kept", i, id, first)
		}
		waitIdle(t, p, 1)
	}

	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 6 {
		wg.Add(1)
		p.run(func() { defer wg.Done(); <-release })
	}
	close(release)
	wg.Wait()
	waitIdle(t, p, 2)
	time.Sleep(20 * time.Millisecond) // the others exit
	if after := runtime.NumGoroutine(); after > before+1 {
		t.Errorf("%d goroutines after the runs, %d before: the pool keeps more than maxIdle", after, before)
	}
}
