//go:build !js

package wasmworker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/coder/websocket"
)

// wsConn adapts a github.com/coder/websocket connection to conn.
type wsConn struct{ *websocket.Conn }

// dial opens a WebSocket to url, without compression (frames are small
// and mostly unique; compression costs more CPU than it saves).
func dial(ctx context.Context, url string) (conn, error) {
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil, err
	}
	return wsConn{ws}, nil
}

func (c wsConn) Read(ctx context.Context) (bool, []byte, error) {
	typ, data, err := c.Conn.Read(ctx)
	return typ == websocket.MessageBinary, data, err
}

func (c wsConn) Write(ctx context.Context, binary bool, data []byte) error {
	typ := websocket.MessageText
	if binary {
		typ = websocket.MessageBinary
	}
	return c.Conn.Write(ctx, typ, data)
}

// moduleFetcher returns the Job.Fetch of an attempt of module id: the
// module's bytes, from the worker's memory or from server.
func (w *Worker) moduleFetcher(server, id string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) { return w.fetchModule(ctx, server, id) }
}

// fetchModule returns module bytes, from memory or from the server.
func (w *Worker) fetchModule(ctx context.Context, server, id string) ([]byte, error) {
	w.mu.Lock()
	b, ok := w.modules[id]
	w.mu.Unlock()
	if ok {
		return b, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(server, "/")+"/modules/"+id, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch module %s: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch module %s: %s", id, resp.Status)
	}
	b, err = io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("fetch module %s: %w", id, err)
	}
	w.mu.Lock()
	if len(w.modules) > 64 {
		clear(w.modules)
	}
	w.modules[id] = b
	w.mu.Unlock()
	return b, nil
}
