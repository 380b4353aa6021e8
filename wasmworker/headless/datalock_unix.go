//go:build unix

package headless

import (
	"os"
	"path/filepath"
	"syscall"
)

// lockDataDir takes the data cache at dir for this process (an exclusive
// flock on dir/.lock, released when the process ends): it reports false
// when another worker holds it.
func lockDataDir(dir string) (release func(), ok bool) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}
