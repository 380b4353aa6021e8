package headless

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
)

// primesN is the argument of `spin N` in the benchmarks: count the primes
// below N by trial division, a tight loop of integer divisions.
const primesN = "1000000"

// primesCount is the number of primes below primesN.
const primesCount = "78498\n"

func benchmarkPrimes(b *testing.B, unstoppable bool) {
	ctx := context.Background()
	r, err := New(ctx, Config{CacheDir: cacheDir(), unstoppable: unstoppable})
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

// BenchmarkPrimesCloseOnContextDone runs the tight loop of `spin N` with
// wazero's WithCloseOnContextDone, as the Runner does.
func BenchmarkPrimesCloseOnContextDone(b *testing.B) { benchmarkPrimes(b, false) }

// BenchmarkPrimesUnstoppable runs the same loop with neither: the module then
// cannot be stopped. It is the baseline.
func BenchmarkPrimesUnstoppable(b *testing.B) { benchmarkPrimes(b, true) }

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

// BenchmarkNoop is the fixed cost of one attempt (instantiation, the Go
// runtime's start-up, /in and /out), to subtract from the figures above.
func BenchmarkNoop(b *testing.B) {
	ctx := context.Background()
	r := runner(b)
	j, _ := job(b, "noop", protocol.Assign{})
	r.Run(ctx, j)
	for b.Loop() {
		if o := r.Run(ctx, j); o.Reason != "" {
			b.Fatalf("%s: %s", o.Reason, o.Message)
		}
	}
}
