package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/throttle"
	"github.com/cyclepool/cyclepool/internal/workflow"
)

// A worker's WebSocket session: the upgrade and who may connect
// (handleWorker), the greeting (greet), the read loop with its fencing and
// payload budgets (readLoop, readFrame), and what each frame does
// (handleFrame, finish). The hub (hub.go) keeps the connections and their
// slots; budget.go the payload budgets.

// handleWorker serves /ws/worker: one WebSocket per worker.
//
// A worker that sends Authorization: Bearer with an operator key is one of
// the operator's own machines (store.WorkerHello.Operator); a key the
// server does not know is refused before the upgrade.
func (s *Server) handleWorker(w http.ResponseWriter, r *http.Request) {
	operator := false
	key := bearer(r)
	if wait := s.gate.keptOutFor(remoteHost(r), time.Now()); wait > 0 && key == "" {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		http.Error(w, "this address broke the worker protocol too often; try again later", http.StatusTooManyRequests)
		return
	}
	if key != "" {
		// A key not yet accepted is looked up only for an address not
		// past its wrong secrets (Server.failures), as the API's tokens.
		done := func(bool) {}
		if _, known := s.operatorKeys.Load(key); !known {
			wait, d, err := s.failures.Begin(r.Context(), remoteHost(r))
			if err != nil {
				return // the client is gone
			}
			if wait > 0 {
				w.Header().Set("Retry-After", throttle.RetryAfter(wait))
				http.Error(w, "too many unknown operator keys from this address; try again later", http.StatusTooManyRequests)
				return
			}
			done = d
			defer done(false) // done at once below, unless the lookup panics
		}
		ok, err := s.operatorKeyValid(r.Context(), key)
		done(err == nil && !ok) // a wrong secret: past Server.failures, keys are no longer looked up
		switch {
		case err != nil:
			s.log.Warn("check operator key", "err", err)
			w.Header().Set("Retry-After", "5")
			http.Error(w, "the server could not check the operator key just now; try again", http.StatusServiceUnavailable)
			return
		case !ok:
			// Guessing keys is a refusal like a bad hello (an address
			// that keeps guessing is kept out of keyless connections)
			// and a wrong secret (counted by done above).
			s.gate.refused(remoteHost(r), time.Now())
			s.log.Info("worker refused: unknown operator key", "remote", r.RemoteAddr)
			http.Error(w, "unknown operator key: connect without one, or with a key `cyclepool serve` made", http.StatusUnauthorized)
			return
		}
		operator = true
	}
	ws, err := s.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade answered the request
	}
	ws.SetReadLimit(int64(s.cfg.MaxFrameBytes))
	ctx, cancel := context.WithCancel(s.ctx)
	c, err := s.greet(ctx, ws, r, operator)
	if err != nil {
		defer cancel()
		if perr := (protocolError{}); !operator && errors.As(err, &perr) {
			s.gate.refused(remoteHost(r), time.Now())
		}
		s.log.Info("worker refused", "remote", r.RemoteAddr, "err", err)
		s.sendError(nil, ws, err.Error())
		closeWith(ws, websocket.ClosePolicyViolation, err.Error())
		return
	}
	// The connection lives on in a goroutine of its own, and the request's
	// ends here: its stack grew through the upgrade and the greeting (the
	// worker's registration in the database), and an idle worker would
	// keep that for as long as it stays connected.
	go s.serveWorker(ctx, cancel, ws, c)
}

// operatorKeyValid reports whether key is an operator key. Keys found are
// remembered (they are never taken back: store.AddOperatorKey), so that
// the operator's machines reconnecting at once, as when a replica dies,
// cost no query each; keys not found are looked up every time, so that a
// key another replica just made works at once.
func (s *Server) operatorKeyValid(ctx context.Context, key string) (bool, error) {
	if _, ok := s.operatorKeys.Load(key); ok {
		return true, nil
	}
	ok, err := s.store.OperatorKeyValid(ctx, key)
	if ok {
		s.operatorKeys.Store(key, true)
	}
	return ok, err
}

