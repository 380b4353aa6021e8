//go:build !js

package wasmworker

import "github.com/coder/websocket"

func (w *Worker) dialOptions() *websocket.DialOptions {
	return &websocket.DialOptions{HTTPClient: w.cfg.HTTPClient, CompressionMode: websocket.CompressionDisabled}
}
