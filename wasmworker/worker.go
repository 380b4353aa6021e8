package wasmworker

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/version"
)

// Config configures a Worker.
type Config struct {
	// Servers are the base URLs (http://host:port) of server replicas; the
	// worker uses one at a time, the first at start, and moves to another
	// picked at random when it cannot connect or its connection breaks, so
	// that the workers of a replica that dies spread over the others.
	Servers []string
	// Slots is the number of attempts run at once (default 1).
	Slots int
	// Queue is the number of attempts accepted ahead of time, waiting for
	// a free slot (default 0).
	Queue int
	// MaxQueue, when above Queue, lets the queue adapt to the attempts:
	// starting at Queue, the worker asks (in heartbeats) for as many as
	// keep its slots busy for about queueAhead, between one per slot and
	// MaxQueue, and for no more than queueBytes of payload waiting. Short,
	// small attempts then travel in larger batches per dispatch round and
	// per result frame; long ones do not wait at this worker while others
	// idle. At most protocol.QueueLimit(Slots).
	MaxQueue int
	// RunnerQueues says that the Runner queues attempts itself and runs at
	// most Slots at once: the worker hands it every attempt as soon as it
	// is assigned, rather than once a slot is free. (The browser's runner
	// does, so that a task Web Worker that finishes starts its next attempt
	// without waiting for Go.)
	RunnerQueues bool
	// Kind is protocol.KindHeadless or protocol.KindBrowser.
	Kind   string
	Runner Runner
	// Device reports the device state for hello and heartbeats; nil reports
	// nothing known.
	Device func() protocol.Device
	// ID and Token are an identity the server gave this worker before
	// (Identity), to connect as the same worker again: its record and
	// reputation carry over. The server gives a new identity when it does
	// not recognise them. Empty: a new worker.
	ID, Token string
	// Volunteer is the browser volunteer's id, if any.
	Volunteer string
	// Key is an operator key (`cyclepool serve` makes one): the worker is
	// one of the operator's own machines, whose failures are verdicts
	// rather than evidence, and which no task avoids (docs/PROTOCOL.md).
	// Headless workers only: a browser cannot send it.
	Key    string
	Logger *slog.Logger
	// Gather is how long an outcome may wait for others, to travel in one
	// frame with them, while other attempts run or wait (default 0: an
	// outcome goes at once, with those that finished while the previous
	// frame was being sent). Outcomes stop waiting as soon as the worker
	// has nothing else to do, or a frame's worth of them waits. A worker
	// without a queue (Queue 0) never gathers: the slot an outcome freed
	// would idle until the server hears of it.
	Gather time.Duration
}

// Worker connects to a server and runs the attempts it is given.
type Worker struct {
	cfg  Config
	log  *slog.Logger
	dial func(ctx context.Context, url, key string) (conn, error) // dial, unless a test wraps it

	mu        sync.Mutex
	id, token string
	out       chan outMsg // frames for the current connection; nil when disconnected
	// direct writes a frame on the current connection from the sending
	// goroutine when that connection is a bufferingConn (out then has no
	// reader); nil otherwise.
	direct    func(deadline time.Time, m outMsg) bool
	sessDone  chan struct{} // closed when the current connection ends
	running   map[int64]*attempt
	pending   map[int64]*protocol.Frame // outcomes not yet acknowledged
	retries   map[int64]int             // times the server asked for a pending outcome again (ack.Retry)
	cancelled map[int64]struct{}        // the pending outcomes of attempts the server cancelled
	outbox    []*protocol.Frame         // outcomes not yet sent on the current connection
	outboxNew chan struct{}             // an outcome was put in outbox
	modules   map[string][]byte
	connected chan struct{} // closed while connected
	stats     Stats
	slots     *slotQueue    // the slots, given in the order of assignment
	hbNow     chan struct{} // asks for a heartbeat before the next tick
	queue     int           // the queue asked for (Config.Queue until it adapts)
	recent    recentRuns    // of the attempts that ended, for the queue
	announced time.Time     // when a change of queue last asked for a heartbeat
	// announceLater is set while a timer will ask for a heartbeat that
	// carries a change of queue held back by the once-a-second limit.
	announceLater bool
	lastEnd       time.Time // when an attempt last ended (adaptQueue)
	attempts      *goPool   // the goroutines that run attempts
	handBack      string    // why the worker hands its attempts back (HandBack); "" until it does
	// maxFrame bounds a frame the worker sends: the server's
	// welcome.max_frame_bytes, protocol.DefaultMaxFrameBytes until then.
	maxFrame int
	// uploadKey is the capability for uploading outputs (the welcome's
	// upload_key), the same on every replica; "" until welcomed.
	uploadKey string
	// welcomed says this process was welcomed under w.id: a hello then
	// lists every attempt the identity was assigned and still holds
	// (hello.running_complete), which one resuming an identity kept from
	// an earlier run (Config.ID) cannot.
	welcomed bool
}

// Stats counts what a worker did since it started.
type Stats struct {
	// Done and Failed count the attempts that ended on their own, with a
	// result or a failure; Cancelled those the server stopped (their
	// workflow or task was cancelled, or they lost their lease). Refused
	// counts the reports the server refused other than those of cancelled
	// attempts, whose refusal is expected.
	Done, Failed, Cancelled, Refused int
	Pending                          int // outcomes sent but not yet acknowledged
	Connected                        bool
	Server                           string
}

type outMsg struct {
	data   []byte
	binary bool
}

type attempt struct {
	assign  *protocol.Assign
	cancel  context.CancelFunc
	started time.Time // when the Runner started it (Host.Started); zero before (w.mu)
	// cancelled is set when the server cancels the attempt (w.mu): its
	// report is then expected to be refused.
	cancelled bool
	progress  float64
	seq       int
	ckptAcks  map[int]chan protocol.Ack // made at the first checkpoint
	// host and job are the attempt's Host and Job, held here rather than
	// allocated apart.
	host host
	job  Job
}

