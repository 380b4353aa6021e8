package wasmworker

import (
	"context"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// The worker's WebSocket dials with the kernel bounds on a dead
// connection: TCP_USER_TIMEOUT and keepalive probes, as set by
// wsDialer's dialer, which dial uses.
func TestDialBoundsDeadConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	d := wsDialer()
	if d.NetDialContext == nil {
		t.Fatal("the WebSocket's dialer has no TCP dialer of its own")
	}
	c, err := d.NetDialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		level, opt int
		want       int
	}{
		{"TCP_USER_TIMEOUT (ms)", unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(connUserTimeout.Milliseconds())},
		{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE (s)", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(connKeepAliveIdle.Seconds())},
		{"TCP_KEEPINTVL (s)", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(connKeepAliveEvery.Seconds())},
		{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, connKeepAliveCount},
	}
	for _, tc := range tests {
		var got int
		var gerr error
		if err := raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), tc.level, tc.opt) }); err != nil {
			t.Fatal(err)
		}
		if gerr != nil {
			t.Errorf("%s: %v", tc.name, gerr)
		} else if got != tc.want {
			t.Errorf("%s = %d, want %d", tc.name, got, tc.want)
		}
	}
}
