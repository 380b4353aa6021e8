package pgembed

import (
	"bytes"
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
	if v, err := unix.SysctlUint64("hw.memsize"); err == nil && v > 0 {
		return int64(v)
	}
	return 1 << 30
}

// isOurPostmaster reports whether pid is a process named postgres that
// started when the cluster's postmaster.pid says its postmaster started
// (started, in Unix seconds). Without /proc the working directory cannot be
// read; the start time tells the cluster's own orphan from another
// PostgreSQL server (a Homebrew one, say) that was given the same pid.
func isOurPostmaster(pid int, _ string, started int64) bool {
	kp, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil || int(kp.Proc.P_pid) != pid {
		return false // gone
	}
	comm, _, _ := bytes.Cut(kp.Proc.P_comm[:], []byte{0})
	diff := kp.Proc.P_starttime.Sec - started
	return string(comm) == "postgres" && diff >= -2 && diff <= 2
}
