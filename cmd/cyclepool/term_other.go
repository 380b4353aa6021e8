//go:build !unix

package main

import "os"

// ttySize reports no terminal: the live view is only drawn on Unix
// terminals; elsewhere status --watch prints one line per change.
func ttySize(f *os.File) (cols, rows int, ok bool) { return 0, 0, false }
