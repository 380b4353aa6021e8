//go:build unix && !linux

package headless

import (
	"os"
	"time"
)

// watchParent makes a slot process exit when its worker dies, even while
// it runs compiled code and reads nothing: macOS and the BSDs have no
// parent-death signal, so a goroutine watches for the change of parent.
// It reports true: the watcher needs a P of its own (compiled WebAssembly
// cannot be preempted).
func watchParent() bool {
	go pollParent(time.Second, func() { os.Exit(3) })
	return true
}
