package server

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// A flushed batch is not kept reachable by the batcher (its payloads can
// be collected while no other batch comes).
func TestBatcherDropsFlushedItems(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flushed := make(chan struct{}, 1)
	b := newBatcher(8, 100, 1, func(context.Context, []*[]byte) { flushed <- struct{}{} })
	go b.run(ctx)
	collected := make(chan struct{})
	func() {
		p := new([]byte)
		*p = make([]byte, 1<<20)
		runtime.AddCleanup(p, func(ch chan struct{}) { close(ch) }, collected)
		if err := b.submitAll(ctx, []*[]byte{p}); err != nil {
			t.Fatal(err)
		}
	}()
	<-flushed
	deadline := time.After(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-deadline:
			t.Fatal("a flushed item is still reachable")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
