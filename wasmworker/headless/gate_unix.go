//go:build unix

package headless

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// gate is one 64-bit word shared by a worker and one slot process (a
// shared mapping of a file in the slot's directory): it decides, without a
// message, whether an attempt queued in the slot process's request pipe may
// still start (see wire.go, "Pipelined attempts"). Its high half is the
// floor: attempts numbered at or below it that have not started never will.
// Its low half is the number of the last attempt started.
type gate struct {
	mem  []byte
	word *atomic.Uint64
}

// gateSupported says whether attempts can be pipelined on this system.
const gateSupported = true

// newGateFile creates the file of a gate in dir, for a slot process to map
// too (it is passed to it as a file descriptor).
func newGateFile(dir string) (*os.File, *gate, error) {
	f, err := os.OpenFile(dir+"/gate", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, nil, err
	}
	g, err := mapGate(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, g, nil
}

// mapGate maps the gate held in f, which it grows to 8 bytes if need be.
func mapGate(f *os.File) (*gate, error) {
	if err := f.Truncate(8); err != nil {
		return nil, fmt.Errorf("sizing the gate: %w", err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping the gate: %w", err)
	}
	return &gate{mem: mem, word: (*atomic.Uint64)(unsafe.Pointer(&mem[0]))}, nil
}

// unmap releases the mapping; the gate must not be used after.
func (g *gate) unmap() {
	if g != nil && g.mem != nil {
		syscall.Munmap(g.mem)
		g.mem, g.word = nil, nil
	}
}

// tryStart is the slot process's side: it records that attempt seq starts,
// unless the worker revoked it.
func (g *gate) tryStart(seq uint32) bool {
	for {
		v := g.word.Load()
		if seq <= uint32(v>>32) {
			return false
		}
		if g.word.CompareAndSwap(v, v&^0xffffffff|uint64(seq)) {
			return true
		}
	}
}

// revoke is the worker's side: attempts up to upTo that have not started
// never will. It returns the last attempt started.
func (g *gate) revoke(upTo uint32) (started uint32) {
	for {
		v := g.word.Load()
		floor := max(uint32(v>>32), upTo)
		if g.word.CompareAndSwap(v, uint64(floor)<<32|v&0xffffffff) {
			return uint32(v)
		}
	}
}

// started returns the last attempt started.
func (g *gate) started() uint32 { return uint32(g.word.Load()) }
