package server

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Connections that send nothing, or nothing more after a request, are
// closed: anyone on the internet could otherwise hold a file and a
// goroutine of the server's with each for ever, and a process may hold
// only so many files. A header too large is refused.
func TestIdleConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	st, _, _ := openStore(t)
	s := New(st, Config{HeaderTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	hs := s.HTTPServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// The test's own bound: a connection the server keeps open fails
		// with a timeout rather than hanging the test.
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		return c
	}
	closed := func(what string, r io.Reader) {
		t.Helper()
		if _, err := io.ReadAll(r); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("%s: still open", what)
			}
		}
	}

	closed("a connection that sends nothing", dial())

	c := dial()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatal("the server closed a kept-alive connection at once")
	}
	closed("a kept-alive connection that sends nothing more", br)

	c = dial()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 100<<10)+"\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a header of 100 KiB: %v, %v; want 431", resp, err)
	}
}
