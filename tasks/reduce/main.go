// Command reduce combines integers from many inputs: every file under /in
// (in name order) and stdin, each holding whitespace-separated integers
// (such as the count printed by primes).
//
//	reduce [sum|max|min|count]
//
// The default is sum. It prints the result and a newline.
package main

import (
	"bytes"
	"fmt"
	"os"
	"runtime"

	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	op := "sum"
	switch len(os.Args) {
	case 1:
	case 2:
		op = os.Args[1]
	default:
		taskio.Fatal("usage: reduce [sum|max|min|count]")
	}
	r, err := newReducer(op)
	if err != nil {
		taskio.Fatal("reduce: %v", err)
	}
	names, err := taskio.ListInputs()
	if err != nil {
		taskio.Fatal("reduce: %v", err)
	}
	for i, n := range names {
		b, err := taskio.ReadInput(n)
		if err != nil {
			taskio.Fatal("reduce: %v", err)
		}
		if err := r.addFrom(n, bytes.NewReader(b)); err != nil {
			taskio.Fatal("reduce: %v", err)
		}
		sdk.Progress(float64(i+1) / float64(len(names)+1))
	}
	if readStdin() {
		if err := r.addFrom("stdin", os.Stdin); err != nil {
			taskio.Fatal("reduce: %v", err)
		}
	}
	res, err := r.result()
	if err != nil {
		taskio.Fatal("reduce: %v", err)
	}
	sdk.Progress(1)
	fmt.Println(res)
}

// readStdin says whether to read stdin: always under the platform, and
// natively unless stdin is a terminal (so a plain `go run` does not wait).
func readStdin() bool {
	if runtime.GOOS == "wasip1" {
		return true
	}
	fi, err := os.Stdin.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice == 0
}