// serveWorker serves a greeted worker's connection until it closes.
func (s *Server) serveWorker(ctx context.Context, cancel context.CancelFunc, ws *websocket.Conn, c *conn) {
	defer cancel()
	// A bug met while handling one worker's frames closes that socket
	// only, as net/http's recovery did when this ran on the request's
	// goroutine; the deferred clean-up below runs first.
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("worker connection panicked", "panic", v, "stack", string(debug.Stack()))
			ws.Close()
		}
	}()
	s.metrics.workerConnects.WithLabelValues(c.kind).Inc()
	s.hub.add(c)
	var grace time.Duration // set once the read loop ended: see peerClosed
	defer func() {
		unstarted, mayHaveRun := s.hub.remove(c) // from now on nothing more is sent to c
		// Attempts sent to it before their commit returned exist once
		// it has: they may be among those ended below.
		_ = s.hub.gates.wait(s.ctx, c.id)
		c.qmu.Lock()
		close(c.done)
		c.qmu.Unlock()
		if s.ctx.Err() != nil {
			return // shutting down: Run marks all of this replica's workers gone at once
		}
		gctx, gcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer gcancel()
		// The attempts it held in its queue go back at once, at their
		// tasks' places and charged to nobody: there is no lease to wait
		// out for work that never started. Those it may have been running
		// wait for the worker to come back with their results for
		// ReconnectGrace at most, not for the rest of their leases, when
		// the worker's side closed the socket: a worker that went away,
		// or one that reconnects at once (docs/RATIONALE.md).
		returned, err := s.store.WorkerGone(gctx, store.Gone{Worker: c.id, Session: c.session,
			Unstarted: unstarted, MayHaveRun: mayHaveRun, Grace: grace})
		if err != nil {
			s.log.Warn("record worker gone", "worker", c.id, "err", err)
		}
		if returned > 0 {
			c.log.Info("worker left; the attempts in its queue went back", "attempts", returned)
			s.wake()
		}
	}()
	s.wakeSlots()
	err := s.readLoop(ctx, c)
	if peerClosed(err) && !c.silenced.Load() {
		grace = s.cfg.ReconnectGrace
	}
	var ce *websocket.CloseError
	switch {
	case err == nil, errors.As(err, &ce), errors.Is(err, context.Canceled):
		c.log.Debug("worker disconnected", "err", err)
	default:
		c.log.Info("worker connection closed", "err", err)
		var perr protocolError
		if errors.As(err, &perr) {
			s.sendError(&c.wmu, ws, perr.Error())
			closeWith(ws, websocket.ClosePolicyViolation, perr.Error())
		}
	}
	ws.Close()
}

// peerClosed reports whether the read loop's error says the worker's side
// closed the connection: a close frame, or the connection's end without
// one (a process killed: EOF, or a reset). Not a close of this replica's
// own (a protocol error, silence, a write that failed or timed out, which
// close the socket here first), nor the replica's shutdown.
func peerClosed(err error) bool {
	var ce *websocket.CloseError
	switch {
	case err == nil, errors.Is(err, net.ErrClosed), errors.Is(err, context.Canceled):
		return false
	case errors.As(err, &ce), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return true
	}
	return false
}

// protocolError is a frame that breaks the protocol; it closes that socket only.
type protocolError struct{ error }

// sendError sends an error frame, within a second, holding mu (nil
// before the connection has a writer of its own).
func (s *Server) sendError(mu *sync.Mutex, ws *websocket.Conn, msg string) {
	data, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeError, Error: &protocol.Error{Message: msg}})
	if mu == nil {
		mu = new(sync.Mutex)
	}
	_ = writeMessage(mu, ws, false, data, time.Second)
}

// storable returns s as PostgreSQL can store it in text and jsonb: valid
// UTF-8 without NUL characters (JSON's \u0000 decodes to one).
func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, ""), "\x00", "")
}

// truncate cuts s to at most n bytes, on a character boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Bounds of the device strings a worker reports (hello, heartbeat), which
// the database keeps with the worker's record.
const (
	maxUserAgent     = 512
	maxConnection    = 32
	maxPausedBecause = 200
)

// cleanDevice returns d within the bounds of docs/PROTOCOL.md: free-form
// strings truncated, each enumerated one either one of its values (or
// absent) or "unknown", numbers out of their range unknown.
func cleanDevice(d protocol.Device) protocol.Device {
	enum := func(v string, allowed ...string) string {
		if v == "" || slices.Contains(allowed, v) {
			return v
		}
		return protocol.Unknown
	}
	d.Charging = enum(d.Charging, "yes", "no", protocol.Unknown)
	d.SaveData = enum(d.SaveData, "yes", "no", protocol.Unknown)
	d.Online = enum(d.Online, "yes", "no", protocol.Unknown)
	d.Visibility = enum(d.Visibility, "visible", "hidden", protocol.Unknown)
	d.UserAgent = storable(truncate(d.UserAgent, maxUserAgent))
	d.Connection = storable(truncate(d.Connection, maxConnection))
	d.PausedBecause = storable(truncate(d.PausedBecause, maxPausedBecause))
	within := func(p *float64, hi float64) *float64 {
		if p == nil || !(*p >= 0 && *p <= hi) {
			return nil
		}
		return p
	}
	d.Battery = within(d.Battery, 1)
	d.DownlinkMbps = within(d.DownlinkMbps, 1e6)
	d.RTTMillis = within(d.RTTMillis, 1e7)
	d.MemoryGiB = within(d.MemoryGiB, 1<<20)
	if d.Cores < 0 || d.Cores > 1<<16 {
		d.Cores = 0
	}
	return d
}

