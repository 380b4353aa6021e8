package server

import (
	"context"
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

// byteBudget counts bytes held against a limit.
type byteBudget struct {
	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed when bytes are released
}

// acquire takes n bytes, waiting while they would take the bytes held over
// limit (a budget holding nothing always gives them: one frame never
// waits forever).
func (b *byteBudget) acquire(ctx context.Context, n, limit int64) error {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= limit {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
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
