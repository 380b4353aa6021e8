//go:build linux

package headless

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// isolated returns a new isolation-mode Runner, closed at the end of the
// test, after which none of its slot processes may be left.
func isolated(t *testing.T, cfg Config) *Runner {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = cacheDir()
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.pool == nil {
		t.Fatal("New made an in-process Runner")
	}
	t.Cleanup(func() { closeAndCheck(t, r) })
	return r
}

// closeAndCheck closes r and checks that every slot process it had is gone.
func closeAndCheck(t *testing.T, r *Runner) {
	t.Helper()
	pids := r.pool.pids()
	if err := r.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("slot process %d outlived Close", pid)
		}
	}
	if n := len(r.pool.pids()); n != 0 {
		t.Errorf("%d slot processes listed after Close", n)
	}
}

// startSpin starts `spin` (an endless loop) and returns once it has run
// for a while, with the pid of its slot process.
func startSpin(t *testing.T, r *Runner, ctx context.Context, a protocol.Assign) (<-chan *wasmworker.Outcome, int) {
	t.Helper()
	j, _ := job(t, "spin", a)
	done := make(chan *wasmworker.Outcome, 1)
	go func() { done <- r.Run(ctx, j) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(r.pool.pids(true)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("spin did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let it spin for real
	pids := r.pool.pids()
	if len(pids) != 1 {
		t.Fatalf("%d slot processes, want 1", len(pids))
	}
	return done, pids[0]
}

func TestIsolatedCancelKillsSlot(t *testing.T) {
	r := isolated(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done, pid := startSpin(t, r, ctx, protocol.Assign{})
	cancelled := time.Now()
	cancel()
	select {
	case o := <-done:
		d := time.Since(cancelled)
		if o.Reason != protocol.ReasonCancelled {
			t.Fatalf("Reason %q (%s), want cancelled", o.Reason, o.Message)
		}
		// How soon is a figure, not a bound a busy machine could break:
		// the slot process is killed, not asked to stop (checked below).
		t.Logf("Run returned %v after cancel", d)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if !processGone(pid) {
		t.Errorf("slot process %d still exists after the cancelled Run returned", pid)
	}
	// The next attempt gets a new slot process.
	j, _ := job(t, "noop", protocol.Assign{})
	if o := r.Run(context.Background(), j); o.Reason != "" {
		t.Fatalf("next attempt: %s: %s", o.Reason, o.Message)
	}
}

func TestIsolatedWallTime(t *testing.T) {
	r := isolated(t, Config{})
	// counter writes to stderr, then works for far longer than its wall time.
	j, _ := job(t, "counter", protocol.Assign{Args: []string{"1000", "1000"}, Limits: protocol.Limits{WallMS: 300}})
	start := time.Now()
	o := r.Run(context.Background(), j)
	d := time.Since(start)
	if o.Reason != protocol.ReasonWallTime || !strings.Contains(o.Message, "300ms") {
		t.Fatalf("Reason %q (%s), want limit_wall_time", o.Reason, o.Message)
	}
	// The task would run for 1,000 s: ending in a minute means it was
	// stopped (the reason says why), with room for starting the slot
	// process and compiling the module on a machine as busy as can be.
	if d < 300*time.Millisecond || d > time.Minute {
		t.Errorf("Run returned after %v with a wall time limit of 300ms", d)
	}
	if !strings.Contains(string(o.Log), "resumed from step 0") {
		t.Errorf("Log %q: the killed slot's stderr is lost", o.Log)
	}
	if n := len(r.pool.pids()); n != 0 {
		t.Errorf("%d slot processes after the wall time kill, want 0", n)
	}
}

// stallingHost is a Host whose checkpoints are never acknowledged: each
// Checkpoint waits for the end of its context, and says so on ended (once:
// a second wait that ended must not block the attempt, or Close after it).
type stallingHost struct {
	fakeHost
	ended chan struct{}
}

func (h *stallingHost) Checkpoint(ctx context.Context, state []byte) error {
	<-ctx.Done()
	select {
	case h.ended <- struct{}{}:
	default:
	}
	return ctx.Err()
}

// The wall time ends an attempt whose checkpoint waits for an
// acknowledgement that never comes: the wait ends with it.
func TestIsolatedWallTimeDuringCheckpoint(t *testing.T) {
	r := isolated(t, Config{})
	j, _ := job(t, "counter", protocol.Assign{Args: []string{"1000", "1"}, CkptMS: 1, Limits: protocol.Limits{WallMS: 500}})
	h := &stallingHost{ended: make(chan struct{}, 1)}
	j.Host = h
	done := make(chan *wasmworker.Outcome, 1)
	go func() { done <- r.Run(context.Background(), j) }()
	select {
	case o := <-done:
		if o.Reason != protocol.ReasonWallTime {
			t.Fatalf("Reason %q (%s), want limit_wall_time", o.Reason, o.Message)
		}
	case <-time.After(time.Minute): // a liveness guard, far beyond the 500 ms wall time on any machine
		t.Fatal("Run did not return at its wall time while its checkpoint waited")
	}
	select {
	case <-h.ended:
	default:
		t.Error("the attempt never checkpointed, or its wait did not end")
	}
}

// Close ends a Run that waits for its module's bytes.
func TestIsolatedCloseEndsAModuleFetch(t *testing.T) {
	r, err := New(context.Background(), Config{CacheDir: cacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	j := rawJob(wasmtest.Noop())
	fetching := make(chan struct{})
	j.Fetch = func(ctx context.Context) ([]byte, error) {
		close(fetching)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	done := make(chan *wasmworker.Outcome, 1)
	go func() { done <- r.Run(context.Background(), j) }()
	<-fetching
	closed := make(chan error, 1)
	go func() { closed <- r.Close(context.Background()) }()
	select {
	case o := <-done:
		if o.Reason != protocol.ReasonWorker || !strings.Contains(o.Message, "closing") {
			t.Errorf("Reason %q (%s), want worker: the runner is closing", o.Reason, o.Message)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still fetching its module after Close")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestIsolatedSlotKilledFromOutside(t *testing.T) {
	r := isolated(t, Config{})
	done, pid := startSpin(t, r, context.Background(), protocol.Assign{})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-done:
		if o.Reason != protocol.ReasonCrashed || !strings.Contains(o.Message, "slot process") || !strings.Contains(o.Message, "killed") {
			t.Fatalf("Reason %q Message %q, want crashed and a message saying the slot process was killed", o.Reason, o.Message)
		}
		t.Logf("Message: %s", o.Message)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its slot process was killed")
	}
	j, _ := job(t, "echo", protocol.Assign{Args: []string{"again"}})
	if o := r.Run(context.Background(), j); o.Reason != "" || outputs(o)["args.txt"] != "again" {
		t.Fatalf("next attempt: %s: %s %v", o.Reason, o.Message, outputs(o))
	}
}

func TestIsolatedConcurrentNoops(t *testing.T) {
	r := isolated(t, Config{})
	j := rawJob(wasmtest.Noop())
	const goroutines, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan string, goroutines*each)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if o := r.Run(context.Background(), j); o.Reason != "" || len(o.Outputs) != 1 {
					errs <- fmt.Sprintf("%s: %s (%d outputs)", o.Reason, o.Message, len(o.Outputs))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := len(r.pool.pids()); n == 0 || n > goroutines {
		t.Errorf("%d slot processes for %d concurrent Runs", n, goroutines)
	}
}

func TestIsolatedIdleSlotExits(t *testing.T) {
	r := isolated(t, Config{IdleTimeout: 100 * time.Millisecond})
	if o := r.Run(context.Background(), rawJob(wasmtest.Noop())); o.Reason != "" {
		t.Fatalf("%s: %s", o.Reason, o.Message)
	}
	pids := r.pool.pids()
	if len(pids) != 1 {
		t.Fatalf("%d slot processes, want 1", len(pids))
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(r.pool.pids()) != 0 || !processGone(pids[0]) {
		if time.Now().After(deadline) {
			t.Fatal("the idle slot process did not exit")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Slot directories are reused: the outputs of one attempt never show up in
// the next, nor do its inputs.
func TestIsolatedDirsEmptiedBetweenAttempts(t *testing.T) {
	r := isolated(t, Config{})
	j1, _ := job(t, "chatty", protocol.Assign{Args: []string{"10"}})
	if o := r.Run(context.Background(), j1); o.Reason != "" || len(o.Outputs) != 2 {
		t.Fatalf("%s: %s %v", o.Reason, o.Message, names(o))
	}
	j2, _ := job(t, "echo", protocol.Assign{Inputs: []protocol.Blob{{Name: "x", Data: []byte("X")}}})
	if o := r.Run(context.Background(), j2); o.Reason != "" || outputs(o)["stdout"] != "X" ||
		strings.Join(names(o), ",") != "stdout,args.txt,det.txt" {
		t.Fatalf("%s: %s %v", o.Reason, o.Message, outputs(o))
	}
	j3, _ := job(t, "echo", protocol.Assign{})
	if o := r.Run(context.Background(), j3); o.Reason != "" || outputs(o)["stdout"] != "" {
		t.Fatalf("%s: %s %v", o.Reason, o.Message, outputs(o))
	}
	if n := len(r.pool.pids()); n != 1 {
		t.Errorf("%d slot processes for sequential attempts, want 1", n)
	}
}

// Close kills the slot processes of running attempts and idle ones alike,
// and leaves no goroutine behind.
func TestIsolatedCloseLeavesNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	r, err := New(context.Background(), Config{CacheDir: cacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	// Two idle slot processes, two busy ones.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Run(context.Background(), rawJob(wasmtest.Noop()))
		}()
	}
	wg.Wait()
	outs := make(chan *wasmworker.Outcome, 2)
	for range 2 {
		j, _ := job(t, "spin", protocol.Assign{})
		go func() { outs <- r.Run(context.Background(), j) }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(r.pool.pids(true)) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the spins did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(r.pool.pids()); n < 2 || n > 4 {
		t.Errorf("%d slot processes, want 2 to 4", n)
	}
	closeAndCheck(t, r)
	for range 2 {
		if o := <-outs; o.Reason != protocol.ReasonWorker {
			t.Errorf("Reason %q (%s), want worker", o.Reason, o.Message)
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A task that lists /in moves the host's access time of in/; the next
// attempt in the same slot process still sees /in at inputTime (fsView),
// as every attempt does.
func TestIsolatedInTimesAfterListing(t *testing.T) {
	r := isolated(t, Config{})
	j, _ := job(t, "echo", protocol.Assign{}) // lists /in, which is empty
	if o := r.Run(context.Background(), j); o.Reason != "" {
		t.Fatalf("%s: %s", o.Reason, o.Message)
	}
	j, _ = job(t, "fsprobe", protocol.Assign{Args: []string{"stat", "/in"}})
	o := r.Run(context.Background(), j)
	if o.Reason != "" {
		t.Fatalf("%s: %s", o.Reason, o.Message)
	}
	if got, want := strings.TrimSpace(outputs(o)["stdout"]), fmt.Sprintf("0 %d", inputTime.Unix()); got != want {
		t.Errorf("stat /in after a task listed it: %q, want %q", got, want)
	}
}

// The clocks task (the benchmark's measure of a WASI call) reads the
// deterministic monotonic clock, which moves 1 ms per read: two more reads
// end 2,000,000 ns later (the Go runtime reads it too, as it starts).
func TestClocksTaskReadsTheDeterministicClock(t *testing.T) {
	r := isolated(t, Config{})
	last := func(calls string) int64 {
		j, _ := job(t, "clocks", protocol.Assign{Args: []string{calls}})
		o := r.Run(context.Background(), j)
		if o.Reason != "" {
			t.Fatalf("%s: %s", o.Reason, o.Message)
		}
		if len(o.Outputs) == 0 || o.Outputs[0].Name != "stdout" {
			t.Fatalf("outputs %+v, want stdout", o.Outputs)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(o.Outputs[0].Data)), 10, 64)
		if err != nil {
			t.Fatalf("stdout %q: %v", o.Outputs[0].Data, err)
		}
		return v
	}
	if d := last("5") - last("3"); d != 2_000_000 {
		t.Errorf("two more reads moved the clock by %d ns, want 2,000,000", d)
	}
}

// A CPU share holds each slot process running an attempt to that share of
// the CPU time (its duty cycle stops the process for the rest of every
// period); the attempt still ends with its outputs, and an attempt held
// back is cancelled and its slot process killed as any other. A busy
// machine only lowers the CPU time a process gets, so the bound on the
// ratio cannot fail for that.
func TestCPUShareHoldsSlotsToTheirShare(t *testing.T) {
	t.Parallel()
	const share = 25
	r := isolated(t, Config{CPUShare: share})
	// The first attempt starts the slot process and compiles the module.
	warm, _ := job(t, "counter", protocol.Assign{Args: []string{"1", "1"}})
	if o := r.Run(context.Background(), warm); o.Reason != "" {
		t.Fatalf("first attempt: %s: %s", o.Reason, o.Message)
	}
	before := procsCPU(r)
	if len(before) != 1 {
		t.Fatalf("%d slot processes, want 1", len(before))
	}
	j, _ := job(t, "counter", protocol.Assign{Args: []string{"8", "50"}})
	start := time.Now()
	o := r.Run(context.Background(), j)
	wall := time.Since(start)
	if o.Reason != "" || outputs(o)["stdout"] != "counted 8 from 0\n" {
		t.Fatalf("attempt: %q %s, stdout %q", o.Reason, o.Message, outputs(o)["stdout"])
	}
	var cpu time.Duration
	for pid, d := range procsCPU(r) {
		cpu += d - before[pid]
	}
	// Measured, the share is kept to within a few points (the kernel's
	// accounting of the stops and continues is charged to the process):
	// a quarter more, and two periods' computing, is slack enough, while
	// a process not held at all would use about all of the wall time.
	bound := wall*share/100*5/4 + 2*dutyPeriod*share/100
	t.Logf("the attempt used %v of CPU in %v (%.0f%%, share %d%%)", cpu, wall, 100*cpu.Seconds()/wall.Seconds(), share)
	if cpu > bound {
		t.Errorf("the attempt used %v of CPU in %v: more than its %d%% share (%v)", cpu, wall, share, bound)
	}

	// Cancelling an attempt that the share holds stopped kills its slot
	// process all the same (closeAndCheck, at the end, checks that none
	// is left).
	ctx, cancel := context.WithCancel(context.Background())
	done, pid := startSpin(t, r, ctx, protocol.Assign{})
	cancel()
	if o := <-done; o.Reason != protocol.ReasonCancelled {
		t.Fatalf("spin: Reason %q (%s), want cancelled", o.Reason, o.Message)
	}
	if !processGone(pid) {
		t.Errorf("slot process %d still exists after the cancelled Run returned", pid)
	}
}

func TestCPUShareIsValidated(t *testing.T) {
	for _, tc := range []struct {
		share     int
		inProcess bool
		want      string
	}{
		{share: -1, want: "not between 1 and 100"},
		{share: 101, want: "not between 1 and 100"},
		{share: 50, inProcess: true, want: "needs slot processes"},
	} {
		_, err := New(context.Background(), Config{CPUShare: tc.share, InProcess: tc.inProcess, CacheDir: cacheDir()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CPUShare %d, InProcess %v: %v, want %q", tc.share, tc.inProcess, err, tc.want)
		}
	}
}

// A checkpoint larger than a slot process can hand to its worker is
// refused (checkpoint returns 1, the attempt goes on), without a copy of
// the state. (A task with 1 GiB of memory or more that checkpointed it all
// made its slot process exit, its state too large for a message: the
// attempt failed with reason worker, which charges no one, so the task
// came back for ever, on every worker.)
func TestSlotRefusesCheckpointLargerThanAMessage(t *testing.T) {
	r := sharedRunner(t, false)
	const state = maxWireMessage // (over maxSlotCheckpoint: a message of it and its fields is too long)
	pages := state/65536 + 1
	// (module (import "cyclepool" "checkpoint" (func (param i32 i32) (result i32)))
	//   (import "wasi_snapshot_preview1" "proc_exit" (func (param i32)))
	//   (memory (export "memory") pages)
	//   (func (export "_start") (call 1 (call 0 (i32.const 0) (i32.const state)))))
	code := append([]byte{0x41, 0, 0x41}, wasmtest.ULEB(state)...)
	code = append(code, 0x10, 0, 0x10, 1)
	mod := wasmtest.Module(
		wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 2, 0x7f, 0x7f, 1, 0x7f}, []byte{0x60, 1, 0x7f, 0}, []byte{0x60, 0, 0})),
		wasmtest.Section(2, wasmtest.Vec(
			append(append(wasmtest.Name("cyclepool"), wasmtest.Name("checkpoint")...), 0, 0),
			append(append(wasmtest.Name("wasi_snapshot_preview1"), wasmtest.Name("proc_exit")...), 0, 1))),
		wasmtest.Section(3, wasmtest.Vec([]byte{2})),
		wasmtest.Section(5, wasmtest.Vec(append([]byte{0}, wasmtest.ULEB(pages)...))),
		wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("memory"), 2, 0), append(wasmtest.Name("_start"), 0, 2))),
		wasmtest.Section(10, wasmtest.Vec(wasmtest.Body(code))),
	)
	j := rawJob(mod)
	j.Assign.Limits.MemoryPages = uint32(pages)
	h := &fakeHost{refuse: true}
	j.Host = h
	o := r.Run(context.Background(), j)
	if o.Reason != protocol.ReasonExit || !strings.HasPrefix(o.Message, "exit code 1") {
		t.Fatalf("%s: %s, want exit code 1 (the checkpoint refused, the attempt going on)", o.Reason, o.Message)
	}
	if len(h.checkpoints) != 0 {
		t.Errorf("the worker was handed %d checkpoints", len(h.checkpoints))
	}
}

// An attempt stopped after its slot process spilled its outputs, before its
// Run took them (here its done reply has arrived when the attempt is
// cancelled, or its wall time passes: the stop's reason wins), leaves none
// of them in the pool's directory once the Run has returned: they used to
// stay until the worker exited, up to an output limit of disk for each
// such attempt. The file an earlier attempt of the same slot process
// handed over stays: its worker may still be uploading it.
func TestIsolatedStoppedAttemptLeavesNoSpills(t *testing.T) {
	for _, stop := range []string{"cancel", "wall time"} {
		t.Run(stop, func(t *testing.T) {
			r := isolated(t, Config{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var hold, held atomic.Bool
			r.pool.hooks.done = func(c *slotProc) {
				if !hold.Load() {
					return
				}
				held.Store(true)
				if stop == "cancel" {
					cancel()
				}
				<-c.dead // killed for the cancel, or at the wall time
			}
			const size = 2 * protocol.UploadMinBytes
			big := func(wallMS int64) *wasmworker.Job {
				j, _ := job(t, "outfill", protocol.Assign{Args: []string{"bytes", strconv.Itoa(size)},
					Limits: protocol.Limits{OutputBytes: 1 << 30, WallMS: wallMS}})
				j.Upload = true
				return j
			}

			first := r.Run(context.Background(), big(0))
			if first.Reason != "" || len(first.Files) != 1 {
				t.Fatalf("first attempt: %s: %s, files %v", first.Reason, first.Message, first.Files)
			}
			kept := first.Files[0].Path
			t.Cleanup(func() { os.Remove(kept) })

			hold.Store(true)
			var wallMS int64
			want := protocol.ReasonCancelled
			if stop == "wall time" {
				// Room to write the output first, on a busy machine.
				wallMS, want = 3000, protocol.ReasonWallTime
			}
			o := r.Run(ctx, big(wallMS))
			if o.Reason != want {
				t.Fatalf("second attempt: %q (%s), want %s", o.Reason, o.Message, want)
			}
			if !held.Load() {
				// The wall time passed before the task was done: nothing
				// was spilled, or the slot process was killed collecting.
				t.Logf("the second attempt was stopped before its done reply")
			}
			if len(o.Files) != 0 {
				t.Errorf("the stopped attempt's outcome lists files %v", o.Files)
			}
			r.pool.mu.Lock()
			slots := r.pool.nextID
			r.pool.mu.Unlock()
			if slots != 1 {
				t.Errorf("%d slot processes started, want 1: both attempts in the same one", slots)
			}

			// The pool's directory holds the first attempt's file and
			// nothing else (the killed slot process's own directory is
			// gone).
			if left, n := poolFiles(t, r, kept); len(left) > 0 {
				t.Errorf("%d bytes left in the pool's directory after the stopped attempt: %v", n, left)
			}
			if st, err := os.Stat(kept); err != nil || st.Size() != size {
				t.Errorf("the first attempt's output file: %v (want %d bytes)", err, size)
			}
		})
	}
}

// A slot process killed once it has spilled an attempt's outputs, while it
// sends its done reply (which the Run has not begun to read: the reply,
// with a large stdout, does not fit in the pipe), leaves none of them in
// the pool's directory once the Run has returned, whether it crashed (a
// SIGKILL from outside, as from the kernel's out-of-memory killer) or the
// attempt was cancelled.
func TestIsolatedSlotKilledAfterSpillingLeavesNoSpills(t *testing.T) {
	for _, stop := range []string{"crash", "cancel"} {
		t.Run(stop, func(t *testing.T) {
			r := isolated(t, Config{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const size, small = 2 * protocol.UploadMinBytes, 512 << 10
			var spilled string
			r.pool.hooks.running = func(c *slotProc) {
				// Wait until the large output was moved to the pool's
				// directory whole (renamed there), then stop the slot
				// process: it is blocked sending its done reply.
				deadline := time.Now().Add(time.Minute)
				for spilled == "" && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
					m, _ := filepath.Glob(filepath.Join(r.pool.baseDir, "*output-*"))
					for _, f := range m {
						if st, err := os.Stat(f); err == nil && st.Size() == size {
							spilled = f
						}
					}
				}
				if stop == "cancel" {
					cancel()
					<-c.dead
					return
				}
				c.pmu.Lock()
				pid := c.process.Pid
				c.pmu.Unlock()
				syscall.Kill(pid, syscall.SIGKILL)
				<-c.exited
			}
			j, _ := job(t, "fsprobe", protocol.Assign{
				Args:   []string{"fill", "/out/big", strconv.Itoa(size), "fill", "/out/small", strconv.Itoa(small), "cat", "/out/small"},
				Limits: protocol.Limits{OutputBytes: 1 << 30}})
			j.Upload = true
			o := r.Run(ctx, j)
			if spilled == "" {
				t.Fatalf("the large output never appeared in the pool's directory; the attempt: %q (%s)", o.Reason, o.Message)
			}
			want := protocol.ReasonCrashed
			if stop == "cancel" {
				want = protocol.ReasonCancelled
			}
			if o.Reason != want || len(o.Files) != 0 {
				t.Fatalf("%q (%s), files %v; want %s and no files", o.Reason, o.Message, o.Files, want)
			}
			if left, n := poolFiles(t, r, ""); len(left) > 0 {
				t.Errorf("%d bytes left in the pool's directory after the killed attempt: %v", n, left)
			}
		})
	}
}

// poolFiles lists the regular files under r's pool directory but except,
// with their sizes, and returns their total size.
func poolFiles(t *testing.T, r *Runner, except string) (files []string, total int64) {
	t.Helper()
	err := filepath.WalkDir(r.pool.baseDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || p == except {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files = append(files, fmt.Sprintf("%s (%d bytes)", p, info.Size()))
		total += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, total
}
