package headless

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// clockResolution is what clock_res_get reports for both clocks.
const clockResolution = sys.ClockResolution(clockStep)

// deterministicClock is the clock and random source of one attempt, the same
// on every runner (docs/TASK_ABI.md, "Clocks and random numbers"). The module
// runs on one goroutine at a time, so no locking is needed.
type deterministicClock struct {
	counter int64 // ns since the attempt started, as the task sees it
	rand    splitMix64
}

// nanotime is WASI's monotonic clock: every read advances the shared counter
// by 1 ms and returns it.
func (c *deterministicClock) nanotime() int64 {
	c.counter += clockStep
	return c.counter
}

// walltime is WASI's realtime clock: every read advances the shared counter
// by 1 ms and returns 1_700_000_000 s plus the counter.
func (c *deterministicClock) walltime() (sec int64, nsec int32) {
	c.counter += clockStep
	return epochSeconds + c.counter/1e9, int32(c.counter % 1e9)
}

// nanosleep (poll_oneoff with a relative clock subscription) returns at once
// and advances the counter by the requested time.
func (c *deterministicClock) nanosleep(ns int64) {
	if ns > 0 {
		c.counter += ns
	}
}

// splitMix64 is the random source: SplitMix64 seeded with Assign.Seed, each
// 64-bit output used as 8 bytes in little-endian order, as one stream of
// bytes across random_get calls.
type splitMix64 struct {
	state uint64
	buf   [8]byte
	n     int // unread bytes at the end of buf
}

func (s *splitMix64) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Read fills p from the stream; it never fails.
func (s *splitMix64) Read(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if s.n == 0 {
			binary.LittleEndian.PutUint64(s.buf[:], s.next())
			s.n = 8
		}
		k := copy(p, s.buf[8-s.n:])
		s.n -= k
		p = p[k:]
	}
	return total, nil
}

// attemptKey is the context key under which host functions find their
// attempt: the context of the _start call carries it.
type attemptKey struct{}

func attemptOf(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// hostProgress is progress(fraction f64).
func hostProgress(ctx context.Context, _ api.Module, stack []uint64) {
	a := attemptOf(ctx)
	f := api.DecodeF64(stack[0])
	if a == nil || a.job.Host == nil || math.IsNaN(f) {
		return
	}
	a.job.Host.Progress(min(max(f, 0), 1))
}

// hostCheckpointDue is checkpoint_due() -> i32.
func hostCheckpointDue(ctx context.Context, _ api.Module, stack []uint64) {
	stack[0] = 0
	a := attemptOf(ctx)
	if a == nil || a.job.Assign.CkptMS <= 0 {
		return
	}
	a.ckptMu.Lock()
	due := time.Since(a.lastCkpt) >= time.Duration(a.job.Assign.CkptMS)*time.Millisecond
	a.ckptMu.Unlock()
	if due {
		stack[0] = 1
	}
}

// hostCheckpoint is checkpoint(ptr i32, len i32) -> i32: 0 when the state was
// saved (the host acknowledged it), 1 when it was refused or failed. A range
// outside memory traps. In a slot process a state over maxSlotCheckpoint
// is refused at once, uncopied: no message to the worker could carry it
// (sent, it ended the slot process, and the attempt with reason worker).
func hostCheckpoint(ctx context.Context, mod api.Module, stack []uint64) {
	ptr, n := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	b, ok := mod.Memory().Read(ptr, n)
	if !ok {
		panic(&outOfRange{"checkpoint", ptr, n})
	}
	stack[0] = 1
	a := attemptOf(ctx)
	if a == nil || a.job.Host == nil {
		return
	}
	if a.e.slot != nil && n > maxSlotCheckpoint {
		a.e.log.Debug("checkpoint refused: larger than a slot process can hand to its worker",
			"task", a.job.Assign.Task, "attempt", a.job.Assign.Attempt, "bytes", n, "max", maxSlotCheckpoint)
		return
	}
	state := append([]byte(nil), b...)
	if err := a.job.Host.Checkpoint(ctx, state); err != nil {
		a.e.log.Debug("checkpoint not saved", "task", a.job.Assign.Task, "attempt", a.job.Assign.Attempt, "err", err)
		return
	}
	a.ckptMu.Lock()
	a.lastCkpt = time.Now()
	a.ckptMu.Unlock()
	stack[0] = 0
}

// hostRestore is restore(ptr i32, cap i32) -> i32: the length of the state to
// restore (0 = none), copied to ptr only when cap >= length. A range outside
// memory traps.
func hostRestore(ctx context.Context, mod api.Module, stack []uint64) {
	ptr, capacity := api.DecodeU32(stack[0]), api.DecodeU32(stack[1])
	stack[0] = 0
	a := attemptOf(ctx)
	if a == nil {
		return
	}
	data := a.job.Assign.Restore.Data
	if len(data) == 0 {
		return
	}
	if uint64(capacity) >= uint64(len(data)) {
		if !mod.Memory().Write(ptr, data) {
			panic(&outOfRange{"restore", ptr, uint32(len(data))})
		}
	}
	stack[0] = api.EncodeU32(uint32(len(data)))
}

// outOfRange is the panic (a trap for the module) of a host function given
// memory it does not have.
type outOfRange struct {
	fn       string
	ptr, len uint32
}

func (e *outOfRange) Error() string {
	return fmt.Sprintf("cyclepool.%s: memory range [%d, %d+%d) is out of bounds", e.fn, e.ptr, e.ptr, e.len)
}
