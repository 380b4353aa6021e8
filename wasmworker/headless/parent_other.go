//go:build !unix

package headless

import "os"

// watchParent makes a slot process exit when its worker dies, even while
// it runs compiled code and reads nothing: a goroutine waits on the
// parent's process handle (on Windows, any process can be waited for). It
// reports true: the watcher needs a P of its own (compiled WebAssembly
// cannot be preempted).
func watchParent() bool {
	p, err := os.FindProcess(os.Getppid())
	if err != nil {
		return false
	}
	go func() {
		_, _ = p.Wait()
		os.Exit(3)
	}()
	return true
}
