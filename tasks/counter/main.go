// Command counter is a test task for progress, checkpoints and restore.
//
// Usage: counter N MS. It counts N steps, each a busy loop of real work that
// takes roughly MS milliseconds (the clock a task sees is deterministic and
// fake, so it cannot sleep). After each step it reports progress and, when
// the platform says a checkpoint is due, checkpoints the number of steps
// done (8 bytes, little-endian). At start it restores that number, prints
// "resumed from step K" to stderr (K = 0 when nothing was restored) and at the
// end prints "counted N from K" to stdout.
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"

	"github.com/cyclepool/cyclepool/tasks/sdk"
)

// itersPerMS is the number of work iterations that take about a millisecond
// on a current x86-64 core in the headless runner (wazero's compiler in a
// slot process, without termination checks; see docs/TASK_ABI.md).
const itersPerMS = 450_000

var sink uint64

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: counter N MS")
		os.Exit(1)
	}
	n, err1 := strconv.Atoi(os.Args[1])
	ms, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil || n < 0 || ms < 0 {
		fmt.Fprintln(os.Stderr, "counter: bad arguments:", os.Args[1:])
		os.Exit(1)
	}

	k := 0
	if state, ok := sdk.Restore(); ok {
		if len(state) != 8 {
			fmt.Fprintf(os.Stderr, "counter: restored state has %d bytes, want 8\n", len(state))
			os.Exit(1)
		}
		k = int(binary.LittleEndian.Uint64(state))
	}
	fmt.Fprintf(os.Stderr, "resumed from step %d\n", k)

	for step := k; step < n; step++ {
		busy(ms)
		sdk.Progress(float64(step+1) / float64(n))
		if sdk.CheckpointDue() {
			var state [8]byte
			binary.LittleEndian.PutUint64(state[:], uint64(step+1))
			if err := sdk.Checkpoint(state[:]); err != nil {
				fmt.Fprintf(os.Stderr, "counter: checkpoint at step %d: %v\n", step+1, err)
			}
		}
	}
	fmt.Printf("counted %d from %d\n", n, k)
}

// busy does about ms milliseconds of real work.
func busy(ms int) {
	x := sink | 1
	for i := 0; i < ms*itersPerMS; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	sink = x
}
