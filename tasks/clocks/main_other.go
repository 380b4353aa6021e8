//go:build !wasip1

// Command clocks is a WASI task: build it with GOOS=wasip1 GOARCH=wasm
// (tasks/build.sh).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "clocks is a WASI task: build it with GOOS=wasip1 GOARCH=wasm")
	os.Exit(2)
}
