//go:build linux

package headless

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
)

// sleb is n as a signed LEB128.
func sleb(n int64) []byte {
	var b []byte
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if (n == 0 && c&0x40 == 0) || (n == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// tableGrower is a command that grows a table of no maximum by n entries
// (issue 21 item 9: 73 bytes growing a table by 200 million entries took
// a slot process to 1.6 GiB with a memory limit of 1 MiB, until its wall
// time).
func tableGrower(n int64) []byte {
	code := append([]byte{0xd0, 0x70, 0x41}, sleb(n)...) // ref.null func, i32.const n
	code = append(code, 0xfc, 0x0f, 0x00, 0x1a)          // table.grow 0, drop
	return wasmtest.Module(
		wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0})),
		wasmtest.Section(3, wasmtest.Vec([]byte{0})),
		wasmtest.Section(4, wasmtest.Vec([]byte{0x70, 0, 0})), // funcref, min 0, no max
		wasmtest.Section(5, wasmtest.Vec([]byte{0, 1})),
		wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("memory"), 2, 0), append(wasmtest.Name("_start"), 0, 0))),
		wasmtest.Section(10, wasmtest.Vec(wasmtest.Body(code))),
	)
}

// A slot process limits its address space while it runs an attempt, to
// three times the attempt's memory and output limits and 512 MiB more than
// it had: a
// module growing a table by 200 million entries (1.6 GiB, which the linear
// memory's limit does not see) ends with limit_memory, which names the
// bound, not at its wall time; a table grown within the bound is fine; and
// the worker goes on with a new slot process.
func TestIsolatedAddressSpaceLimit(t *testing.T) {
	r := isolated(t, Config{})
	limits := protocol.Limits{MemoryPages: 16, OutputBytes: 1 << 20, WallMS: (10 * time.Minute).Milliseconds()}
	for _, tc := range []struct {
		name    string
		grow    int64
		reason  string
		message string
	}{
		{name: "table of 200 million entries", grow: 200_000_000, reason: protocol.ReasonMemory,
			message: "memory limit exceeded: the attempt took more than the 518 MiB of address space a slot process allows for a memory limit of 16 pages"},
		{name: "table of a million entries", grow: 1_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := rawJob(tableGrower(tc.grow))
			j.Assign.Limits = limits
			o := r.Run(context.Background(), j)
			if o.Reason != tc.reason || !strings.Contains(o.Message, tc.message) {
				t.Fatalf("Run = %q (%s); want %q with a message containing %q", o.Reason, o.Message, tc.reason, tc.message)
			}
		})
	}
	j, _ := job(t, "noop", protocol.Assign{})
	if o := r.Run(context.Background(), j); o.Reason != "" {
		t.Fatalf("the next attempt: %s: %s", o.Reason, o.Message)
	}
}

// addressSpaceSize reads VmSize from /proc/self/statm with one pread each
// time: it agrees with a fresh read of the file, call after call, and
// follows the address space as it grows.
func TestAddressSpaceSize(t *testing.T) {
	fresh := func() uint64 {
		b, err := os.ReadFile("/proc/self/statm")
		if err != nil {
			t.Fatal(err)
		}
		f, _, _ := strings.Cut(string(b), " ")
		pages, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return pages * uint64(os.Getpagesize())
	}
	const grow = 256 << 20
	var held []byte
	for i := range 3 {
		before := fresh()
		got, err := addressSpaceSize()
		after := fresh()
		if err != nil || got == 0 {
			t.Fatalf("call %d: addressSpaceSize = %d, %v", i, got, err)
		}
		// Go's own allocations may move the size between the reads.
		if got+grow/2 < before || got > after+grow/2 {
			t.Fatalf("call %d: addressSpaceSize = %d, /proc/self/statm said %d then %d", i, got, before, after)
		}
		if i == 1 {
			held = make([]byte, grow) // reserved address space, untouched
			if got2, _ := addressSpaceSize(); got2 < got+grow/2 {
				t.Fatalf("after reserving %d bytes the size went from %d to %d", grow, got, got2)
			}
		}
	}
	runtime.KeepAlive(held)
}
