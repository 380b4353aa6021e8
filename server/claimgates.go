package server

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

// claimGates holds back what workers say while attempts sent to them have
// not committed yet. A submission that claims its own tasks sends their
// attempts before it writes them, or before its COMMIT
// (store.CreateWorkflowClaiming's send), so that they run while PostgreSQL
// writes the workflow and flushes the commit; until the commit returns,
// the attempts exist for nobody else, and a result, a
// checkpoint, a heartbeat's renewal, an upload or a reconnection's hello
// naming them would find nothing. So each of those waits, first, for the
// gates open for its worker (wait): about one commit, and only for the
// workers such a submission just gave work to.
type claimGates struct {
	open    atomic.Int64 // gates open, for wait's fast path
	waiting atomic.Int64 // waits held at a gate now (tests watch it)
	mu      sync.Mutex
	by      map[string][]chan struct{} // by worker id
}

// hold opens a gate for workers; calling the function it returns closes
// it.
func (g *claimGates) hold(workers []string) (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	if g.by == nil {
		g.by = map[string][]chan struct{}{}
	}
	for _, w := range workers {
		g.by[w] = append(g.by[w], ch)
	}
	g.open.Add(1)
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		for _, w := range workers {
			rest := slices.DeleteFunc(g.by[w], func(c chan struct{}) bool { return c == ch })
			if len(rest) == 0 {
				delete(g.by, w)
			} else {
				g.by[w] = rest
			}
		}
		g.open.Add(-1)
		g.mu.Unlock()
		close(ch)
	}
}

// wait returns once every gate open for worker when it was called has
// closed, or with ctx's error when ctx ends first.
func (g *claimGates) wait(ctx context.Context, worker string) error {
	if g.open.Load() == 0 {
		return nil
	}
	g.mu.Lock()
	chs := slices.Clone(g.by[worker])
	g.mu.Unlock()
	if len(chs) == 0 {
		return nil
	}
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	for _, ch := range chs {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
