package headless

import (
	"context"
	"encoding/binary"
	"strconv"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// A task written in C against tasks/include/cyclepool.h (built with
// Debian's clang and wasi-libc), and the same in Rust against the cyclepool
// crate (Debian's rustc), compute what the computation does in Go,
// checkpoint, and resumed from a checkpoint give the same bytes.
func TestTaskInC(t *testing.T) {
	eachMode(t, func(t *testing.T, r *Runner) { testSumsq(t, r, "csumsq") })
}
func TestTaskInRust(t *testing.T) {
	eachMode(t, func(t *testing.T, r *Runner) { testSumsq(t, r, "rsumsq") })
}

func testSumsq(t *testing.T, r *Runner, task string) {
	const n = 5_000_000
	var want uint64
	for i := uint64(0); i < n; i++ {
		want += i * i
	}
	j, h := job(t, task, protocol.Assign{Args: []string{strconv.Itoa(n)}, CkptMS: 1})
	o := r.Run(context.Background(), j)
	if o.Reason != "" {
		t.Fatalf("%s: %s\n%s", o.Reason, o.Message, o.Log)
	}
	out := outputs(o)
	if out["stdout"] != strconv.FormatUint(want, 10)+"\n" || out["n.txt"] != strconv.Itoa(n) {
		t.Fatalf("outputs %q, want the sum %d and n.txt", out, want)
	}
	h.mu.Lock()
	ckpts := h.checkpoints
	h.mu.Unlock()
	if len(ckpts) == 0 {
		t.Fatalf("%s saved no checkpoint with one due every millisecond", task)
	}
	st := ckpts[0]
	if len(st) != 16 || binary.LittleEndian.Uint64(st) == 0 {
		t.Fatalf("checkpoint %x, want 16 bytes of state", st)
	}
	j2, _ := job(t, task, protocol.Assign{Args: []string{strconv.Itoa(n)}, Restore: protocol.Blob{Data: st}})
	o2 := r.Run(context.Background(), j2)
	if o2.Reason != "" || outputs(o2)["stdout"] != out["stdout"] {
		t.Fatalf("resumed from step %d: %s %s %q, want %q", binary.LittleEndian.Uint64(st), o2.Reason, o2.Message, outputs(o2)["stdout"], out["stdout"])
	}
}