// knownReason reports whether r is one of the failure reasons of the
// protocol (docs/PROTOCOL.md).
func knownReason(r string) bool {
	switch r {
	case protocol.ReasonMemory, protocol.ReasonWallTime, protocol.ReasonOutput, protocol.ReasonLog,
		protocol.ReasonExit, protocol.ReasonTrap, protocol.ReasonModule, protocol.ReasonCancelled, protocol.ReasonWorker,
		protocol.ReasonCrashed:
		return true
	}
	return false
}

// failEnding is how an attempt a worker reports failed ended, by the
// reason the worker gives: whom it charges is store.Ending's to say.
func failEnding(reason string) store.Ending {
	switch reason {
	case protocol.ReasonWorker:
		return store.EndHandedBack
	case protocol.ReasonCancelled:
		return store.EndCancelled
	case protocol.ReasonCrashed:
		return store.EndCrashed
	}
	return store.EndTaskError
}

// greet reads hello, registers the worker and sends welcome. A hello that
// breaks the protocol is a protocolError.
func (s *Server) greet(ctx context.Context, ws *websocket.Conn, r *http.Request, operator bool) (*conn, error) {
	// hello is read under a small limit of its own, within 10 s: it
	// comes before anything is known of the worker.
	if err := ws.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ws.Close() })
	defer stop()
	typ, hr, err := ws.NextReader()
	if err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(hr, helloMaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if len(data) > helloMaxBytes {
		return nil, protocolError{fmt.Errorf("hello refused: over %d bytes", helloMaxBytes)}
	}
	if err := ws.SetReadDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	f, err := protocol.Decode(data, typ == websocket.BinaryMessage)
	if err != nil {
		return nil, protocolError{err}
	}
	if f.Type != protocol.TypeHello {
		return nil, protocolError{fmt.Errorf("first frame must be hello, got %q", f.Type)}
	}
	h := f.Hello
	h.Device = cleanDevice(h.Device)
	switch {
	case h.Version != protocol.Version:
		return nil, protocolError{fmt.Errorf("protocol version %d is not supported (server speaks %d)", h.Version, protocol.Version)}
	case h.Kind != protocol.KindHeadless && h.Kind != protocol.KindBrowser:
		return nil, protocolError{fmt.Errorf("unknown worker kind %q", h.Kind)}
	case h.Slots < 1 || h.Slots > 256:
		return nil, protocolError{fmt.Errorf("slots must be 1 to 256, got %d", h.Slots)}
	case h.Queue < 0 || h.Queue > protocol.QueueLimit(h.Slots):
		return nil, protocolError{fmt.Errorf("queue must be 0 to %d for %d slots (%d per slot, %d in all), got %d",
			protocol.QueueLimit(h.Slots), h.Slots, protocol.MaxQueuePerSlot, protocol.MaxQueue, h.Queue)}
	case len(h.Running) > h.Slots+h.Queue:
		return nil, protocolError{fmt.Errorf("%d running attempts for %d slots and a queue of %d", len(h.Running), h.Slots, h.Queue)}
	}
	wh := store.WorkerHello{
		ID: h.WorkerID, Token: h.ReconnectToken, Kind: h.Kind, Slots: h.Slots, Volunteer: storable(truncate(h.Volunteer, 100)),
		Device: h.Device, Replica: s.cfg.Replica, Running: h.Running, RunningComplete: h.RunningComplete, Operator: operator,
		Build: storable(truncate(h.Build, 100)),
	}
	if !operator {
		addr := remoteHost(r)
		wh.AllowNew = func() bool { return s.gate.newIdentity(addr, time.Now()) }
	}
	if err := s.hub.gates.wait(ctx, h.WorkerID); err != nil { // the attempts its hello lists may be committing
		return nil, err
	}
	reg, err := s.register(ctx, wh)
	if err != nil {
		return nil, err
	}
	// Registered: a greeting that fails from here on closes the
	// connection's row (the worker is not connected after all).
	greeted := false
	defer func() {
		if !greeted {
			gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, err := s.store.WorkerGone(gctx, store.Gone{Worker: reg.ID, Session: reg.Session}); err != nil {
				s.log.Warn("record worker gone", "worker", reg.ID, "err", err)
			}
		}
	}()
	id, token, lost := reg.ID, reg.Token, reg.Lost
	c := &conn{
		id: id, session: reg.Session, kind: h.Kind, threads: h.Slots, slots: h.Slots + h.Queue, ws: ws,
		done:    make(chan struct{}),
		log:     s.log.With("worker", id, "kind", h.Kind),
		running: map[int64]heldAttempt{}, paused: h.Device.Paused,
		device: h.Device, connected: time.Now(),
		record:   store.WorkerRecord{ID: id, Kind: h.Kind, Slots: h.Slots, Operator: operator},
		operator: operator, addr: remoteHost(r), setup: slices.Contains(h.Features, protocol.FeatureSetup),
		upload: slices.Contains(h.Features, protocol.FeatureUpload),
	}
	if reg.Record.ID == id {
		// Read with the registration: the worker's standing holds from
		// the start (a record not read holds it to one slot: allowed).
		c.record = reg.Record
	}
	for a, k := range reg.Kept { // the attempts it kept, counted for their owners (hub.add)
		c.running[a] = heldAttempt{module: k.Module, owner: k.Owner}
	}
	for _, id := range h.Data[:min(len(h.Data), protocol.MaxHelloData)] {
		if workflow.IsModuleID(id) {
			c.keep(id)
		}
	}
	c.free = c.slots - len(c.running)
	c.heard.Store(time.Now().UnixNano())
	welcome := &protocol.Frame{Type: protocol.TypeWelcome, Welcome: &protocol.Welcome{
		WorkerID: id, ReconnectToken: token, HeartbeatMS: int(s.cfg.Heartbeat.Milliseconds()),
		IdleHeartbeatMS: int(s.cfg.IdleHeartbeat.Milliseconds()),
		LeaseMS:         int(s.cfg.Lease.Milliseconds()), MaxFrameBytes: s.cfg.MaxFrameBytes, Lost: lost,
	}}
	if c.upload {
		if welcome.Welcome.UploadKey, err = s.uploadKey(ctx, id); err != nil {
			return nil, fmt.Errorf("sign the upload key: %w", err)
		}
	}
	data, _, err = protocol.Encode(welcome)
	if err != nil {
		return nil, err
	}
	if err := writeMessage(&c.wmu, ws, false, data, 10*time.Second); err != nil {
		return nil, fmt.Errorf("send welcome: %w", err)
	}
	c.log.Debug("worker connected", "slots", h.Slots, "resumed", len(c.running), "build", truncate(h.Build, 100))
	greeted = true
	return c, nil
}

