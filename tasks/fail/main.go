// Command fail is a test task that writes a message to stderr and exits 3.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "fail: this task always fails")
	os.Exit(3)
}