// New returns a worker; Run starts it.
func New(cfg Config) *Worker {
	if cfg.Slots < 1 {
		cfg.Slots = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Device == nil {
		cfg.Device = func() protocol.Device { return protocol.Device{} }
	}
	if cfg.Queue < 0 {
		cfg.Queue = 0
	}
	cfg.MaxQueue = min(cfg.MaxQueue, protocol.QueueLimit(cfg.Slots))
	return &Worker{cfg: cfg, log: cfg.Logger, id: cfg.ID, token: cfg.Token, running: map[int64]*attempt{}, pending: map[int64]*protocol.Frame{},
		cancelled: map[int64]struct{}{}, retries: map[int64]int{},
		modules: map[string][]byte{}, connected: make(chan struct{}), slots: newSlotQueue(cfg.Slots), hbNow: make(chan struct{}, 1),
		outboxNew: make(chan struct{}, 1), queue: cfg.Queue, attempts: newGoPool(cfg.Slots + max(cfg.Queue, cfg.MaxQueue)),
		maxFrame: protocol.DefaultMaxFrameBytes, dial: dial}
}

// Stats returns a snapshot of the worker's counters.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.stats
	st.Pending = len(w.pending)
	return st
}

// HandBack stops every attempt the worker holds, running or queued, and
// those assigned to it from now on, and reports each as a failure with
// reason worker: the server queues its task again at once (from its latest
// checkpoint) without using up an attempt, instead of when its lease lapses,
// as a lost attempt that counts. An attempt that ends on its own meanwhile
// reports how it ended. HandBack waits up to wait for the server to
// acknowledge the reports (through a reconnection, should Run make one);
// Run goes on until its context ends. For a worker that stops on purpose,
// whose queue may hold hundreds of attempts.
func (w *Worker) HandBack(why string, wait time.Duration) {
	deadline := time.Now().Add(wait)
	w.mu.Lock()
	w.handBack = why
	w.mu.Unlock()
	// First a heartbeat that says the worker takes no more work (the
	// server assigns nothing to a paused worker), sent before the outcomes
	// that free its slots; heartbeats from now on say so too.
	dev := w.device()
	w.sendBy(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Device: &dev}}, deadline)
	w.mu.Lock()
	for _, a := range w.running {
		a.cancel()
	}
	w.mu.Unlock()
	// Done once nothing is left to report or acknowledge for a little
	// while (an assignment may still be on its way from a round that
	// began before the server heard of the pause). While disconnected,
	// Run may reconnect and send the reports again: wait for that too.
	var quiet time.Time
	for now := time.Now(); now.Before(deadline); now = time.Now() {
		w.mu.Lock()
		done := len(w.running) == 0 && len(w.pending) == 0
		w.mu.Unlock()
		switch {
		case !done:
			quiet = time.Time{}
		case quiet.IsZero():
			quiet = now
		case now.Sub(quiet) >= handBackQuiet:
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// handBackQuiet is how long HandBack waits, once it has nothing left to
// report, for assignments still on their way.
const handBackQuiet = 100 * time.Millisecond

// device is the device state the worker reports: Config.Device's, paused
// once the worker hands its attempts back.
func (w *Worker) device() protocol.Device {
	d := w.cfg.Device()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pausedIfHandingBack(d)
}

// pausedIfHandingBack marks d paused once the worker hands its attempts
// back (w.mu held).
func (w *Worker) pausedIfHandingBack(d protocol.Device) protocol.Device {
	if w.handBack != "" {
		d.Paused, d.PausedBecause = true, w.handBack
	}
	return d
}

// Identity returns the worker's id and reconnect token, as the server last
// gave them (empty before the first connection), for Config.ID and
// Config.Token of a later run.
func (w *Worker) Identity() (id, token string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.id, w.token
}

// DeviceChanged sends a heartbeat with the device state now rather than at
// the next tick, so that a pause (say, the charger unplugged) reaches the
// server before it assigns more work.
func (w *Worker) DeviceChanged() {
	select {
	case w.hbNow <- struct{}{}:
	default:
	}
}

// Run connects, reconnecting after failures with a growing pause and moving
// through the configured servers, until ctx is done. Attempts keep running
// while disconnected; their results are delivered after reconnecting.
func (w *Worker) Run(ctx context.Context) error {
	if len(w.cfg.Servers) == 0 {
		return errors.New("worker: no server URL")
	}
	backoff := 100 * time.Millisecond
	n := len(w.cfg.Servers)
	for i := 0; ctx.Err() == nil; {
		server := w.cfg.Servers[i]
		start := time.Now()
		err := w.session(ctx, server)
		if ctx.Err() != nil {
			break
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		// A random pause in the second half of the backoff: the workers of
		// a replica that died come back spread out, not all at once.
		pause := backoff/2 + rand.N(backoff/2+1)
		w.log.Warn("disconnected from server", "server", server, "err", err, "retry_in", pause)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		backoff = min(backoff*2, 5*time.Second)
		if n > 1 {
			i = (i + 1 + rand.IntN(n-1)) % n
		}
	}
	w.mu.Lock()
	for _, a := range w.running {
		a.cancel()
	}
	w.mu.Unlock()
	return nil
}

func wsURL(server string) string {
	u := strings.TrimSuffix(server, "/")
	switch {
	case strings.HasPrefix(u, "https://"):
		u = "wss://" + strings.TrimPrefix(u, "https://")
	case strings.HasPrefix(u, "http://"):
		u = "ws://" + strings.TrimPrefix(u, "http://")
	}
	return u + "/ws/worker"
}

// session runs one connection to server until it breaks.
func (w *Worker) session(ctx context.Context, server string) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ws, err := w.dial(dctx, wsURL(server), w.cfg.Key)
	cancel()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(protocol.DefaultMaxFrameBytes)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()

	w.mu.Lock()
	hello := &protocol.Hello{Version: protocol.Version, Build: version.String(), Features: []string{protocol.FeatureSetup, protocol.FeatureUpload}, Kind: w.cfg.Kind, Slots: w.cfg.Slots, Queue: w.queue, WorkerID: w.id,
		ReconnectToken: w.token, Volunteer: w.cfg.Volunteer, Device: w.pausedIfHandingBack(w.cfg.Device())}
	if dh, ok := w.cfg.Runner.(DataHolder); ok {
		hello.Data = dh.Holding()
	}
	for id := range w.running {
		hello.Running = append(hello.Running, id)
	}
	held, welcomed := len(hello.Running), w.welcomed
	// Running attempts first: if the list must be cut, outcomes waiting for
	// their ack are sent again anyway and judged by the server on arrival.
	for id := range w.pending {
		if _, ok := w.running[id]; !ok {
			hello.Running = append(hello.Running, id)
		}
	}
	w.mu.Unlock()
	// A queue that shrank may still hold more attempts than it now allows:
	// ask for room for them, as far as the largest queue allows. Not for
	// the outcomes awaiting their ack: the server frees their room as they
	// arrive, and would fill it up to that larger queue.
	if more := held - w.cfg.Slots; more > hello.Queue {
		hello.Queue = min(more, max(w.cfg.Queue, w.cfg.MaxQueue))
	}
	hello.RunningComplete = welcomed && len(hello.Running) <= w.cfg.Slots+hello.Queue
	if len(hello.Running) > w.cfg.Slots+hello.Queue {
		hello.Running = hello.Running[:w.cfg.Slots+hello.Queue]
	}
	if err := writeFrame(sctx, ws, &protocol.Frame{Type: protocol.TypeHello, Hello: hello}); err != nil {
		return err
	}
	f, err := readFrame(sctx, ws, 10*time.Second)
	if err != nil {
		return fmt.Errorf("read welcome: %w", err)
	}
	if f.Type == protocol.TypeError {
		return fmt.Errorf("server refused: %s", f.Error.Message)
	}
	if f.Type != protocol.TypeWelcome {
		return fmt.Errorf("expected welcome, got %q", f.Type)
	}
	wel := f.Welcome
	if wel.MaxFrameBytes > 0 {
		ws.SetReadLimit(int64(wel.MaxFrameBytes))
	}
	out := make(chan outMsg, 256)
	errc := make(chan error, 4) // one per loop below, so that none blocks on it
	werr := make(chan error, 1) // the first of direct's errors; the rest are dropped
	var direct func(time.Time, outMsg) bool
	if _, ok := ws.(bufferingConn); ok {
		var wmu sync.Mutex // one writer at a time, in the order they came
		direct = func(deadline time.Time, m outMsg) bool {
			wmu.Lock()
			defer wmu.Unlock()
			wctx, cancel := context.WithTimeout(sctx, 30*time.Second)
			defer cancel()
			if !deadline.IsZero() {
				var cancelBy context.CancelFunc
				wctx, cancelBy = context.WithDeadline(wctx, deadline)
				defer cancelBy()
			}
			if err := ws.Write(wctx, m.binary, m.data); err != nil {
				select { // the session ends with the first error
				case werr <- fmt.Errorf("write: %w", err):
				default:
				}
				return false
			}
			return true
		}
	}
	w.mu.Lock()
	w.id, w.token, w.uploadKey, w.welcomed = wel.WorkerID, wel.ReconnectToken, wel.UploadKey, true
	w.maxFrame = protocol.DefaultMaxFrameBytes
	if wel.MaxFrameBytes > 0 {
		w.maxFrame = wel.MaxFrameBytes
	}
	for _, id := range wel.Lost {
		w.forgetLocked(id)
	}
	w.out, w.direct, w.sessDone = out, direct, make(chan struct{})
	w.stats.Connected, w.stats.Server = true, server
	close(w.connected)
	// Every outcome not yet acknowledged goes out again, those still in the
	// outbox included (in the same critical section, so none goes twice).
	var resend []*protocol.Frame
	for _, p := range w.pending {
		resend = append(resend, p)
	}
	w.outbox = nil
	w.mu.Unlock()
	w.log.Info("connected", "server", server, "worker", wel.WorkerID, "slots", w.cfg.Slots)
	defer func() {
		w.mu.Lock()
		w.out, w.direct = nil, nil
		close(w.sessDone)
		w.stats.Connected = false
		w.connected = make(chan struct{})
		w.mu.Unlock()
	}()
	if direct == nil {
		go func() { errc <- w.writeLoop(sctx, ws, out) }()
	}
	go func() {
		errc <- w.heartbeatLoop(sctx, time.Duration(wel.HeartbeatMS)*time.Millisecond, time.Duration(wel.IdleHeartbeatMS)*time.Millisecond)
	}()
	go func() { errc <- w.readLoop(sctx, ws, server) }()
	go func() { errc <- w.outcomeLoop(sctx) }()
	// Outcomes not yet acknowledged go out again, once the writer runs
	// (there may be more of them than the send queue holds).
	go func() {
		for _, p := range resend {
			if !w.send(p) {
				return
			}
		}
	}()
	select {
	case err = <-errc:
	case err = <-werr:
	}
	scancel()
	return err
}

func writeFrame(ctx context.Context, ws conn, f *protocol.Frame) error {
	data, bin, err := protocol.Encode(f)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return ws.Write(wctx, bin, data)
}

func readFrame(ctx context.Context, ws conn, timeout time.Duration) (*protocol.Frame, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bin, data, err := ws.Read(rctx)
	if err != nil {
		return nil, err
	}
	return protocol.Decode(data, bin)
}

func (w *Worker) writeLoop(ctx context.Context, ws conn, out chan outMsg) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-out:
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := ws.Write(wctx, m.binary, m.data)
			cancel()
			if err != nil {
				return fmt.Errorf("write: %w", err)
			}
		}
	}
}