// hello is a worker's registration waiting in Server.hellos.
type hello struct {
	h    store.WorkerHello
	done chan registered // answered once, by flushHellos
}

type registered struct {
	reg store.Registration
	err error
}

// register records a greeted worker (store.RegisterWorkers) in a batch
// with the other hellos that arrive meanwhile: when a replica dies, its
// volunteers come to the others all at once, and a transaction each would
// hold the database's connections from the dispatcher's claims and the
// results' commits. The database work runs on the batcher's goroutine,
// whose deep call stacks then stay off the connection's long-lived one
// (Run runs the batcher: a server that does not run greets nobody).
func (s *Server) register(ctx context.Context, h store.WorkerHello) (store.Registration, error) {
	s.metrics.hellosWaiting.Inc()
	defer s.metrics.hellosWaiting.Dec()
	req := hello{h: h, done: make(chan registered, 1)}
	if err := s.hellos.submitAll(ctx, []hello{req}); err != nil {
		return store.Registration{}, fmt.Errorf("register worker: %w", err)
	}
	select {
	case r := <-req.done:
		return r.reg, r.err
	case <-s.ctx.Done():
		// Shutting down: the batcher may be gone, and Run marks every
		// worker of this replica gone.
		return store.Registration{}, fmt.Errorf("register worker: %w", s.ctx.Err())
	}
}

// flushHellos registers a batch of hellos.
func (s *Server) flushHellos(ctx context.Context, batch []hello) {
	hs := make([]store.WorkerHello, len(batch))
	for i := range batch {
		hs[i] = batch[i].h
	}
	start := time.Now()
	s.store.RegisterWorkersEach(ctx, hs, s.cfg.Lease, func(i int, r store.Registration, err error) {
		batch[i].done <- registered{r, err}
	})
	s.metrics.observeBatch("hello", len(batch), start)
}

// readLoop handles the worker's frames until the socket closes. A worker
// that says nothing for two lease periods (at least 10 s) is gone; its
// attempts' leases lapsed long before.
//
// The Reads have no context: the replica's closeSilent closes a silent
// socket, and the end of ctx closes it too. (A context with a deadline per
// Read cost a timer, a context and the connection's AfterFunc per frame.)
// Silence counts only while the loop waits for a frame (conn.waiting):
// handling one may wait for the database, which says nothing of the
// worker.
func (s *Server) readLoop(ctx context.Context, c *conn) error {
	defer context.AfterFunc(ctx, func() { c.ws.Close() })()
	for {
		c.waiting.Store(time.Now().UnixNano())
		f, fenced, hold, err := s.readFrame(ctx, c, func(wait bool) {
			if wait {
				c.waiting.Store(0)
			} else {
				c.waiting.Store(time.Now().UnixNano())
			}
		})
		c.waiting.Store(0)
		if err != nil {
			var perr protocolError
			switch {
			case errors.As(err, &perr):
				s.metrics.badFrames.Inc()
				return err
			case ctx.Err() != nil:
				return ctx.Err()
			case c.silenced.Load():
				return fmt.Errorf("no frame for %v: %w", s.cfg.silenceLimit(), context.DeadlineExceeded)
			}
			return err
		}
		// Attempts sent to it before their commit exist once it ends.
		if err := s.hub.gates.wait(ctx, c.id); err != nil {
			return err
		}
		if s.hub.heardFrom(c) {
			s.wakeSlots() // silent until now: it may have free slots
		}
		if fenced {
			if err := s.fencedReport(c, false); err != nil {
				return err
			}
			err = s.refuseAll(c, f)
		} else {
			c.hold = hold
			err = s.handleFrame(ctx, c, f)
			c.hold = nil
			hold.done()
		}
		if err != nil {
			s.metrics.badFrames.Inc()
			return protocolError{err}
		}
	}
}

