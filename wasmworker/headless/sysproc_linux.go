//go:build linux

package headless

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"time"
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

// The CPU share's duty cycle (cpushare.go) stops and continues slot
// processes; a stopped one still dies with its worker (Pdeathsig).
const dutyCycleSupported = true

const stopSignal, continueSignal = syscall.SIGSTOP, syscall.SIGCONT

// watchParent reports false: on Linux the kernel kills a slot process
// whose worker died (slotSysProcAttr's parent-death signal).
func watchParent() bool { return false }

// freeBytes returns the bytes free for an unprivileged user in the file
// system holding dir, 0 when unknown.
func freeBytes(dir string) uint64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
}

// accessTime is when a file was last read, as far as the file system
// records it (relatime: at least daily).
func accessTime(fi os.FileInfo) time.Time {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Atim.Sec, st.Atim.Nsec)
	}
	return fi.ModTime()
}

// processGone reports whether no process has the given pid.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// dirEmpty reports whether a directory has no entries, in three system
// calls (open, one getdents64, close): the first read of a directory
// returns as many entries as fit in the buffer, so one that returns only
// "." and ".." has read them all.
func dirEmpty(dir string) (bool, error) {
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer syscall.Close(fd)
	var buf [4096]byte
	n, err := syscall.Getdents(fd, buf[:])
	if err != nil {
		return false, &os.PathError{Op: "getdents", Path: dir, Err: err}
	}
	for b := buf[:n]; len(b) >= 19; {
		// struct linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
		reclen := int(b[16]) | int(b[17])<<8
		if reclen < 19 || reclen > len(b) {
			return false, nil // not understood: say non-empty, and the caller walks it
		}
		name := b[19:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		if string(name) != "." && string(name) != ".." {
			return false, nil
		}
		b = b[reclen:]
	}
	return true, nil
}
