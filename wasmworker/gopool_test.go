package wasmworker

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"
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

// growStack uses about n bytes of stack.
//
//go:noinline
func growStack(n int) byte {
	var b [256]byte
	b[0] = byte(n)
	if n <= len(b) {
		return b[0]
	}
	return growStack(n-len(b)) + b[0]
}

// An idle goroutine of the pool keeps the stack its functions grew: the
// collector halves the stack of a goroutine that uses less than a quarter
// of it, and the next attempt then grew it again, by copying it. A stack
// that was neither shrunk nor grown in between holds the function's frame
// at the same address.
func TestGoPoolKeepsStacksThroughCollections(t *testing.T) {
	p := newGoPool(1)
	frames := make(chan uintptr, 1)
	// probe sends where its frame is, after growing the stack to 8 or 16 KiB
	// when grow is set (one function: the same frame layout either way).
	probe := func(grow bool) func() {
		return func() {
			if grow {
				growStack(6 << 10)
			}
			var x byte
			frames <- uintptr(unsafe.Pointer(&x))
		}
	}
	p.run(probe(true))
	grown := <-frames
	waitIdle(t, p, 1)
	for range 3 {
		runtime.GC()
	}
	p.run(probe(false))
	if again := <-frames; again != grown {
		t.Errorf("the next function's frame is at %#x, not %#x: the idle goroutine's stack was moved (shrunk by a collection)", again, grown)
	}
}