// closeSilent closes, every twentieth of the silence limit, the sockets of
// the workers that have sent nothing for that limit while their read loop
// waited. One pass over the connections replaces a timer per connection,
// reset at every frame: tens of thousands of such timers in the runtime's
// heap made it walk them all about every 15 ms (pgx arms a 15 ms timer
// around each write to the database, which marks the heap for a walk),
// 3.5% of a replica's CPU in the scale benchmark (docs/RATIONALE.md).
//
// The same pass takes back the queued attempts of workers that have been
// silent long enough to be given no new work (hub.dropQueued), so that
// they run elsewhere at once rather than when their leases lapse: a phone
// asleep with its queue full held them for a lease.
func (s *Server) closeSilent(ctx context.Context) {
	limit := s.cfg.silenceLimit()
	every(ctx, min(limit/20, s.hub.silent/4), func(ctx context.Context) {
		now := time.Now().UnixNano()
		for _, c := range s.hub.all() {
			if silentFor(c, now, limit) && c.silenced.CompareAndSwap(false, true) {
				s.metrics.silenceCloses.Inc()
				c.ws.Close()
				continue
			}
			if queued := s.hub.dropQueued(c, now); len(queued) > 0 {
				go s.returnQueued(ctx, c, queued)
			}
		}
	})
}

// returnQueued ends the attempts that waited in the queue of c's silent
// worker (hub.dropQueued) as never started: charged to nobody, their tasks
// queued again at their places.
func (s *Server) returnQueued(ctx context.Context, c *conn, queued []int64) {
	// Attempts sent to it before their commit returned exist once it has.
	if err := s.hub.gates.wait(ctx, c.id); err != nil {
		return
	}
	n, err := s.store.EndUnstarted(ctx, c.id, queued, "the worker fell silent before it started the task; queued again")
	if err != nil {
		// They end when the worker reports them cancelled (charged to
		// nobody, queued again), or when their leases lapse.
		s.log.Warn("return the queued attempts of a silent worker", "worker", c.id, "err", err)
		return
	}
	if n > 0 {
		c.log.Info("worker silent; the attempts in its queue went back", "attempts", n)
		s.wake()
	}
}

// silentFor reports whether c's read loop has waited for a frame for limit
// or longer at now (Unix ns).
func silentFor(c *conn, now int64, limit time.Duration) bool {
	since := c.waiting.Load()
	return since != 0 && now-since >= int64(limit)
}

