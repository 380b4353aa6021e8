//go:build linux

package headless

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// addressSpaceLimited: a slot process limits its address space while it
// compiles or runs a module (limitAddressSpace).
const addressSpaceLimited = true

// limitAddressSpace sets this process's soft RLIMIT_AS to its present
// address-space size plus room bytes (the hard limit is left alone, so
// that unlimitAddressSpace can lift it again). Past the limit the kernel
// refuses the Go runtime more address space and the runtime ends the
// process with "fatal error: out of memory", which its parent reads in its
// stderr (slotProc.outOfAddressSpace). This bounds what the memory
// allocator of an attempt does not see: a table grown by millions of
// entries (wazero keeps 8 bytes for each in Go memory), wazero's own
// allocations while it compiles a module.
//
// The limit is relative: the Go runtime and wazero reserve some 1.5 GiB of
// address space that they mostly never touch, and Go keeps the address
// space of memory it freed for its later allocations, so the size now is
// what earlier attempts needed, and room is what this one may add.
func limitAddressSpace(room uint64) error {
	size, err := addressSpaceSize()
	if err != nil {
		return err
	}
	max, err := hardAddressSpaceLimit()
	if err != nil {
		return err
	}
	return unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: min(size+room, max), Max: max})
}

// unlimitAddressSpace lifts the soft RLIMIT_AS to the hard one.
func unlimitAddressSpace() {
	if max, err := hardAddressSpaceLimit(); err == nil {
		unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: max, Max: max})
	}
}

// hardAddressSpaceLimit is the hard RLIMIT_AS, read once: only a
// privileged process could raise it, and this one lowers only the soft one.
var hardAddressSpaceLimit = sync.OnceValues(func() (uint64, error) {
	var rl unix.Rlimit
	err := unix.Getrlimit(unix.RLIMIT_AS, &rl)
	return rl.Max, err
})

// statm is /proc/self/statm, open for as long as the process lives:
// reading it again from the start costs one system call (a pread; the
// os.File's ReadAt would read again until the end of the file: two).
var statm struct {
	once sync.Once
	f    *os.File
	fd   int
	err  error
	buf  [128]byte
}

// addressSpaceSize returns this process's address-space size in bytes
// (VmSize), from /proc/self/statm. It is called by one goroutine at a time.
func addressSpaceSize() (uint64, error) {
	statm.once.Do(func() {
		statm.f, statm.err = os.Open("/proc/self/statm")
		if statm.err == nil {
			statm.fd = int(statm.f.Fd())
		}
	})
	if statm.err != nil {
		return 0, statm.err
	}
	n, err := unix.Pread(statm.fd, statm.buf[:], 0)
	if n <= 0 {
		if err == nil {
			err = errors.New("/proc/self/statm is empty")
		}
		return 0, err
	}
	f, _, _ := strings.Cut(string(statm.buf[:n]), " ")
	pages, err := strconv.ParseUint(f, 10, 64)
	if err != nil {
		return 0, err
	}
	return pages * uint64(os.Getpagesize()), nil
}