// send queues a frame on the current connection; it reports false when
// disconnected (outcomes stay pending and are sent after reconnecting).
func (w *Worker) send(f *protocol.Frame) bool { return w.sendBy(f, time.Time{}) }

// sendBy is send, giving up at deadline (unless zero) when the
// connection's queue stays full.
func (w *Worker) sendBy(f *protocol.Frame, deadline time.Time) bool {
	w.mu.Lock()
	s := w.senderLocked()
	w.mu.Unlock()
	return w.sendOn(s, f, deadline)
}

// sender is the sending side of one connection (out nil: disconnected).
type sender struct {
	out    chan outMsg
	direct func(time.Time, outMsg) bool
	done   chan struct{}
}

// senderLocked returns the current connection's sender. w.mu is held.
func (w *Worker) senderLocked() sender { return sender{w.out, w.direct, w.sessDone} }

// sendOn sends a frame on the connection s, and reports false when that
// connection has ended (or ends first), or deadline (unless zero) passed
// while its queue stayed full.
func (w *Worker) sendOn(s sender, f *protocol.Frame, deadline time.Time) bool {
	if s.out == nil {
		return false
	}
	data, bin, err := protocol.Encode(f)
	if err != nil {
		w.log.Error("encode frame", "type", f.Type, "err", err)
		return false
	}
	select {
	case <-s.done:
		return false
	default:
	}
	if s.direct != nil {
		return s.direct(deadline, outMsg{data, bin})
	}
	var expired <-chan time.Time // nil: never
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case s.out <- outMsg{data, bin}:
		return true
	case <-s.done:
	case <-expired:
	}
	return false
}

