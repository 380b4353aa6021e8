//go:build js

package wasmworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall/js"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// jsConn is a connection through the browser's own WebSocket object.
//
// The page's worker uses it directly rather than through a WebSocket
// library: the library's types bring net/http, crypto/tls and x509 into
// the build, about two thirds of the worker.wasm every volunteer downloads
// and every page compiles. The browser does the framing, masking and
// close handshake; this is the glue.
type jsConn struct {
	ws    js.Value
	funcs []js.Func // the event handlers, released once the socket closed
	limit atomic.Int64

	mu     sync.Mutex
	queue  []jsMessage   // received, not yet read
	err    error         // why the connection ended, once it has
	ready  chan struct{} // one token while queue may hold messages
	closed chan struct{} // closed when the connection ends
	opened chan struct{} // closed when the socket opened
}

type jsMessage struct {
	binary bool
	data   []byte
}

// dial opens a WebSocket to url through the browser and waits until it is
// open. A browser's WebSocket sends no Authorization header: key is not
// used (Config.Key).
func dial(ctx context.Context, url, key string) (_ conn, err error) {
	c := &jsConn{ready: make(chan struct{}, 1), closed: make(chan struct{}), opened: make(chan struct{})}
	c.limit.Store(protocol.DefaultMaxFrameBytes)
	if err := catch(func() { c.ws = js.Global().Get("WebSocket").New(url) }); err != nil {
		return nil, fmt.Errorf("open WebSocket %s: %w", url, err)
	}
	c.ws.Set("binaryType", "arraybuffer")
	// The handlers run on the browser's event loop: none of them may block.
	c.handle("open", func(js.Value) { close(c.opened) })
	c.handle("message", c.receive)
	c.handle("close", func(e js.Value) {
		c.end(fmt.Errorf("connection closed (code %d%s)", e.Get("code").Int(), reason(e.Get("reason").String())))
		for _, name := range []string{"onopen", "onmessage", "onclose", "onerror"} {
			c.ws.Set(name, js.Null())
		}
		for _, f := range c.funcs {
			f.Release()
		}
	})
	// An error event says nothing of its cause; in browsers the close event
	// follows, elsewhere (Node) the socket may just be closed.
	c.handle("error", func(js.Value) {
		if c.ws.Get("readyState").Int() == 3 {
			c.end(errors.New("connection failed"))
		}
	})
	select {
	case <-c.opened:
		return c, nil
	case <-c.closed:
		return nil, c.err
	case <-ctx.Done():
		c.CloseNow()
		return nil, ctx.Err()
	}
}

func reason(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

// handle sets the socket's on<event> handler.
func (c *jsConn) handle(event string, h func(e js.Value)) {
	f := js.FuncOf(func(_ js.Value, args []js.Value) any {
		h(args[0])
		return nil
	})
	c.funcs = append(c.funcs, f)
	c.ws.Set("on"+event, f)
}

// receive queues a message event's data for Read.
func (c *jsConn) receive(e js.Value) {
	d := e.Get("data")
	var m jsMessage
	if d.Type() == js.TypeString {
		m.data = []byte(d.String())
	} else {
		u := js.Global().Get("Uint8Array").New(d)
		m.data = make([]byte, u.Length())
		js.CopyBytesToGo(m.data, u)
		m.binary = true
	}
	c.mu.Lock()
	c.queue = append(c.queue, m)
	c.mu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// end records why the connection ended, the first time.
func (c *jsConn) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.closed)
	}
}

// Read returns the next message received; those received before the
// server closed the connection are read first (after the worker's own
// close, none is).
func (c *jsConn) Read(ctx context.Context) (bool, []byte, error) {
	for {
		if err := ctx.Err(); err != nil {
			return false, nil, err
		}
		c.mu.Lock()
		if len(c.queue) > 0 {
			m := c.queue[0]
			c.queue[0] = jsMessage{}
			c.queue = c.queue[1:]
			if len(c.queue) > 0 {
				select {
				case c.ready <- struct{}{}:
				default:
				}
			}
			c.mu.Unlock()
			if n := c.limit.Load(); int64(len(m.data)) > n {
				err := fmt.Errorf("message of %d bytes is over the limit of %d", len(m.data), n)
				c.close("message too big")
				return false, nil, err
			}
			return m.binary, m.data, nil
		}
		err := c.err
		c.mu.Unlock()
		if err != nil {
			return false, nil, err
		}
		select {
		case <-c.ready:
		case <-c.closed:
		case <-ctx.Done():
			return false, nil, ctx.Err()
		}
	}
}

// maxBuffered is how much the browser may hold unsent before Write waits:
// on a connection that stalled (a phone between networks) Write then fails
// when its context ends, as the native one does, and the worker reconnects.
const maxBuffered = 8 << 20

// buffersWrites marks jsConn as a bufferingConn: the browser queues what
// Write hands it.
func (c *jsConn) buffersWrites() {}

