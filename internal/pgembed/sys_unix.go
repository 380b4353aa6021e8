//go:build linux || darwin

package pgembed

import (
	"os"
	"syscall"
	"time"
)

// supported reports why the embedded cluster cannot run here (nil: it can).
func supported() error { return nil }

// lockFile takes an exclusive lock on f without waiting.
func lockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

// ownerOf returns the user and group owning a file.
func ownerOf(fi os.FileInfo) (uid, gid uint32) {
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// stopProcess asks process pid to shut down (SIGINT: PostgreSQL's fast
// shutdown), kills it after timeout, and returns once it is gone.
func stopProcess(pid int, timeout time.Duration) {
	_ = syscall.Kill(pid, syscall.SIGINT)
	deadline := time.Now().Add(timeout)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