// Bounds of one frame of outcomes: a bigger outcome travels alone. The
// header bound keeps a merged frame's JSON header (output names, failure
// messages) well under protocol.MaxHeaderBytes.
const (
	maxOutcomesPerFrame   = 64
	maxOutcomeFrameData   = 1 << 20
	maxOutcomeFrameHeader = protocol.MaxHeaderBytes / 4
)

// outcomeSizes estimates what one outcome adds to a frame: its data bytes
// and, at worst (every character escaped as \u00XX), its header bytes.
func outcomeSizes(f *protocol.Frame) (data, header int) {
	const perItem, perBlob = 160, 96
	header = perItem
	if f.Type == protocol.TypeResult {
		r := f.Results[0]
		data = len(r.Log.Data)
		for _, o := range r.Outputs {
			data += len(o.Data)
			header += perBlob + 6*len(o.Name)
		}
		for _, u := range r.Uploaded {
			header += 2*perBlob + 6*len(u.Name)
		}
		return data, header
	}
	fl := f.Fails[0]
	return len(fl.Log.Data), header + 6*(len(fl.Reason)+len(fl.Message))
}

// outcomeLoop sends the outcomes put in the outbox, as few frames as the
// bounds allow: one result frame and one fail frame for all the outcomes
// that came meanwhile (the server handles a frame's items one by one and
// acknowledges them together). An outcome waits up to cfg.Gather for others
// while more attempts run or wait (gathering).
func (w *Worker) outcomeLoop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.outboxNew:
		}
		if w.cfg.Gather > 0 && w.gathering() {
			t := time.NewTimer(w.cfg.Gather)
		wait:
			for {
				select {
				case <-ctx.Done():
					t.Stop()
					// The outbox goes with the next session, which may
					// already run: wake its loop, whose signal this
					// one may have taken.
					w.wakeOutcomes()
					return ctx.Err()
				case <-t.C:
					break wait
				case <-w.outboxNew:
					if !w.gathering() {
						t.Stop()
						break wait
					}
				}
			}
		}
		w.mu.Lock()
		batch := w.outbox
		w.outbox = nil
		s := w.senderLocked()
		w.mu.Unlock()
		w.sendOutcomes(s, batch)
	}
}

// sendOutcomes sends outcomes taken from the outbox on the connection
// that was current when they were taken. When it has ended they are not
// sent: they are pending, and the next connection sends them again.
func (w *Worker) sendOutcomes(s sender, batch []*protocol.Frame) {
	for _, f := range mergeOutcomes(batch) {
		if !w.sendOn(s, f, time.Time{}) {
			return
		}
	}
}

// gathering reports whether outcomes in the outbox should wait for more
// (Config.Gather): while other attempts run or wait, until a frame's worth
// is there, and only at a worker with a queue. A worker without one would
// leave the slot an outcome freed idle until the server hears of it; with
// one, the slot takes the next queued attempt at once. (Gathering only
// while attempts wait in the queue cost 3-5% of the dispatch benchmark's
// throughput: the queue runs empty between the server's rounds.)
func (w *Worker) gathering() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gatheringLocked()
}

// gatheringLocked is gathering with w.mu held.
func (w *Worker) gatheringLocked() bool {
	return len(w.running) > 0 && w.queue > 0 && len(w.outbox) < maxOutcomesPerFrame
}

// wakeOutcomes tells outcomeLoop that the outbox may hold outcomes.
func (w *Worker) wakeOutcomes() {
	select {
	case w.outboxNew <- struct{}{}:
	default:
	}
}

