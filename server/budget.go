package server

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// The payload budgets of worker frames (see readFrame in session.go).

// Bounds on what a worker's frames may make the server hold.
//
// A result, fail or checkpoint frame's payload is read only once the
// frame is known to carry something the connection holds (fencing), and
// only within two budgets of bytes held until its commit is settled: one
// per connection and one for the replica. A frame that does not fit waits,
// unread, until commits release enough (back-pressure on that socket, as
// TCP's): the server never buffers outcomes beyond them.
const (
	// connPayloadBytes bounds the payload bytes held for one connection
	// (at least one frame of max_frame_bytes).
	connPayloadBytes = 96 << 20
	// replicaPayloadBytes bounds those held for all connections together
	// (at least one connection's).
	replicaPayloadBytes = 256 << 20
	// helloMaxBytes bounds the hello frame: it is read before anything is
	// known of the worker, and its running list (at most 1,280 attempts)
	// fits with room to spare.
	helloMaxBytes = 64 << 10
)

// payloadLimits are the bounds of the per-connection and per-replica
// payload budgets.
func (s *Server) payloadLimits() (conn, replica int64) {
	conn = max(connPayloadBytes, int64(s.cfg.MaxFrameBytes))
	return conn, max(replicaPayloadBytes, conn)
}

// byteBudget counts bytes held against a limit. Bytes go in the order they
// were asked for: a large frame waiting for room is not passed by later,
// smaller ones as room frees, so that other connections' streams of small
// frames cannot hold it back for as long as they last.
type byteBudget struct {
	mu    sync.Mutex
	used  int64
	queue []*budgetRequest // waiting, oldest first
}

// budgetRequest is an acquire waiting in byteBudget.queue.
type budgetRequest struct {
	n, limit int64
	given    chan struct{} // closed when the bytes are taken for it
}

// acquire takes n bytes, waiting while they would take the bytes held over
// limit (a budget holding nothing always gives them: one frame never
// waits forever).
func (b *byteBudget) acquire(ctx context.Context, n, limit int64) error {
	b.mu.Lock()
	if len(b.queue) == 0 && (b.used == 0 || b.used+n <= limit) {
		b.used += n
		b.mu.Unlock()
		return nil
	}
	r := &budgetRequest{n: n, limit: limit, given: make(chan struct{})}
	b.queue = append(b.queue, r)
	b.mu.Unlock()
	select {
	case <-r.given:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-r.given: // given as the context ended: given back
		b.releaseLocked(n)
	default:
		b.queue = slices.DeleteFunc(b.queue, func(q *budgetRequest) bool { return q == r })
		b.giveLocked() // those it held back may go
	}
	return ctx.Err()
}

// giveLocked takes bytes for the waiting requests, oldest first, while
// they fit. b.mu held.
func (b *byteBudget) giveLocked() {
	for len(b.queue) > 0 {
		r := b.queue[0]
		if b.used != 0 && b.used+r.n > r.limit {
			return
		}
		b.used += r.n
		close(r.given)
		b.queue = b.queue[1:]
	}
}

func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.releaseLocked(n)
}

// releaseLocked is release with b.mu held.
func (b *byteBudget) releaseLocked(n int64) {
	b.used -= n
	b.giveLocked()
}

func (b *byteBudget) held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// payloadHold is the bytes of one frame held in budgets: by the read loop
// while it handles the frame, and by each of the frame's outcomes until its
// commit is settled. The last to let go releases them.
type payloadHold struct {
	n       int64
	refs    atomic.Int32
	budgets []*byteBudget
}

func (p *payloadHold) ref() {
	if p != nil {
		p.refs.Add(1)
	}
}

func (p *payloadHold) done() {
	if p != nil && p.refs.Add(-1) == 0 {
		for _, b := range p.budgets {
			b.release(p.n)
		}
	}
}
