//go:build unix

package headless

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const orphanEnv = "CYCLEPOOL_TEST_ORPHAN"

// init makes the test binary the process of TestSlotWatcherSeesItsParentDie
// when asked: set up as a slot process is where the kernel does not end it
// with its worker (watchParent), it keeps a CPU busy until the watcher ends
// it.
func init() {
	if os.Getenv(orphanEnv) != "1" {
		return
	}
	runtime.GOMAXPROCS(2)
	go pollParent(20*time.Millisecond, func() { os.Exit(0) })
	for n := 0; ; n++ {
	}
}

// On macOS and the BSDs a slot process has no parent-death signal: it
// watches for its worker's death itself (watchParent), or an attempt that
// spins would keep a volunteer's CPU busy forever after the worker died.
// The watcher runs on Linux too, so it is tested here.
func TestSlotWatcherSeesItsParentDie(t *testing.T) {
	// The shell starts the helper, says its pid and exits a little later,
	// which orphans it.
	cmd := exec.Command("sh", "-c", `"$0" -test.run=^$ & echo $!; sleep 0.5`, os.Args[0])
	cmd.Env = append(os.Environ(), orphanEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start the helper: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("helper pid %q: %v", out, err)
	}
	t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			p.Kill()
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for !exited(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphaned helper (pid %d) still runs 10 s after its parent exited", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exited reports whether the process is gone or a zombie (an orphan's
// adopter may not reap it at once).
func exited(pid int) bool {
	if runtime.GOOS != "linux" {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z'
}
