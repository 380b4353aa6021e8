//go:build unix

package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// ttySize returns the size of the terminal f is attached to; ok is false
// when f is not a terminal.
func ttySize(f *os.File) (cols, rows int, ok bool) {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 {
		return 0, 0, false
	}
	return int(ws.Col), int(ws.Row), true
}
