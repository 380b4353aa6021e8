// Command echo is a test task for the task ABI. It copies stdin, then every
// file under /in in name order, to stdout; writes its arguments joined by
// spaces to /out/args.txt; and writes to /out/det.txt, as hex, 8 bytes from
// the random source followed by clock readings (wall clock in Unix
// nanoseconds, then monotonic nanoseconds elapsed between two readings), so
// tests can check that clocks and random numbers are deterministic.
package main

import (
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

func main() {
	if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
		fail(err)
	}
	entries, err := os.ReadDir("/in")
	if err != nil && !os.IsNotExist(err) {
		fail(err)
	}
	for _, e := range entries { // os.ReadDir sorts by name
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(path.Join("/in", e.Name()))
		if err != nil {
			fail(err)
		}
		if _, err := io.Copy(os.Stdout, f); err != nil {
			fail(err)
		}
		f.Close()
	}
	if err := os.WriteFile("/out/args.txt", []byte(strings.Join(os.Args[1:], " ")), 0o644); err != nil {
		fail(err)
	}

	var r [8]byte
	if _, err := io.ReadFull(rand.Reader, r[:]); err != nil {
		fail(err)
	}
	t0 := time.Now()
	t1 := time.Now()
	det := fmt.Sprintf("random %x\nwall %x\nmono %x\n", r, t0.UnixNano(), int64(t1.Sub(t0)))
	if err := os.WriteFile("/out/det.txt", []byte(det), 0o644); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "echo:", err)
	os.Exit(1)
}
