//go:build !linux && !darwin

package pgembed

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// supported reports why the embedded cluster cannot run here.
func supported() error {
	return errors.New("pgembed: the embedded PostgreSQL runs on Linux and macOS only; give an existing database instead (--database-url)")
}

func lockFile(*os.File) error                     { return supported() }
func ownerOf(os.FileInfo) (uid, gid uint32)       { return 0, 0 }
func stopProcess(int, time.Duration)              {}
func (cr *credential) attr() *syscall.SysProcAttr { return nil }
func totalMemory() int64                          { return 1 << 30 }
func isOurPostmaster(int, string, int64) bool     { return false }
