//go:build !js && !linux

package wasmworker

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist: there
// only the keepalive probes bound a dead connection, and only while it has
// nothing to send.
func setUserTimeout(_, _ string, _ syscall.RawConn) error { return nil }