// mergeOutcomes packs outcome frames (one result or fail each) into as few
// frames as the bounds allow.
func mergeOutcomes(fs []*protocol.Frame) []*protocol.Frame {
	if len(fs) < 2 {
		return fs
	}
	var out []*protocol.Frame
	var res, fail *protocol.Frame
	var resData, resHdr, failData, failHdr int
	for _, f := range fs {
		switch {
		case f.Type == protocol.TypeResult && len(f.Results) == 1:
			n, h := outcomeSizes(f)
			if res == nil || len(res.Results) >= maxOutcomesPerFrame || resData+n > maxOutcomeFrameData || resHdr+h > maxOutcomeFrameHeader {
				res, resData, resHdr = &protocol.Frame{Type: protocol.TypeResult}, 0, 0
				out = append(out, res)
			}
			res.Results = append(res.Results, f.Results[0])
			resData += n
			resHdr += h
		case f.Type == protocol.TypeFail && len(f.Fails) == 1:
			n, h := outcomeSizes(f)
			if fail == nil || len(fail.Fails) >= maxOutcomesPerFrame || failData+n > maxOutcomeFrameData || failHdr+h > maxOutcomeFrameHeader {
				fail, failData, failHdr = &protocol.Frame{Type: protocol.TypeFail}, 0, 0
				out = append(out, fail)
			}
			fail.Fails = append(fail.Fails, f.Fails[0])
			failData += n
			failHdr += h
		default:
			out = append(out, f)
		}
	}
	return out
}

// heartbeatLoop sends a heartbeat every interval (the welcome's
// heartbeat_ms), and at once when asked (hbNow: the device changed). While
// the worker is paused and holds no attempt, it renews nothing: it then
// heartbeats every idle interval instead (idle_heartbeat_ms, none from an
// older server), skipping ticks, as long as that lasts. The ticks still
// look, so that an attempt or an end of the pause is heard within one
// interval even without hbNow.
func (w *Worker) heartbeatLoop(ctx context.Context, every, idleEvery time.Duration) error {
	if every <= 0 {
		every = 3 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var lastIdle bool
	var lastSent time.Time
	for {
		forced := false
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-w.hbNow:
			forced = true
		}
		dev := w.cfg.Device()
		hb := &protocol.Heartbeat{Device: &dev}
		w.mu.Lock()
		// Paused as late as possible: a heartbeat built before HandBack
		// must not follow its paused one and unpause the worker.
		dev = w.pausedIfHandingBack(dev)
		hb.Running = w.heartbeatRunning()
		idle := dev.Paused && len(hb.Running) == 0
		if !forced && idle && lastIdle && time.Since(lastSent) < idleEvery-every/2 {
			w.mu.Unlock()
			continue
		}
		lastIdle, lastSent = idle, time.Now()
		hb.Free = max(w.cfg.Slots-len(w.running), 0)
		w.shrinkQueueForRunning(time.Now())
		if w.cfg.MaxQueue > w.cfg.Queue {
			q := w.queue
			hb.Queue = &q
		}
		w.mu.Unlock()
		w.send(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: hb})
	}
}

// heartbeatRunning lists the attempts a heartbeat renews (w.mu held): the
// running and queued ones, then those whose outcome awaits its ack, the
// ones not yet sent first, up to heartbeatMost in all. The cut keeps the
// list within the server's bound (docs/PROTOCOL.md) when outcomes pile up
// behind slow commits: a busy worker with few slots once listed 1,920
// attempts and was disconnected, losing its attempts' leases. The server
// renews the lease of an outcome it has not committed (under way, or told
// to retry); one left off the list goes without renewal that time.
func (w *Worker) heartbeatRunning() []protocol.Progress {
	most := heartbeatMost(w.cfg.Slots)
	rs := make([]protocol.Progress, 0, min(len(w.running)+len(w.pending), most))
	for id, a := range w.running {
		rs = append(rs, protocol.Progress{Attempt: id, Fraction: a.progress})
	}
	listed := make(map[int64]bool, len(w.outbox))
	for _, f := range w.outbox {
		for _, id := range outcomeAttempts(f) {
			if len(rs) >= most {
				return rs
			}
			if _, ok := w.running[id]; !ok && !listed[id] && w.pending[id] != nil {
				listed[id] = true
				rs = append(rs, protocol.Progress{Attempt: id, Fraction: 1})
			}
		}
	}
	for id := range w.pending {
		if len(rs) >= most {
			return rs
		}
		if _, ok := w.running[id]; !ok && !listed[id] {
			rs = append(rs, protocol.Progress{Attempt: id, Fraction: 1})
		}
	}
	return rs
}

// heartbeatMost is the longest list of attempts a heartbeat of a worker
// with slots slots carries: its slots and the longest queue it may ask for.
// The server refuses heartbeats of more than twice that plus 16.
func heartbeatMost(slots int) int { return slots + protocol.QueueLimit(slots) }

// outcomeAttempts lists the attempts whose outcomes a result or fail frame
// carries.
func outcomeAttempts(f *protocol.Frame) []int64 {
	var ids []int64
	for _, r := range f.Results {
		ids = append(ids, r.Attempt)
	}
	for _, fl := range f.Fails {
		ids = append(ids, fl.Attempt)
	}
	return ids
}

