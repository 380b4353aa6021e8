//go:build unix

package headless

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// primesN is the argument of `spin N` in the benchmarks: count the primes
// below N by trial division, a tight loop of integer divisions.
const primesN = "1000000"

// primesCount is the number of primes below primesN.
const primesCount = "78498\n"

func benchmarkPrimes(b *testing.B, cfg Config) {
	ctx := context.Background()
	cfg.CacheDir = cacheDir()
	r, err := New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(ctx)
	j, _ := job(b, "spin", protocol.Assign{Args: []string{primesN}})
	// Compile outside the measurement.
	if o := r.Run(ctx, j); o.Reason != "" || string(o.Outputs[0].Data) != primesCount {
		b.Fatalf("%s: %s: %q", o.Reason, o.Message, outputs(o)["stdout"])
	}
	b.ResetTimer()
	for b.Loop() {
		if o := r.Run(ctx, j); o.Reason != "" {
			b.Fatalf("%s: %s", o.Reason, o.Message)
		}
	}
}

// BenchmarkPrimesIsolated runs the tight loop of `spin N` in a slot
// process, as the Runner does by default: no termination checks, the
// process is killed to stop the module.
func BenchmarkPrimesIsolated(b *testing.B) { benchmarkPrimes(b, Config{}) }

// BenchmarkPrimesCloseOnContextDone runs the same loop in-process with
// wazero's WithCloseOnContextDone (Config.InProcess).
func BenchmarkPrimesCloseOnContextDone(b *testing.B) { benchmarkPrimes(b, Config{InProcess: true}) }

// BenchmarkPrimesUnstoppable runs the same loop in-process with neither: the
// module then cannot be stopped. It is the baseline.
func BenchmarkPrimesUnstoppable(b *testing.B) {
	benchmarkPrimes(b, Config{InProcess: true, unstoppable: true})
}

// BenchmarkPrimesNative runs the same Go program compiled natively, for
// reference.
func BenchmarkPrimesNative(b *testing.B) {
	root, err := taskbuild.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	exe := filepath.Join(b.TempDir(), "spin")
	if out, err := exec.Command("go", "build", "-o", exe, filepath.Join(root, "tasks", "spin")).CombinedOutput(); err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	b.ResetTimer()
	for b.Loop() {
		cmd := exec.Command(exe, primesN)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil || !strings.HasPrefix(string(out), strings.TrimSpace(primesCount)) {
			b.Fatalf("%v: %q", err, out)
		}
	}
}

// BenchmarkNoop is the fixed cost of one attempt of a Go task (tasks/noop:
// instantiation, the Go runtime's start-up, /in and /out), to subtract from
// the figures above.
func BenchmarkNoop(b *testing.B) {
	benchmarkModes(b, func(b *testing.B, r *Runner) {
		j, _ := job(b, "noop", protocol.Assign{})
		benchmarkAttempts(b, r, j)
	})
}

// BenchmarkNoopAttempt is the cost of one attempt end to end, through the
// slot process in isolation mode, for the smallest module:
// (module (memory (export "memory") 1) (func (export "_start"))).
func BenchmarkNoopAttempt(b *testing.B) {
	benchmarkModes(b, func(b *testing.B, r *Runner) {
		benchmarkAttempts(b, r, rawJob(wasmtest.Noop()))
	})
}

// BenchmarkNoopAttemptConcurrent is BenchmarkNoopAttempt with 16 Runs at
// once, each with a context of its own, as a worker with 16 slots makes
// them; it also reports how many slot processes served them.
func BenchmarkNoopAttemptConcurrent(b *testing.B) {
	r, err := New(context.Background(), Config{CacheDir: cacheDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(context.Background())
	j := rawJob(wasmtest.Noop())
	ctx := context.Background()
	for range 100 {
		if o := r.Run(ctx, j); o.Reason != "" {
			b.Fatalf("%s: %s", o.Reason, o.Message)
		}
	}
	const runs = 16
	b.ReportAllocs()
	slots0, self0, before := slotsCPU(r), selfCPU(), procsCPU(r)
	b.SetParallelism(runs / runtime.GOMAXPROCS(0))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			// Each attempt has its own context, as the worker gives it.
			actx, cancel := context.WithCancel(ctx)
			if o := r.Run(actx, j); o.Reason != "" {
				b.Errorf("%s: %s", o.Reason, o.Message)
			}
			cancel()
		}
	})
	b.ReportMetric(float64((selfCPU()-self0).Microseconds())/float64(b.N), "self-cpu-µs/op")
	b.ReportMetric(float64((slotsCPU(r)-slots0).Microseconds())/float64(b.N), "slot-cpu-µs/op")
	b.ReportMetric(float64(len(r.pool.pids())), "slot-processes")
	busy := 0
	for pid, t := range procsCPU(r) {
		if t > before[pid] {
			busy++
		}
	}
	b.ReportMetric(float64(busy), "busy-slot-processes")
}

// benchmarkModes runs f in isolation mode and in in-process mode.
func benchmarkModes(b *testing.B, f func(b *testing.B, r *Runner)) {
	for _, inProcess := range []bool{false, true} {
		name := "isolated"
		if inProcess {
			name = "inprocess"
		}
		b.Run(name, func(b *testing.B) { f(b, sharedRunner(b, inProcess)) })
	}
}

// benchmarkAttempts runs j again and again (once before measuring, so that
// the module is compiled and a slot process started).
func benchmarkAttempts(b *testing.B, r *Runner, j *wasmworker.Job) {
	ctx := context.Background()
	if o := r.Run(ctx, j); o.Reason != "" {
		b.Fatalf("%s: %s", o.Reason, o.Message)
	}
	b.ReportAllocs()
	slots0 := slotsCPU(r)
	self0 := selfCPU()
	n := 0
	for b.Loop() {
		if o := r.Run(ctx, j); o.Reason != "" {
			b.Fatalf("%s: %s", o.Reason, o.Message)
		}
		n++
	}
	// CPU time per attempt of this process (the worker's side) and, in
	// isolation mode, of the slot processes.
	b.ReportMetric(float64((selfCPU()-self0).Microseconds())/float64(n), "self-cpu-µs/op")
	if r.pool != nil {
		b.ReportMetric(float64((slotsCPU(r)-slots0).Microseconds())/float64(n), "slot-cpu-µs/op")
	}
}

// selfCPU is the CPU time (user and system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// slotsCPU adds up the CPU time of r's slot processes (from /proc).
func slotsCPU(r *Runner) time.Duration {
	var total time.Duration
	for _, t := range procsCPU(r) {
		total += t
	}
	return total
}

// procsCPU returns the CPU time of each of r's slot processes, by pid
// (from /proc).
func procsCPU(r *Runner) map[int]time.Duration {
	if r.pool == nil {
		return nil
	}
	cpu := map[int]time.Duration{}
	for _, pid := range r.pool.pids() {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(data, ')')
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		cpu[pid] = time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
	}
	return cpu
}
