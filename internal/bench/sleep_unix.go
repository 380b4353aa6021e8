//go:build unix

package bench

import "syscall"

// sleepProcess stops p (SIGSTOP), as a phone that falls asleep stops its
// browser: its sockets stay open and say nothing.
func sleepProcess(p *process) error { return p.cmd.Process.Signal(syscall.SIGSTOP) }

// wakeProcess continues p after sleepProcess (SIGCONT).
func wakeProcess(p *process) error { return p.cmd.Process.Signal(syscall.SIGCONT) }
