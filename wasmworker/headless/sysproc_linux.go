//go:build linux

package headless

import (
	"errors"
	"os"
	"syscall"
)

// selfExecutable is the executable a slot process starts from:
// /proc/self/exe, which is this process's own binary even when the file was
// replaced or removed since it started (an upgrade), so that parent and
// child always speak the same wire format.
func selfExecutable() (string, error) {
	const self = "/proc/self/exe"
	if _, err := os.Stat(self); err == nil {
		return self, nil
	}
	return os.Executable()
}

// slotSysProcAttr puts a slot process in its own process group (a Ctrl-C in
// the worker's terminal is the worker's to handle, not the slot's) and has
// the kernel kill it when the worker dies (PR_SET_PDEATHSIG), even while it
// spins in compiled code and reads nothing.
func slotSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// freeBytes returns the bytes free for an unprivileged user in the file
// system holding dir, 0 when unknown.
func freeBytes(dir string) uint64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
}

// processGone reports whether no process has the given pid.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