// readFrame reads the worker's next frame. A frame with payload is read in
// two steps: its header first, then, only when the header concerns an
// attempt this connection holds, its payload, within the payload budgets
// (the connection's and the replica's: see payloadLimits) and held in them
// (hold) until the read loop and the frame's outcomes let go. The payload
// of a result, fail or checkpoint for nothing the connection holds is
// skipped without being kept (fenced: the frame's header only, every item
// to be refused). pause(true) is called before waiting for the budgets,
// pause(false) after. A frame that breaks the protocol is a protocolError.
func (s *Server) readFrame(ctx context.Context, c *conn, pause func(bool)) (f *protocol.Frame, fenced bool, hold *payloadHold, err error) {
	typ, r, err := c.ws.NextReader()
	if err != nil {
		return nil, false, nil, err
	}
	if typ == websocket.TextMessage {
		data, err := io.ReadAll(io.LimitReader(r, protocol.MaxHeaderBytes+1))
		if err != nil {
			return nil, false, nil, err
		}
		if len(data) > protocol.MaxHeaderBytes {
			return nil, false, nil, protocolError{fmt.Errorf("decode frame: text message over the %d-byte header limit", protocol.MaxHeaderBytes)}
		}
		f, err := protocol.Decode(data, false)
		if err != nil {
			return nil, false, nil, protocolError{err}
		}
		return f, false, nil, nil
	}
	short := func(err error, what string) error {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return protocolError{errors.New("decode frame: binary message shorter than its " + what)}
		}
		return err
	}
	var prefix [4]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, false, nil, short(err, "length prefix")
	}
	n := binary.BigEndian.Uint32(prefix[:])
	if n > protocol.MaxHeaderBytes {
		return nil, false, nil, protocolError{fmt.Errorf("decode frame: header length %d over the %d-byte limit", n, protocol.MaxHeaderBytes)}
	}
	hdr := make([]byte, 4+int(n), 4+int(n))
	copy(hdr, prefix[:])
	if _, err := io.ReadFull(r, hdr[4:]); err != nil {
		return nil, false, nil, short(err, "header")
	}
	var head protocol.Frame
	if err := json.Unmarshal(hdr[4:], &head); err != nil {
		return nil, false, nil, protocolError{fmt.Errorf("decode frame: %w", err)}
	}
	size, err := payloadSize(&head, s.cfg.MaxFrameBytes-len(hdr))
	if err != nil {
		return nil, false, nil, protocolError{fmt.Errorf("decode %q frame: %w", head.Type, err)}
	}
	if size == 0 {
		f, err := protocol.Decode(hdr, true)
		if err != nil {
			return nil, false, nil, protocolError{err}
		}
		return f, false, nil, nil
	}
	switch head.Type {
	case protocol.TypeResult, protocol.TypeFail, protocol.TypeCheckpoint:
	default:
		return nil, false, nil, protocolError{fmt.Errorf("a worker may not send %q frames with payload", head.Type)}
	}
	if !s.holdsAny(c, &head) {
		m, err := io.Copy(io.Discard, r)
		if err != nil {
			return nil, false, nil, err
		}
		if m != int64(size) {
			return nil, false, nil, protocolError{fmt.Errorf("decode %q frame: %d payload bytes, its header says %d", head.Type, m, size)}
		}
		return &head, true, nil, nil
	}
	total := int64(len(hdr) + size)
	connLimit, replicaLimit := s.payloadLimits()
	pause(true)
	if err := c.inflight.acquire(ctx, total, connLimit); err != nil {
		return nil, false, nil, err
	}
	if err := s.hub.payload.acquire(ctx, total, replicaLimit); err != nil {
		c.inflight.release(total)
		return nil, false, nil, err
	}
	pause(false)
	hold = &payloadHold{n: total, budgets: []*byteBudget{&c.inflight, &s.hub.payload}}
	hold.refs.Store(1)
	defer func() {
		if err != nil {
			hold.done()
			hold = nil
		}
	}()
	data := make([]byte, total)
	copy(data, hdr)
	if _, err := io.ReadFull(r, data[len(hdr):]); err != nil {
		return nil, false, nil, short(err, "payload")
	}
	var more [1]byte
	if _, err := io.ReadFull(r, more[:]); err == nil {
		return nil, false, nil, protocolError{fmt.Errorf("decode %q frame: payload bytes left over", head.Type)}
	} else if !errors.Is(err, io.EOF) {
		return nil, false, nil, err
	}
	f, err = protocol.Decode(data, true)
	if err != nil {
		return nil, false, nil, protocolError{err}
	}
	return f, false, hold, nil
}

// payloadSize adds up the sizes of the blobs in f's header, an error when
// one is negative or they come to more than limit.
func payloadSize(f *protocol.Frame, limit int) (int, error) {
	var bs []protocol.Blob
	for _, a := range f.Assign {
		bs = append(append(append(bs, a.Stdin), a.Inputs...), a.Restore)
	}
	if f.Checkpoint != nil {
		bs = append(bs, f.Checkpoint.State)
	}
	for _, r := range f.Results {
		bs = append(append(bs, r.Outputs...), r.Log)
	}
	for _, fl := range f.Fails {
		bs = append(bs, fl.Log)
	}
	total := 0
	for _, b := range bs {
		if b.Size < 0 || b.Size > limit-total {
			return 0, fmt.Errorf("blob %q of %d bytes: the frame would be over its limit of %d bytes", b.Name, b.Size, limit)
		}
		total += b.Size
	}
	return total, nil
}

// holdsAny reports whether the outcome or checkpoint frame f concerns an
// attempt c holds (the fencing rule: see mayReport).
func (s *Server) holdsAny(c *conn, f *protocol.Frame) bool {
	if f.Checkpoint != nil {
		_, ok := s.hub.holds(c, f.Checkpoint.Attempt)
		return ok
	}
	for _, r := range f.Results {
		if s.hub.mayReport(c, r.Attempt) {
			return true
		}
	}
	for _, fl := range f.Fails {
		if s.hub.mayReport(c, fl.Attempt) {
			return true
		}
	}
	return false
}

// fencedReport counts a result, fail or checkpoint frame of c that
// concerned something c holds (held: the run ends) or nothing (fenced, or
// every item refused), and past maxFencedRun in a row closes a
// volunteer's connection and keeps its address out for fencedPenalty (the
// error is the connection's end). Read loop only.
func (s *Server) fencedReport(c *conn, held bool) error {
	if held {
		c.fencedRun = 0
		return nil
	}
	if c.fencedRun++; c.fencedRun > maxFencedRun && !c.operator {
		s.gate.keepOut(c.addr, time.Now())
		return protocolError{fmt.Errorf("more than %d reports in a row for attempts this connection does not hold; "+
			"come back in %v", maxFencedRun, fencedPenalty)}
	}
	return nil
}

