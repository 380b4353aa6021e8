//go:build unix

package headless

import (
	"os"
	"time"
)

// pollParent calls gone once this process's parent has exited, which it
// sees as a change of parent (an orphan is adopted by init or a
// subreaper). It checks every interval and never returns before gone.
func pollParent(interval time.Duration, gone func()) {
	parent := os.Getppid()
	for os.Getppid() == parent {
		time.Sleep(interval)
	}
	gone()
}