// Write hands one message to the browser, which queues it for sending,
// once the browser holds less than maxBuffered unsent.
func (c *jsConn) Write(ctx context.Context, binary bool, data []byte) error {
	for {
		select {
		case <-c.closed:
			return c.err
		default:
		}
		if c.ws.Get("bufferedAmount").Int() < maxBuffered {
			break
		}
		select {
		case <-c.closed:
			return c.err
		case <-ctx.Done():
			c.close("send stalled")
			return fmt.Errorf("send: %d bytes unsent: %w", c.ws.Get("bufferedAmount").Int(), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	var v any
	if binary {
		u := js.Global().Get("Uint8Array").New(len(data))
		js.CopyBytesToJS(u, data)
		v = u
	} else {
		v = string(data)
	}
	if err := catch(func() { c.ws.Call("send", v) }); err != nil {
		c.close("send failed")
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// SetReadLimit sets the largest message Read returns.
func (c *jsConn) SetReadLimit(n int64) { c.limit.Store(n) }

// CloseNow starts the close handshake and ends the connection for Read
// and Write at once.
func (c *jsConn) CloseNow() error {
	c.close("")
	return nil
}

// close ends the connection for Read and Write and starts the close
// handshake. (A page may only send code 1000 or 3000 to 4999; why says the
// rest.)
func (c *jsConn) close(why string) {
	c.end(errors.New("connection closed by the worker"))
	c.mu.Lock()
	c.queue = nil
	c.mu.Unlock()
	catch(func() { c.ws.Call("close", 1000, why) })
}

// catch runs f and returns the JavaScript exception it threw, if any.
func catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			jerr, ok := r.(js.Error)
			if !ok {
				panic(r)
			}
			if jerr.Type() == js.TypeObject {
				err = errors.New(jerr.Get("message").String())
			} else {
				err = errors.New(jerr.Value.String())
			}
		}
	}()
	f()
	return nil
}

// moduleFetcher returns nil: in the browser, the page fetches and compiles
// modules itself (through the HTTP cache and IndexedDB), never through Go.
func (w *Worker) moduleFetcher(server, id string) func(context.Context) ([]byte, error) {
	return nil
}

// putOutput sends one upload through the browser's fetch and reports
// whether a failure may pass. The page holds its outputs in memory
// anyway: the body is copied to JavaScript whole.
func putOutput(ctx context.Context, u string, body io.Reader, size int64) (protocol.Uploaded, bool, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return protocol.Uploaded{}, false, err
	}
	status, statusText, text, err := fetchJS(ctx, "PUT", u, b)
	if err != nil {
		return protocol.Uploaded{}, true, err
	}
	if status != 200 {
		retry, err := uploadError(status, fmt.Sprintf("%d %s", status, statusText), text)
		return protocol.Uploaded{}, retry, err
	}
	var got protocol.Uploaded
	if err := json.Unmarshal(text, &got); err != nil {
		return protocol.Uploaded{}, false, fmt.Errorf("the server's answer %q: %w", text, err)
	}
	return got, false, nil
}

// getBytes downloads u, of size bytes, through the browser's fetch.
func getBytes(ctx context.Context, u string, size int64) ([]byte, error) {
	status, _, data, err := fetchJS(ctx, "GET", u, nil)
	switch {
	case err != nil:
		return nil, err
	case status != 200:
		return nil, fmt.Errorf("status %d", status)
	case int64(len(data)) != size:
		return nil, fmt.Errorf("%d bytes arrived, not %d", len(data), size)
	}
	return data, nil
}

// fetchJS makes one request through the browser's fetch, with body when
// not nil, and returns the answer's status and bytes; ctx aborts it.
func fetchJS(ctx context.Context, method, u string, body []byte) (status int, statusText string, data []byte, err error) {
	type answer struct {
		data []byte
		err  error
	}
	done := make(chan answer, 1)
	var then, fail, read js.Func
	defer func() { then.Release(); fail.Release(); read.Release() }()
	fail = js.FuncOf(func(_ js.Value, args []js.Value) any {
		msg := "fetch failed"
		if len(args) > 0 && args[0].Type() == js.TypeObject {
			msg = args[0].Get("message").String()
		}
		done <- answer{err: errors.New(msg)}
		return nil
	})
	read = js.FuncOf(func(_ js.Value, args []js.Value) any {
		arr := js.Global().Get("Uint8Array").New(args[0])
		b := make([]byte, arr.Get("length").Int())
		js.CopyBytesToGo(b, arr)
		done <- answer{data: b}
		return nil
	})
	then = js.FuncOf(func(_ js.Value, args []js.Value) any {
		status, statusText = args[0].Get("status").Int(), args[0].Get("statusText").String()
		args[0].Call("arrayBuffer").Call("then", read, fail)
		return nil
	})
	ctrl := js.Global().Get("AbortController").New()
	if err := catch(func() {
		opts := js.Global().Get("Object").New()
		opts.Set("method", method)
		opts.Set("signal", ctrl.Get("signal"))
		if body != nil {
			arr := js.Global().Get("Uint8Array").New(len(body))
			js.CopyBytesToJS(arr, body)
			opts.Set("body", arr)
		}
		js.Global().Call("fetch", u, opts).Call("then", then, fail)
	}); err != nil {
		return 0, "", nil, err
	}
	select {
	case a := <-done:
		return status, statusText, a.data, a.err
	case <-ctx.Done():
		ctrl.Call("abort")
		<-done
		return 0, "", nil, ctx.Err()
	}
}
