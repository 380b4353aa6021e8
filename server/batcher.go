package server

import (
	"context"
	"sync"
	"time"
)

// batcher groups items submitted from many goroutines into batches handled
// by one flush call each. There is no timer: a flusher takes everything
// queued when it becomes free, so a lone item is flushed at once (low
// latency) and items that arrive while a flush runs form the next batch
// (high throughput). A full queue blocks submitters (back-pressure). Items
// submitted together (submitAll) go in the same batch.
type batcher[T any] struct {
	in       chan []T
	max      int
	flushers int
	flush    func(ctx context.Context, batch []T)
}

func newBatcher[T any](queue, max, flushers int, flush func(context.Context, []T)) *batcher[T] {
	return &batcher[T]{in: make(chan []T, queue), max: max, flushers: flushers, flush: flush}
}

// submitAll queues items to be flushed in one batch (a batch may go over
// max by the items of its last submitAll), waiting while the queue is full.
func (b *batcher[T]) submitAll(ctx context.Context, items []T) error {
	if len(items) == 0 {
		return nil
	}
	select {
	case b.in <- items:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run flushes batches until ctx is done.
func (b *batcher[T]) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range b.flushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := make([]T, 0, b.max)
			for {
				batch = batch[:0]
				select {
				case <-ctx.Done():
					return
				case items := <-b.in:
					batch = append(batch, items...)
				}
			fill:
				for len(batch) < b.max {
					select {
					case items := <-b.in:
						batch = append(batch, items...)
					default:
						break fill
					}
				}
				// Outlive ctx for the batch in hand: these items were
				// promised an answer.
				fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				b.flush(fctx, batch)
				cancel()
				// The slice is reused: drop the items' references, or a
				// flushed batch's payloads (up to max frames' worth)
				// stay reachable until overwritten.
				clear(batch)
			}
		}()
	}
	wg.Wait()
}
