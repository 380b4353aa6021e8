package wasmworker

import "sync"

// slotQueue hands a worker's slots to its attempts in the order they were
// assigned (Worker.start takes each one's place in line as the assignment
// arrives). The server gives an attempt its deadline when a heartbeat
// lists it among the worker's slots lowest attempt ids (store.Renew,
// docs/RATIONALE.md): a later attempt that took a free slot before an
// earlier one would run while the earlier one's clock ran on the server,
// and the earlier one, waiting behind it, could be taken back for that.
// Goroutines that wait for a slot on a channel take it in no set order
// (the last one readied is often the first to run).
type slotQueue struct {
	mu    sync.Mutex
	free  int
	queue []chan struct{} // waiting, oldest first
}

func newSlotQueue(slots int) *slotQueue { return &slotQueue{free: slots} }

// enter takes a place in line, and returns the channel closed once the
// place has a slot. Call leave with it when done, whether or not it was
// given a slot.
func (q *slotQueue) enter() chan struct{} {
	t := make(chan struct{})
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queue = append(q.queue, t)
	q.giveLocked()
	return t
}

// leave gives back the slot t was given, or its place in line.
func (q *slotQueue) leave(t chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-t:
		q.free++
	default:
		for i, w := range q.queue {
			if w == t {
				q.queue = append(q.queue[:i], q.queue[i+1:]...)
				break
			}
		}
	}
	q.giveLocked()
}

// giveLocked gives the free slots to the oldest places in line; q.mu held.
func (q *slotQueue) giveLocked() {
	for q.free > 0 && len(q.queue) > 0 {
		close(q.queue[0])
		q.queue[0] = nil
		q.queue = q.queue[1:]
		q.free--
	}
}
