//go:build unix

package dirlock

import (
	"os"
	"path/filepath"
	"syscall"
)

// Take takes dir for this process: an exclusive flock on dir/.lock, held
// until release is called or the process ends. It reports false when
// another process (or another Take in this one) holds it, or the lock
// file cannot be made.
func Take(dir string) (release func(), ok bool) {
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
