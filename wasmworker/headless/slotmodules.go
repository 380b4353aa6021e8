package headless

import (
	"context"
	"errors"
	"time"

	"github.com/cyclepool/cyclepool/wasmworker"
)

// maxModuleBytes bounds the module bytes the parent keeps; past it, the
// least recently used modules are fetched again when needed.
const maxModuleBytes = 256 << 20

// moduleBytes is a module fetched, or being fetched, by one caller while
// others wait on done.
type moduleBytes struct {
	done    chan struct{}
	b       []byte
	err     error
	lastUse time.Time
}

// hasModule says whether c has loaded module id.
func (c *slotProc) hasModule(p *slotPool, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return c.modules[id]
}

// module returns the bytes of job's module, fetching and checking them when
// they are not in memory. Concurrent calls for the same module wait for one
// fetch.
func (p *slotPool) module(ctx context.Context, job *wasmworker.Job) ([]byte, error) {
	for {
		p.mu.Lock()
		m, ok := p.modules[job.ModuleID]
		if !ok {
			m = &moduleBytes{done: make(chan struct{})}
			p.modules[job.ModuleID] = m
			p.mu.Unlock()
			m.b, m.err = p.fetch(ctx, job)
			p.mu.Lock()
			m.lastUse = time.Now()
			if m.err != nil {
				if p.modules[job.ModuleID] == m {
					delete(p.modules, job.ModuleID) // let a later attempt try again
				}
			} else {
				p.moduleBytes += int64(len(m.b))
				p.evictModules(job.ModuleID)
			}
			p.mu.Unlock()
			close(m.done)
			return m.b, m.err
		}
		p.mu.Unlock()
		select {
		case <-m.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.closing.Done():
			return nil, errors.New("runner closed")
		}
		if m.err == nil {
			p.mu.Lock()
			m.lastUse = time.Now()
			p.mu.Unlock()
			return m.b, nil
		}
		if !errors.Is(m.err, context.Canceled) && !errors.Is(m.err, context.DeadlineExceeded) {
			return nil, m.err
		}
	}
}

// fetch fetches and checks job's module; Close ends the fetch.
func (p *slotPool) fetch(ctx context.Context, job *wasmworker.Job) ([]byte, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.closing, cancel)()
	return fetchVerified(fctx, job)
}

// evictModules drops the least recently used module bytes, except keep's,
// while they add up to more than maxModuleBytes. p.mu is held.
func (p *slotPool) evictModules(keep string) {
	for p.moduleBytes > maxModuleBytes {
		var oldest string
		var t time.Time
		for id, m := range p.modules {
			if id == keep || m.b == nil {
				continue
			}
			if oldest == "" || m.lastUse.Before(t) {
				oldest, t = id, m.lastUse
			}
		}
		if oldest == "" {
			return
		}
		p.moduleBytes -= int64(len(p.modules[oldest].b))
		delete(p.modules, oldest)
	}
}
