package wasmworker

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setUserTimeout sets TCP_USER_TIMEOUT (connUserTimeout) on a socket
// before it connects: how long sent data may stay unacknowledged before
// the kernel closes the connection.
func setUserTimeout(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(connUserTimeout.Milliseconds()))
	}); err != nil {
		return err
	}
	return serr
}
