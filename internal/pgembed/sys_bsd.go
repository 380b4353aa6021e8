//go:build unix && !linux

package pgembed

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// attr is how the PostgreSQL processes are started: in their own process
// group and as cr (when not nil). Without Linux's parent-death signal, a
// server left running by a crash of this process is shut down by the next
// Start (clearStalePid).
func (cr *credential) attr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if cr != nil {
		a.Credential = &syscall.Credential{Uid: cr.uid, Gid: cr.gid, Groups: []uint32{}}
	}
	return a
}

// totalMemory returns the machine's memory in bytes (1 GiB when unknown).
func totalMemory() int64 {
	for _, name := range []string{"hw.memsize", "hw.physmem64", "hw.physmem"} { // macOS, NetBSD/OpenBSD, FreeBSD
		if v, err := unix.SysctlUint64(name); err == nil && v > 0 {
			return int64(v)
		}
	}
	return 1 << 30
}

// isOurPostmaster reports whether pid is a postgres process. Without
// /proc its working directory is not checked: the caller holds the
// cluster's lock, so a postgres named in the cluster's postmaster.pid is
// taken for the cluster's own orphan.
func isOurPostmaster(pid int, _ string) bool {
	out, err := exec.Command("ps", "-o", "comm=", "-p", strconv.Itoa(pid)).Output()
	return err == nil && strings.Contains(string(out), "postgres")
}