func (w *Worker) readLoop(ctx context.Context, ws conn, server string) error {
	for {
		// Not ctx: the session closes ws when it ends, which ends the Read,
		// and a Read with a context that can end costs the native
		// connection an AfterFunc per frame.
		bin, data, err := ws.Read(context.Background())
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		f, err := protocol.Decode(data, bin)
		if err != nil {
			if w.oversizedAssign(ctx, data, bin, server) {
				continue
			}
			return fmt.Errorf("bad frame from server: %w", err)
		}
		switch f.Type {
		case protocol.TypeAssign:
			for i := range f.Assign {
				w.start(ctx, &f.Assign[i], server)
			}
		case protocol.TypeCancel:
			w.mu.Lock()
			for _, id := range f.Cancel.Attempts {
				w.cancelLocked(id)
			}
			w.mu.Unlock()
		case protocol.TypeAck:
			w.mu.Lock()
			for _, ack := range f.Acks {
				switch ack.Of {
				case protocol.AckCheckpoint:
					if a := w.running[ack.Attempt]; a != nil {
						if ch := a.ckptAcks[ack.Seq]; ch != nil {
							select { // never block while holding the lock
							case ch <- ack:
							default:
							}
						}
					}
				case protocol.AckResult, protocol.AckFail:
					if ack.Retry {
						// The server could not store it (its database is
						// down, read-only or full): send it again, less
						// often the longer that lasts.
						if f := w.pending[ack.Attempt]; f != nil {
							n := w.retries[ack.Attempt]
							w.retries[ack.Attempt] = n + 1
							time.AfterFunc(retryDelay(n), func() { w.send(f) })
						}
						continue
					}
					_, cancelled := w.cancelled[ack.Attempt]
					delete(w.cancelled, ack.Attempt)
					delete(w.pending, ack.Attempt)
					delete(w.retries, ack.Attempt)
					switch {
					case ack.OK:
					case cancelled:
						// The server stopped it: its report only freed its slot.
						w.log.Debug("report of a cancelled attempt refused", "attempt", ack.Attempt, "why", ack.Error)
					default:
						w.stats.Refused++
						w.log.Warn("result refused", "attempt", ack.Attempt, "why", ack.Error)
					}
				}
			}
			w.mu.Unlock()
		case protocol.TypeError:
			return fmt.Errorf("server error: %s", f.Error.Message)
		}
	}
}

// retryDelay is how long an outcome waits before it goes again after the
// server asked for it n+1 times (ack.Retry): 1 s, doubling up to 10 s.
// An outcome may be large (tens of MiB); sent every second through an
// outage of minutes it would cost the server that much every second.
func retryDelay(n int) time.Duration {
	return min(time.Second<<min(n, 4), 10*time.Second)
}

// cancelLocked stops an attempt the server cancelled. Its outcome, if it
// ended on its own meanwhile and the report is on its way, is still
// acknowledged (refused, the attempt being over): that refusal is
// expected. w.mu is held.
func (w *Worker) cancelLocked(id int64) {
	if a := w.running[id]; a != nil {
		a.cancelled = true
		a.cancel()
	}
	if _, ok := w.pending[id]; ok {
		w.cancelled[id] = struct{}{}
	}
}

// forgetLocked stops an attempt the server says was lost while the worker
// was away, and forgets its unacknowledged outcome: it is not sent again.
// w.mu is held.
func (w *Worker) forgetLocked(id int64) {
	if a := w.running[id]; a != nil {
		a.cancelled = true
		a.cancel()
	}
	delete(w.pending, id)
	delete(w.cancelled, id)
	delete(w.retries, id)
}