// notHeld is the error of an ack refusing a report for an attempt the
// connection does not hold.
func notHeld(attempt int64) string {
	return fmt.Sprintf("refused: this connection does not hold attempt %d", attempt)
}

// refuseAll refuses every item of f, a result, fail or checkpoint frame
// whose payload was skipped (readFrame: fenced).
func (s *Server) refuseAll(c *conn, f *protocol.Frame) error {
	var acks []protocol.Ack
	switch f.Type {
	case protocol.TypeCheckpoint:
		acks = append(acks, protocol.Ack{Attempt: f.Checkpoint.Attempt, Of: protocol.AckCheckpoint, Seq: f.Checkpoint.Seq,
			Error: notHeld(f.Checkpoint.Attempt)})
	case protocol.TypeResult:
		for _, r := range f.Results {
			acks = append(acks, protocol.Ack{Attempt: r.Attempt, Of: protocol.AckResult, Error: notHeld(r.Attempt)})
		}
	case protocol.TypeFail:
		for _, fl := range f.Fails {
			if !knownReason(fl.Reason) {
				return fmt.Errorf("unknown failure reason %q", fl.Reason)
			}
			acks = append(acks, protocol.Ack{Attempt: fl.Attempt, Of: protocol.AckFail, Error: notHeld(fl.Attempt)})
		}
	}
	s.metrics.completions.WithLabelValues("refused").Add(float64(len(acks)))
	c.enqueue(&protocol.Frame{Type: protocol.TypeAck, Acks: acks})
	return nil
}

func (s *Server) handleFrame(ctx context.Context, c *conn, f *protocol.Frame) error {
	switch f.Type {
	case protocol.TypeHeartbeat:
		hb := f.Heartbeat
		if hb.Device != nil {
			d := cleanDevice(*hb.Device)
			hb.Device = &d
		}
		if s.hub.heartbeat(c, time.Now(), hb, s.cfg.Heartbeat, s.cfg.IdleHeartbeat) {
			// Resumed: work for it now, and its record read again (it
			// was not while the worker was paused).
			s.wakeSlots()
			go s.refreshRecords(s.ctx, []string{c.id})
		}
		if hb.Device != nil {
			// Write the device state only when it changed: most heartbeats
			// repeat the last one.
			if dev, err := json.Marshal(hb.Device); err == nil && !bytes.Equal(dev, c.lastDevice) {
				c.lastDevice = dev
				go func(d protocol.Device) {
					if err := s.store.UpdateDevice(ctx, c.id, d); err != nil && ctx.Err() == nil {
						c.log.Warn("update device", "err", err)
					}
				}(*hb.Device)
			}
		}
		if hb.Queue != nil {
			if q := *hb.Queue; q < 0 || q > protocol.QueueLimit(c.threads) {
				return fmt.Errorf("queue must be 0 to %d for %d slots, got %d", protocol.QueueLimit(c.threads), c.threads, q)
			}
			if s.hub.setQueue(c, *hb.Queue) {
				s.wakeSlots()
			}
		}
		// Running and queued attempts, plus outcomes awaiting their ack
		// (the queue may have been larger when they were assigned).
		if most := c.threads + protocol.QueueLimit(c.threads); len(hb.Running) > 2*most+16 {
			return fmt.Errorf("heartbeat lists %d attempts for %d slots and a queue of at most %d", len(hb.Running), c.threads,
				most-c.threads)
		}
		var rs []renewal
		for _, p := range hb.Running {
			// Only attempts this connection holds, or whose outcome it
			// sent and is not committed yet, reach the database; the
			// others (an outcome on its way, or nonsense) are ignored.
			ok, reported := s.hub.renews(c, p.Attempt)
			if !ok {
				continue
			}
			// Slots and Reported bound the lease by the attempt's
			// deadline (store.Renew): a heartbeat's list goes to the
			// database whole, in one batch, for its ranking by id.
			rs = append(rs, renewal{c: c, r: store.Renewal{Attempt: p.Attempt, Worker: c.id, Progress: p.Fraction,
				Slots: c.threads, Reported: reported}})
		}
		if err := s.renewals.submitAll(ctx, rs); err != nil {
			return nil
		}
	case protocol.TypeCheckpoint:
		// Checkpoints are rare: saved in the read loop, one at a time per
		// worker, and only for attempts this connection holds.
		cp := f.Checkpoint
		ack := protocol.Ack{Attempt: cp.Attempt, Of: protocol.AckCheckpoint, Seq: cp.Seq}
		ok := false
		var err error
		m, held := s.hub.holds(c, cp.Attempt)
		if err := s.fencedReport(c, held); err != nil {
			return err
		}
		if held {
			start := time.Now()
			if cp.Blob != "" {
				ok, err = s.store.SaveCheckpointBlob(ctx, cp.Attempt, c.id, cp.Blob, s.cfg.Lease)
			} else {
				ok, err = s.store.SaveCheckpoint(ctx, cp.Attempt, c.id, cp.State.Data, s.cfg.Lease)
			}
			s.health.observe("save a checkpoint", err)
			if m != "" && ok && err == nil {
				s.rt.observeCheckpoint(m, time.Since(start))
			}
		}
		var refused *store.RefusedError
		switch {
		case !held:
			ack.Error = notHeld(cp.Attempt)
		case errors.As(err, &refused):
			ack.Error = refused.Error() // over the task's limits: for good
		case err != nil:
			ack.Error, ack.Retry = "checkpoint not saved: server error", true
			c.log.Log(ctx, s.health.level(err), "save checkpoint", "attempt", cp.Attempt, "err", err)
		case !ok:
			ack.Error = "attempt no longer holds its lease"
		default:
			ack.OK = true
			s.metrics.checkpoints.Inc()
		}
		c.enqueue(&protocol.Frame{Type: protocol.TypeAck, Acks: []protocol.Ack{ack}})
	case protocol.TypeResult:
		comps := make([]store.Completion, len(f.Results))
		for i, r := range f.Results {
			comp := store.Completion{Attempt: r.Attempt, Worker: c.id, OK: true, Log: r.Log.Data,
				Duration: time.Duration(r.DurationMS) * time.Millisecond}
			for _, o := range r.Outputs {
				comp.Outputs = append(comp.Outputs, store.Output{Name: o.Name, Data: o.Data})
			}
			for _, u := range r.Uploaded {
				comp.Outputs = append(comp.Outputs, store.Output{Name: u.Name, Blob: u.Blob})
			}
			comps[i] = comp
		}
		return s.finish(ctx, c, comps, protocol.AckResult)
	case protocol.TypeFail:
		comps := make([]store.Completion, len(f.Fails))
		for i, fl := range f.Fails {
			if !knownReason(fl.Reason) {
				return fmt.Errorf("unknown failure reason %q", fl.Reason)
			}
			comps[i] = store.Completion{Attempt: fl.Attempt, Worker: c.id, Log: fl.Log.Data,
				Reason: fl.Reason, Message: truncate(fl.Message, 2000), End: failEnding(fl.Reason)}
		}
		return s.finish(ctx, c, comps, protocol.AckFail)
	default:
		return fmt.Errorf("a worker may not send %q frames", f.Type)
	}
	return nil
}

