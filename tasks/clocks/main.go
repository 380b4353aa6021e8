//go:build wasip1

// Command clocks calls WASI's clock_time_get N times (its argument, default
// a million) and prints the last monotonic reading: the benchmark runs it
// in Chromium and in wazero to measure what one host call costs
// (wasi_call_ns_*), since a task that reads the clock in a loop pays it on
// every read.
package main

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"
)

//go:wasmimport wasi_snapshot_preview1 clock_time_get
//go:noescape
func clockTimeGet(id uint32, precision uint64, out unsafe.Pointer) uint32

func main() {
	n := 1_000_000
	if len(os.Args) > 1 {
		v, err := strconv.Atoi(os.Args[1])
		if err != nil || v < 0 {
			fmt.Fprintln(os.Stderr, "usage: clocks [CALLS]")
			os.Exit(2)
		}
		n = v
	}
	var t uint64
	for range n {
		if errno := clockTimeGet(1, 0, unsafe.Pointer(&t)); errno != 0 { // 1: monotonic
			fmt.Fprintln(os.Stderr, "clock_time_get: errno", errno)
			os.Exit(1)
		}
	}
	fmt.Println(t)
}
