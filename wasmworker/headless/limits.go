package headless

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tetratelabs/wazero/experimental"
)

// memoryLimit is the experimental.MemoryAllocator of one attempt. It backs
// the module's linear memory with a Go slice and refuses to make it larger
// than limit bytes: memory.grow past the limit returns -1 to the module, and
// the attempt fails with limit_memory whatever the module does next. A
// module whose declared minimum is over the limit is refused at
// instantiation.
type memoryLimit struct {
	limit    uint64       // bytes
	onRefuse func(string) // if set, called with message() at the first refusal
	pool     *memPool     // if set, where memory comes from and goes back to

	mu      sync.Mutex
	asked   uint64 // bytes of the first refused request; 0 = none refused
	initial bool   // the refused request was the module's initial size
}

// Allocate implements experimental.MemoryAllocator.
func (m *memoryLimit) Allocate(capacity, maxBytes uint64) experimental.LinearMemory {
	return &linearMemory{lim: m, capacity: min(capacity, m.limit)}
}

func (m *memoryLimit) refuse(size uint64, initial bool) {
	m.mu.Lock()
	first := m.asked == 0
	if first {
		m.asked, m.initial = size, initial
	}
	m.mu.Unlock()
	if first && m.onRefuse != nil {
		m.onRefuse(m.message())
	}
}

// refused reports whether a request for memory was refused.
func (m *memoryLimit) refused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.asked != 0
}

// message describes the refused request.
func (m *memoryLimit) message() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.initial {
		return fmt.Sprintf("memory limit exceeded: the module declares %d pages of memory, the limit is %d pages (64 KiB each)",
			m.asked/65536, m.limit/65536)
	}
	return fmt.Sprintf("memory limit exceeded: the module tried to grow its memory to %d pages, the limit is %d pages (64 KiB each)",
		m.asked/65536, m.limit/65536)
}

// linearMemory implements experimental.LinearMemory.
type linearMemory struct {
	lim      *memoryLimit
	capacity uint64
	buf      []byte
}

// Reallocate implements experimental.LinearMemory. Wasm memory never
// shrinks, so the bytes between len and cap of buf are still zero.
func (l *linearMemory) Reallocate(size uint64) []byte {
	initial := l.buf == nil
	if size > l.lim.limit {
		l.lim.refuse(size, initial)
		return nil
	}
	if size <= uint64(cap(l.buf)) {
		l.buf = l.buf[:size]
		return l.buf
	}
	c := max(size, l.capacity, min(2*uint64(cap(l.buf)), l.lim.limit))
	if initial && l.lim.pool != nil {
		if b := l.lim.pool.get(size, c); b != nil {
			l.buf = b
			return l.buf
		}
	}
	nb := make([]byte, size, c)
	copy(nb, l.buf)
	l.buf = nb
	return l.buf
}

// Free implements experimental.LinearMemory.
func (l *linearMemory) Free() {
	if l.lim.pool != nil && l.buf != nil {
		l.lim.pool.put(l.buf)
	}
	l.buf = nil
}

// memPool keeps the linear memory of a finished attempt for the next one,
// so that a slot process running many small attempts does not allocate
// (and zero, and collect) a new memory for each. It holds at most one
// buffer of at most maxPooledMemory bytes of capacity. A buffer comes back
// with its length at the highest size the module used: only that prefix
// can hold the module's bytes, and get zeroes it; past it, up to the
// capacity, the bytes were never handed out and are still zero.
//
// Only for attempts that run one after the other and whose module is
// closed by the goroutine that ran it (slot processes): with
// WithCloseOnContextDone, wazero may free a memory that compiled code is
// still writing.
type memPool struct {
	mu    sync.Mutex
	spare []byte
}

// maxPooledMemory bounds the memory a memPool keeps between attempts.
const maxPooledMemory = 16 << 20

// get returns a zeroed buffer of length size and capacity at least c, or
// nil when the pool has none that large.
func (p *memPool) get(size, c uint64) []byte {
	p.mu.Lock()
	b := p.spare
	if uint64(cap(b)) < c {
		p.mu.Unlock()
		return nil
	}
	p.spare = nil
	p.mu.Unlock()
	clear(b) // the used prefix; the rest of the capacity is still zero
	return b[:size]
}

// put gives back a buffer whose length is the highest size it was used at.
func (p *memPool) put(b []byte) {
	if cap(b) > maxPooledMemory {
		return
	}
	p.mu.Lock()
	if cap(b) >= cap(p.spare) {
		p.spare = b
	}
	p.mu.Unlock()
}

// cappedWriter captures a stream up to limit bytes. The first write that
// would pass the limit keeps what fits, calls onFull once and panics with
// errStreamFull: the writer is a WASI file, written from a host function
// (fd_write), so the panic ends the module's call at once, even where
// nothing else would stop it (a slot process runs without termination
// checks). Later writes fail.
type cappedWriter struct {
	limit  int64
	onFull func()
	tee    func([]byte) // if set, receives every byte kept, in order

	mu   sync.Mutex
	buf  []byte
	full bool
}

var errStreamFull = errors.New("stream limit exceeded")

// Write implements io.Writer.
func (w *cappedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	if w.full {
		w.mu.Unlock()
		return 0, errStreamFull
	}
	room := w.limit - int64(len(w.buf))
	if int64(len(p)) <= room {
		w.buf = append(w.buf, p...)
		if w.tee != nil && len(p) > 0 {
			w.tee(p)
		}
		w.mu.Unlock()
		return len(p), nil
	}
	w.buf = append(w.buf, p[:room]...)
	if w.tee != nil && room > 0 {
		w.tee(p[:room])
	}
	w.full = true
	w.mu.Unlock()
	w.onFull()
	panic(errStreamFull)
}

// bytes returns a copy of what was captured.
func (w *cappedWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.buf...)
}