// holdIfHandingBack counts the attempts of comps that c hands back
// (hub.handedBack), before their slots are freed: past its budget, its
// worker gets no new work for a while.
func (s *Server) holdIfHandingBack(c *conn, comps []store.Completion) {
	var back []int64
	for _, comp := range comps {
		if comp.End == store.EndHandedBack {
			back = append(back, comp.Attempt)
		}
	}
	d := s.hub.handedBack(c, back, time.Now())
	if d == 0 {
		return
	}
	s.metrics.handBackHolds.Inc()
	c.log.Warn("worker hands back attempts faster than its budget: no new work for a while", "for", d,
		"budget", fmt.Sprintf("%d, then one every %v", handBackBurst, handBackEvery))
}

// finish frees the attempts' slots and queues their completions, those of
// one frame together in one batch; the acks go out once it is committed.
// An outcome for an attempt the connection does not hold (the rule above
// mayReport) is refused at once, in memory: it never reaches the batcher
// or the database.
func (s *Server) finish(ctx context.Context, c *conn, comps []store.Completion, of string) error {
	items := make([]completion, 0, len(comps))
	var refused []protocol.Ack
	freed := false
	s.holdIfHandingBack(c, comps)
	for _, comp := range comps {
		ok, fr, wf := s.hub.takeOutcome(c, comp.Attempt, c.hold)
		if !ok {
			refused = append(refused, protocol.Ack{Attempt: comp.Attempt, Of: of, Error: notHeld(comp.Attempt)})
			continue
		}
		freed = freed || fr
		items = append(items, completion{c: c, comp: comp, of: of, workflow: wf})
	}
	if len(refused) > 0 {
		s.metrics.completions.WithLabelValues("refused").Add(float64(len(refused)))
		c.enqueue(&protocol.Frame{Type: protocol.TypeAck, Acks: refused})
	}
	if err := s.fencedReport(c, len(items) > 0); err != nil {
		return err
	}
	if freed {
		s.wakeSlots()
	}
	if err := s.completions.submitAll(ctx, items); err != nil {
		for _, it := range items {
			s.hub.settleOutcome(c, it.comp.Attempt, false)
		}
		return err
	}
	return nil
}
