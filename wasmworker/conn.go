package wasmworker

import "context"

// conn is the worker's end of one WebSocket connection to a server, in
// whole messages: text for JSON frames, binary for the binary ones. The
// headless worker's is github.com/gorilla/websocket's (net_native.go); the
// browser's drives the page's own WebSocket object (net_js.go), so that
// the Go worker a volunteer downloads carries no HTTP client.
type conn interface {
	// Read returns the next message; it fails once the connection closed.
	Read(ctx context.Context) (binary bool, data []byte, err error)
	// Write sends one message.
	Write(ctx context.Context, binary bool, data []byte) error
	// SetReadLimit sets the largest message Read accepts; a larger one
	// closes the connection.
	SetReadLimit(n int64)
	// CloseNow closes the connection at once.
	CloseNow() error
}

// A bufferingConn is a conn whose Write returns at once, the transport
// buffering the message (the browser's WebSocket, up to maxBuffered
// unsent). The worker writes to one from the goroutine that sends, rather
// than handing each frame to a writer goroutine: in Go's WebAssembly every
// hand-off between goroutines costs tens of microseconds of a task's
// latency.
type bufferingConn interface {
	conn
	buffersWrites()
}
