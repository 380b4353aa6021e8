package pgembed

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// attr is how the PostgreSQL processes are started: in their own process
// group, as cr (when not nil), and told to shut down (SIGINT) when this
// process dies.
func (cr *credential) attr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT}
	if cr != nil {
		a.Credential = &syscall.Credential{Uid: cr.uid, Gid: cr.gid, Groups: []uint32{}}
	}
	return a
}

// totalMemory returns the machine's memory in bytes (1 GiB when unknown).
func totalMemory() int64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 1 << 30
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// isOurPostmaster reports whether pid is a postgres process working in
// dataDir (its start time, which postmaster.pid also records, is not
// needed here).
func isOurPostmaster(pid int, dataDir string, _ int64) bool {
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") {
		return false
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return false
	}
	a, err1 := filepath.EvalSymlinks(cwd)
	b, err2 := filepath.EvalSymlinks(dataDir)
	return err1 == nil && err2 == nil && a == b
}