// start runs one assigned attempt in its own goroutine (one kept from an
// earlier attempt when there is one idle, see goPool). The attempt outlives
// the connection: it is bound to the worker's lifetime, not the socket's.
func (w *Worker) start(_ context.Context, as *protocol.Assign, server string) {
	actx, cancel := context.WithCancel(context.Background())
	a := &attempt{assign: as, cancel: cancel}
	w.mu.Lock()
	if _, dup := w.running[as.Attempt]; dup {
		w.mu.Unlock()
		cancel()
		return
	}
	w.running[as.Attempt] = a
	if w.handBack != "" {
		cancel() // assigned while handing back: goes back at once
	}
	w.mu.Unlock()
	// Its place in line for a slot is taken here, as it arrives, not by
	// its goroutine: attempts start in the order they were assigned
	// (slotQueue).
	var turn chan struct{}
	if !w.cfg.RunnerQueues {
		turn = w.slots.enter()
	}
	w.attempts.run(func() {
		defer cancel()
		start := time.Now()
		// Wait for a slot: queued attempts are accepted ahead of time.
		if turn != nil {
			defer w.slots.leave(turn)
			select {
			case <-turn:
			case <-actx.Done():
			}
		}
		var out *Outcome
		if actx.Err() == nil {
			a.host = host{w: w, a: a}
			a.job = Job{Assign: as, ModuleID: as.Module, Host: &a.host, Fetch: w.moduleFetcher(server, as.Module), Server: server,
				Upload: as.Limits.Uploads()}
			if as.RestoreFrom != nil {
				// A checkpoint uploaded over HTTP: downloaded, then
				// restored as any other. One that cannot be had is
				// done without: the task starts from the beginning,
				// which is always correct (handing it back could
				// bring it back here, again and again).
				if b, err := fetchCheckpoint(actx, server, as.RestoreFrom); err == nil {
					as.Restore = protocol.Blob{Data: b}
				} else if actx.Err() == nil {
					w.log.Warn("starting from the beginning: the checkpoint to restore could not be had", "attempt", as.Attempt, "err", err)
				}
			}
			if actx.Err() == nil {
				out = w.cfg.Runner.Run(actx, &a.job)
			}
			if out != nil && a.job.Upload {
				out = w.uploadOutputs(actx, server, as.Attempt, out)
			}
		}
		// Stopped (by HandBack, the server's cancel or a lost lease), not
		// ended on its own: its run time says nothing of the tasks.
		stopped := actx.Err() != nil
		if out != nil && out.Reason == "" {
			if msg := w.resultTooBig(as.Attempt, out); msg != "" {
				out = &Outcome{Reason: protocol.ReasonOutput, Message: msg, Log: out.Log, Duration: out.Duration}
			}
		}
		w.mu.Lock()
		switch {
		case w.handBack != "" && stopped && !a.cancelled && (out == nil || out.Reason == protocol.ReasonCancelled):
			// Stopped by HandBack (or never started): the task goes back.
			// An attempt that ended on its own (a result, or a failure of
			// its own, such as a trap) reports that instead.
			out = &Outcome{Reason: protocol.ReasonWorker, Message: w.handBack, Duration: time.Since(start)}
		case out == nil:
			// Stopped before it started, by a cancel from the server or
			// a lost lease: the server refuses or ignores the report.
			out = &Outcome{Reason: protocol.ReasonCancelled, Message: "stopped before it started"}
		}
		var f *protocol.Frame
		if out.Reason == "" {
			f = &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
				Attempt: as.Attempt, Outputs: out.Outputs, Log: protocol.Blob{Data: out.Log}, DurationMS: out.Duration.Milliseconds(),
				Uploaded: out.Uploaded}}}
		} else {
			f = &protocol.Frame{Type: protocol.TypeFail, Fails: []protocol.Fail{{
				Attempt: as.Attempt, Reason: out.Reason, Message: out.Message, Log: protocol.Blob{Data: out.Log}, DurationMS: out.Duration.Milliseconds()}}}
		}
		delete(w.running, as.Attempt)
		switch {
		case out.Reason == "":
			w.stats.Done++
		case a.cancelled && out.Reason == protocol.ReasonCancelled:
			w.stats.Cancelled++
			w.cancelled[as.Attempt] = struct{}{}
		default:
			w.stats.Failed++
		}
		announce := !stopped && w.adaptQueue(out.Duration, PayloadBytes(as))
		queue := w.queue
		// Even a cancelled attempt reports: the server frees its slot on the
		// report (and refuses it, the attempt being over already).
		w.pending[as.Attempt] = f
		w.outbox = append(w.outbox, f)
		// With nothing to gather for, the outbox goes from here: waking
		// outcomeLoop would cost a hand-off between goroutines (tens of
		// microseconds of a lone task's latency in Go's WebAssembly, a
		// thread's wake-up natively).
		var now []*protocol.Frame
		var s sender
		if w.out != nil && !(w.cfg.Gather > 0 && w.gatheringLocked()) {
			now, w.outbox, s = w.outbox, nil, w.senderLocked()
		}
		w.mu.Unlock()
		if now != nil {
			w.sendOutcomes(s, now)
		} else {
			w.wakeOutcomes()
		}
		if announce {
			w.log.Info("queue adapted to the tasks", "queue", queue, "slots", w.cfg.Slots)
			w.DeviceChanged() // a heartbeat now carries the new queue
		}
	})
}

// host is the Host of one attempt.
type host struct {
	w *Worker
	a *attempt
}

func (h *host) Started() {
	h.w.mu.Lock()
	h.a.started = time.Now()
	h.w.mu.Unlock()
}

func (h *host) Progress(f float64) {
	h.w.mu.Lock()
	h.a.progress = f
	h.w.mu.Unlock()
}

// Checkpoint sends the state and waits for the server's ack, across a
// reconnection if need be, for at most a minute.
func (h *host) Checkpoint(ctx context.Context, state []byte) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	w := h.w
	w.mu.Lock()
	h.a.seq++
	seq := h.a.seq
	ch := make(chan protocol.Ack, 1)
	if h.a.ckptAcks == nil {
		h.a.ckptAcks = map[int]chan protocol.Ack{}
	}
	h.a.ckptAcks[seq] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(h.a.ckptAcks, seq)
		w.mu.Unlock()
	}()
	f := &protocol.Frame{Type: protocol.TypeCheckpoint, Checkpoint: &protocol.Checkpoint{Attempt: h.a.assign.Attempt, Seq: seq, State: protocol.Blob{Data: state}}}
	if h.a.job.Upload && len(state) >= protocol.UploadMinBytes {
		// Large: uploaded over HTTP first; the frame names it.
		up, err := w.uploadCheckpoint(ctx, h.a.assign.Attempt, state)
		if err != nil {
			return fmt.Errorf("checkpoint not saved: uploading it: %w", err)
		}
		f.Checkpoint.State, f.Checkpoint.Blob, f.Checkpoint.Size = protocol.Blob{}, up.Blob, up.Size
		state = nil
	}
	for {
		// A checkpoint larger than a frame may carry is refused here, at
		// once: sent, it would make the server close the connection, and
		// the worker would send it again after every reconnection (a task
		// checkpointing 100 MiB made its worker reconnect 17 times in a
		// minute). Looked at before each sending: the bound is that of the
		// server connected to.
		w.mu.Lock()
		connected, sessDone, maxFrame := w.connected, w.sessDone, w.maxFrame
		w.mu.Unlock()
		if most := maxFrame - checkpointFrameOverhead; len(state) > most {
			return fmt.Errorf("checkpoint refused: its %d bytes are more than the %d bytes a frame may carry (the server's max_frame_bytes is %d)",
				len(state), max(most, 0), maxFrame)
		}
		select {
		case <-connected:
		case <-ctx.Done():
			return fmt.Errorf("checkpoint not delivered: %w", ctx.Err())
		}
		w.mu.Lock()
		sessDone = w.sessDone
		maxFrame = w.maxFrame
		w.mu.Unlock()
		if most := maxFrame - checkpointFrameOverhead; len(state) > most {
			continue // connected to a server with a smaller bound: refused above
		}
		if !w.send(f) {
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return fmt.Errorf("checkpoint not delivered: %w", ctx.Err())
			}
		}
		select {
		case ack := <-ch:
			switch {
			case ack.OK:
				return nil
			case ack.Retry:
				time.Sleep(time.Second)
				continue
			default:
				return fmt.Errorf("checkpoint refused: %s", ack.Error)
			}
		case <-sessDone:
			continue
		case <-ctx.Done():
			return fmt.Errorf("checkpoint not acknowledged: %w", ctx.Err())
		}
	}
}

