//go:build !linux

package headless

import (
	"io"
	"os"
	"syscall"
	"time"
)

// selfExecutable is the executable a slot process starts from.
func selfExecutable() (string, error) { return os.Executable() }

// slotSysProcAttr: no process group or parent-death signal outside Linux; a
// slot process watches for its worker's death itself (watchParent).
func slotSysProcAttr() *syscall.SysProcAttr { return nil }

// No CPU share outside Linux: a slot process stopped by the duty cycle
// (cpushare.go) could not watch for its worker's death.
const dutyCycleSupported = false

const stopSignal, continueSignal = syscall.Signal(0), syscall.Signal(0) // never sent

// freeBytes returns 0: unknown (so /dev/shm is not used).
func freeBytes(string) uint64 { return 0 }

// accessTime is when a file was last modified: its access time is not
// read outside Linux.
func accessTime(fi os.FileInfo) time.Time { return fi.ModTime() }

// processGone reports false: unknown.
func processGone(int) bool { return false }

// dirEmpty reports whether a directory has no entries.
func dirEmpty(dir string) (bool, error) {
	f, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if len(names) > 0 {
		return false, nil
	}
	if err != nil && err != io.EOF {
		return false, err
	}
	return true, nil
}
