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
	nb := make([]byte, size, c)
	copy(nb, l.buf)
	l.buf = nb
	return l.buf
}

// Free implements experimental.LinearMemory.
func (l *linearMemory) Free() { l.buf = nil }

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

// size returns the number of bytes captured.
func (w *cappedWriter) size() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(len(w.buf))
}
