//go:build !js

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "wasmworker/browser runs in a browser: build it with GOOS=js GOARCH=wasm (make build)")
	os.Exit(2)
}
