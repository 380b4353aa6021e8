//go:build !js

package wasmworker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// wsConn adapts a github.com/gorilla/websocket connection to conn: a
// context's deadline becomes the read's or write's, and a context that
// ends without one does not end the call (the session closes the
// connection when it ends, which does). The worker writes from one
// goroutine at a time (the hello, then its write loop), as gorilla needs.
type wsConn struct {
	*websocket.Conn
	readDeadline bool // a read deadline is set (only Read touches it)
}

// Bounds the kernel keeps on a worker's socket, so that a server whose
// machine or network is gone without closing the socket is left, and the
// worker connects again (to another server if it has several), in well
// under a minute rather than when TCP gives up, a quarter of an hour on
// Linux. Heartbeats go every few seconds, so a dead peer shows as data left
// unacknowledged: connUserTimeout bounds that (TCP_USER_TIMEOUT, on Linux);
// the keepalive probes cover a connection with nothing to send. Unlike a
// bound on the server's frames, neither trips while the server is slow (its
// kernel still acknowledges) or while a large frame is on its way.
const (
	connUserTimeout    = 45 * time.Second
	connKeepAliveIdle  = 15 * time.Second
	connKeepAliveEvery = 5 * time.Second
	connKeepAliveCount = 4
)

// dialer is the worker's TCP dialer, with the bounds above.
func dialer() *net.Dialer {
	return &net.Dialer{
		Timeout: 10 * time.Second,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: connKeepAliveIdle, Interval: connKeepAliveEvery,
			Count: connKeepAliveCount},
		Control: setUserTimeout,
	}
}

// wsDialer is the worker's WebSocket dialer: its own TCP dialer, the
// environment's proxy, and no compression (frames are small and mostly
// unique; compression costs more CPU than it saves). Its buffers are
// large: a client masks what it sends, so gorilla copies a message into
// the write buffer and sends one WebSocket frame per buffer, and a
// batch of results is tens of KiB (a worker has one connection).
func wsDialer() *websocket.Dialer {
	return &websocket.Dialer{
		NetDialContext:   dialer().DialContext,
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   64 << 10,
		WriteBufferSize:  256 << 10,
	}
}

// dial opens a WebSocket to url, presenting key (Config.Key) if any.
func dial(ctx context.Context, url, key string) (conn, error) {
	var h http.Header
	if key != "" {
		h = http.Header{"Authorization": {"Bearer " + key}}
	}
	ws, resp, err := wsDialer().DialContext(ctx, url, h)
	if err != nil {
		if resp != nil {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			return nil, fmt.Errorf("%w: %s %s", err, resp.Status, strings.TrimSpace(string(msg)))
		}
		return nil, err
	}
	return &wsConn{Conn: ws}, nil
}

func (c *wsConn) Read(ctx context.Context) (bool, []byte, error) {
	// The read loop's Reads have no deadline: most frames cost no call.
	if d, ok := ctx.Deadline(); ok || c.readDeadline {
		if err := c.Conn.SetReadDeadline(d); err != nil {
			return false, nil, err
		}
		c.readDeadline = ok
	}
	typ, data, err := c.Conn.ReadMessage()
	return typ == websocket.BinaryMessage, data, err
}

func (c *wsConn) Write(ctx context.Context, binary bool, data []byte) error {
	typ := websocket.TextMessage
	if binary {
		typ = websocket.BinaryMessage
	}
	d, _ := ctx.Deadline()
	if err := c.Conn.SetWriteDeadline(d); err != nil {
		return err
	}
	return c.Conn.WriteMessage(typ, data)
}

// CloseNow closes the connection at once, without a close message.
func (c *wsConn) CloseNow() error { return c.Conn.Close() }

// moduleFetcher returns the Job.Fetch of an attempt of module id: the
// module's bytes, from the worker's memory or from server.
func (w *Worker) moduleFetcher(server, id string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) { return w.fetchModule(ctx, server, id) }
}

// fetchModule returns module bytes, from memory or from the server. A
// failure of the network or of the server (5xx, 429) is tried again twice
// (after 0.5 s and 2 s) before it is given up; a 404 is ErrNoSuchModule.
func (w *Worker) fetchModule(ctx context.Context, server, id string) ([]byte, error) {
	w.mu.Lock()
	b, ok := w.modules[id]
	w.mu.Unlock()
	if ok {
		return b, nil
	}
	var err error
	for try, wait := 0, 500*time.Millisecond; ; try, wait = try+1, 4*wait {
		var again bool
		b, again, err = getModule(ctx, server, id)
		if err == nil || !again || try == 2 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if len(w.modules) > 64 {
		clear(w.modules)
	}
	w.modules[id] = b
	w.mu.Unlock()
	return b, nil
}

// getModule downloads module id once, and says whether a failure may pass.
func getModule(ctx context.Context, server, id string) (b []byte, again bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(server, "/")+"/modules/"+id, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, ctx.Err() == nil, fmt.Errorf("fetch module %s: %w", id, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, false, fmt.Errorf("fetch module %s: %w", id, ErrNoSuchModule)
	case resp.StatusCode != http.StatusOK:
		again := resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests
		return nil, again, fmt.Errorf("fetch module %s: %s", id, resp.Status)
	}
	b, err = io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, ctx.Err() == nil, fmt.Errorf("fetch module %s: %w", id, err)
	}
	return b, false, nil
}

// putOutput sends one upload and reports whether a failure may pass.
func putOutput(ctx context.Context, u string, body io.Reader, size int64) (protocol.Uploaded, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, body)
	if err != nil {
		return protocol.Uploaded{}, false, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return protocol.Uploaded{}, true, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		retry, err := uploadError(resp.StatusCode, resp.Status, msg)
		return protocol.Uploaded{}, retry, err
	}
	var got protocol.Uploaded
	if err := json.Unmarshal(msg, &got); err != nil {
		return protocol.Uploaded{}, false, fmt.Errorf("the server's answer %q: %w", msg, err)
	}
	return got, false, nil
}

// getBytes downloads u, of size bytes.
func getBytes(ctx context.Context, u string, size int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, size+1))
	if err == nil && int64(len(b)) != size {
		err = fmt.Errorf("%d bytes arrived, not %d", len(b), size)
	}
	return b, err
}