// checkpointFrameOverhead is more than what a checkpoint frame holds besides
// the state: its length prefix and header.
const checkpointFrameOverhead = 1024

// resultTooBig says why the result out of attempt cannot travel in a frame
// ("" when it can): its header (the names of its outputs) is over
// protocol.MaxHeaderBytes, or the whole frame over the bound the server
// announced. Sent anyway, it would make the server close the connection,
// and the worker would send it again after every reconnection, renewing
// its lease each time: the task stayed running until cancelled. It fails
// instead, with limit_output. Outcomes well within both bounds (nearly
// all) are not encoded to find out.
func (w *Worker) resultTooBig(attempt int64, out *Outcome) string {
	w.mu.Lock()
	maxFrame := w.maxFrame
	w.mu.Unlock()
	f := &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
		Attempt: attempt, Outputs: out.Outputs, Log: protocol.Blob{Data: out.Log}, DurationMS: out.Duration.Milliseconds(),
		Uploaded: out.Uploaded}}}
	data, header := outcomeSizes(f)
	if header <= protocol.MaxHeaderBytes && 4+header+data <= maxFrame {
		return ""
	}
	enc, bin, err := protocol.Encode(f)
	if err != nil {
		return fmt.Sprintf("the result cannot be encoded: %v", err)
	}
	hdr := len(enc)
	if bin {
		hdr = int(binary.BigEndian.Uint32(enc))
	}
	switch {
	case hdr > protocol.MaxHeaderBytes:
		return fmt.Sprintf("output limit exceeded: the result's frame header takes %d bytes (the names of its %d outputs), more than the %d bytes a frame header may take",
			hdr, len(out.Outputs)+len(out.Uploaded), protocol.MaxHeaderBytes)
	case len(enc) > maxFrame:
		return fmt.Sprintf("output limit exceeded: the result takes %d bytes (outputs and log), more than the %d bytes a frame may carry (the server's max_frame_bytes)",
			len(enc), maxFrame)
	}
	return ""
}

// oversizedAssign handles an assign frame that protocol.Decode refused
// because its header is over protocol.MaxHeaderBytes (an assignment's
// arguments, say, add up to more), and reports whether it did. Its
// attempts that fit a header of their own run; those that do not fail at
// once with a message that says so. (Such a frame used to end the
// connection: the worker reconnected, the server assigned the task again,
// to this worker or another, until its attempts were lost.) Anything else
// wrong with the frame is not handled: the connection ends, as before.
func (w *Worker) oversizedAssign(ctx context.Context, data []byte, bin bool, server string) bool {
	hdr, payload := data, []byte(nil)
	if bin {
		if len(data) < 4 {
			return false
		}
		n := binary.BigEndian.Uint32(data)
		if int64(n) > int64(len(data)-4) {
			return false
		}
		hdr, payload = data[4:4+n], data[4+n:]
	}
	if len(hdr) <= protocol.MaxHeaderBytes {
		return false
	}
	var raw struct {
		Type   string            `json:"t"`
		Assign []json.RawMessage `json:"assign"`
	}
	var f protocol.Frame
	if json.Unmarshal(hdr, &raw) != nil || raw.Type != protocol.TypeAssign || len(raw.Assign) == 0 ||
		json.Unmarshal(hdr, &f) != nil || len(f.Assign) != len(raw.Assign) {
		return false
	}
	// The payload, as protocol.Decode lays it out.
	off := 0
	take := func(b *protocol.Blob) bool {
		if b.Size < 0 || b.Size > len(payload)-off {
			return false
		}
		b.Data = payload[off : off+b.Size : off+b.Size]
		off += b.Size
		return true
	}
	for i := range f.Assign {
		a := &f.Assign[i]
		if !take(&a.Stdin) {
			return false
		}
		for j := range a.Inputs {
			if !take(&a.Inputs[j]) {
				return false
			}
		}
		if !take(&a.Restore) {
			return false
		}
	}
	if off != len(payload) {
		return false
	}
	const frameHeader = 64 // {"t":"assign","assign":[...]} and the length prefix
	for i := range f.Assign {
		a := &f.Assign[i]
		if n := len(raw.Assign[i]) + frameHeader; n > protocol.MaxHeaderBytes {
			w.log.Warn("assignment over the header limit", "attempt", a.Attempt, "task", a.Task, "header_bytes", n)
			w.failAssign(a, protocol.ReasonModule, fmt.Sprintf(
				"the assignment cannot be delivered: its frame header takes %d bytes (its %d arguments and the names of its %d inputs), more than the %d bytes a frame header may take",
				n, len(a.Args), len(a.Inputs), protocol.MaxHeaderBytes))
			continue
		}
		w.start(ctx, a, server)
	}
	return true
}

// failAssign reports an assigned attempt failed without running it.
func (w *Worker) failAssign(as *protocol.Assign, reason, msg string) {
	f := &protocol.Frame{Type: protocol.TypeFail, Fails: []protocol.Fail{{Attempt: as.Attempt, Reason: reason, Message: msg}}}
	w.mu.Lock()
	if _, dup := w.running[as.Attempt]; dup {
		w.mu.Unlock()
		return
	}
	w.stats.Failed++
	w.pending[as.Attempt] = f
	w.outbox = append(w.outbox, f)
	w.mu.Unlock()
	w.wakeOutcomes()
}
