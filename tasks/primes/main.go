// Command primes counts the primes in [LO, HI) by trial division: a
// deterministic, CPU-bound example task that reports progress and
// checkpoints.
//
//	primes LO HI
//
// It prints the count and a newline.
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	if len(os.Args) != 3 {
		taskio.Fatal("usage: primes LO HI")
	}
	lo, err1 := strconv.ParseUint(os.Args[1], 10, 64)
	hi, err2 := strconv.ParseUint(os.Args[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		taskio.Fatal("primes: bad range: %v", err)
	}
	if hi < lo {
		taskio.Fatal("primes: HI %d is below LO %d", hi, lo)
	}
	s := state{Lo: lo, Hi: hi, Next: lo}
	if b, ok := sdk.Restore(); ok {
		r, err := decodeState(b, lo, hi)
		if err != nil {
			fmt.Fprintf(os.Stderr, "primes: ignoring checkpoint: %v\n", err)
		} else {
			s = r
			fmt.Fprintf(os.Stderr, "primes: resuming at %d with %d primes counted\n", s.Next, s.Count)
		}
	}
	n, err := run(s, hooks{
		progress:      sdk.Progress,
		checkpointDue: sdk.CheckpointDue,
		checkpoint: func(b []byte) error {
			if err := sdk.Checkpoint(b); err != nil {
				// Not fatal: the work goes on, only the saved point is older.
				fmt.Fprintf(os.Stderr, "primes: %v\n", err)
			}
			return nil
		},
	})
	if err != nil {
		taskio.Fatal("primes: %v", err)
	}
	sdk.Progress(1)
	fmt.Printf("%d\n", n)
}
