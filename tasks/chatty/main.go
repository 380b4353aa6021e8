// Command chatty is a test task for the output and log limits. With argument
// N it writes N bytes ('o') to stdout, N bytes ('e') to stderr and a file
// /out/big of N bytes ('b').
package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: chatty N")
		os.Exit(1)
	}
	n, err := strconv.ParseInt(os.Args[1], 10, 64)
	if err != nil || n < 0 {
		fmt.Fprintln(os.Stderr, "chatty: bad N:", os.Args[1])
		os.Exit(1)
	}
	write(os.Stdout, 'o', n)
	write(os.Stderr, 'e', n)
	f, err := os.Create("/out/big")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chatty:", err)
		os.Exit(1)
	}
	write(f, 'b', n)
	if err := f.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "chatty:", err)
		os.Exit(1)
	}
}

// write writes n copies of c to w in chunks, stopping at the first error.
func write(w io.Writer, c byte, n int64) {
	chunk := bytes.Repeat([]byte{c}, 64<<10)
	for n > 0 {
		k := min(n, int64(len(chunk)))
		if _, err := w.Write(chunk[:k]); err != nil {
			return
		}
		n -= k
	}
}
