package server

import (
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

// conn is one connected worker.
type conn struct {
	id string
	// session is this connection's row in worker_sessions.
	session int64
	kind    string
	threads int // the worker's slots (hello.slots); slots adds its queue
	ws      *websocket.Conn
	wmu     sync.Mutex    // one writer at a time on ws (gorilla's rule)
	done    chan struct{} // closed when the connection ends
	// assignMu is held from recording attempts (hub.started) to queueing
	// their assign frames: the worker gets its attempts in id order.
	assignMu sync.Mutex

	// Frames wait in queue for a writer goroutine that exists only while
	// there is something to write: an idle worker costs no goroutine for
	// writing (it matters with thousands of idle volunteers).
	qmu     sync.Mutex
	queue   []outFrame
	writing bool
	log     *slog.Logger

	lastDevice []byte // JSON of the device state last written; read loop only
	// fencedRun counts the outcome and checkpoint frames in a row that
	// were refused unread (fenced; read loop only): past maxFencedRun the
	// connection is closed and its address kept out for fencedPenalty.
	fencedRun int
	// addr is the address the connection came from (remoteHost).
	addr string
	// setup: the worker lays out tasks' setups (protocol.FeatureSetup);
	// without it, it gets no task that has one.
	setup bool
	// upload: the worker uploads large outputs over HTTP
	// (protocol.FeatureUpload).
	upload bool
	// data has the blobs the worker keeps, as far as this replica knows
	// (its hello, and the tasks it was given): the plan prefers it for
	// tasks that read them. Guarded by hub.mu.
	data map[string]bool

	// heard is when the last frame arrived (Unix ns). A worker heartbeats
	// every heartbeat interval, so a connection silent for longer than the
	// hub's silent limit is gone as far as new work goes, even while its
	// socket is still open (a frozen tab, a phone that lost its network):
	// it is given nothing until it speaks again (see hub.reserve).
	heard atomic.Int64
	// idle: the worker's last heartbeat said it is paused and holds no
	// attempt, so it heartbeats at the longer idle interval
	// (Config.IdleHeartbeat) and its silence is measured against that.
	idle atomic.Bool
	// waiting is when the read loop began waiting for the worker's next
	// frame (Unix ns), 0 while it handles one; silenced says the replica
	// closed the socket, the worker having said nothing for the silence
	// limit since (Server.closeSilent).
	waiting  atomic.Int64
	silenced atomic.Bool

	// Guarded by hub.mu. slots is the worker's slots plus its queue (a
	// heartbeat may change the queue); free the part of it not taken.
	slots  int
	free   int
	paused bool
	// heldUntil: the worker handed back attempts faster than its budget
	// (hub.handedBack) and gets no new work before then (its identity's
	// handBack.until, copied here for reserve).
	heldUntil time.Time
	// running has each attempt the worker holds: its module, for the
	// checkpoints' cost, and its workflow.
	running map[int64]heldAttempt
	// outcomes has the attempts whose outcome (result or fail) arrived on
	// this connection and left running (their slots are free again) but
	// whose commit has not been settled: under way, or failed with an ack
	// that said retry (see fenceOutcome for the rule).
	outcomes map[int64]*outcome
	// samples is the device history from heartbeats, for the stability
	// class; record the worker's database record (reputation, attempts,
	// losses), refreshed now and then; tasksDone the results accepted
	// on this connection.
	samples   []sched.Sample
	record    store.WorkerRecord
	tasksDone int
	// failStreak counts the failures this connection reported in a row,
	// with no result between them: from failStreakFewer on, it gets one
	// attempt at a time (allowed), before its record says anything.
	failStreak int
	// operator: the worker presented an operator key (handleWorker).
	// Immutable.
	operator  bool
	device    protocol.Device
	connected time.Time

	// inflight bounds the payload bytes of this worker's frames that the
	// server holds (read, waiting for their commit); hold is the frame the
	// read loop is handling (read loop only).
	inflight byteBudget
	hold     *payloadHold
}

// heldAttempt is an attempt a connection holds (conn.running).
type heldAttempt struct {
	module   string
	workflow string // "" when not known (an attempt a hello listed)
	owner    int64  // the workflow's owner; 0 when not known
	// given: taken back from the worker's queue while it was silent
	// (dropQueued); it is held until the worker reports it cancelled.
	given bool
}

// workflowOf returns the workflow id of an assignment's task name
// (protocol.Assign.Task: "<workflow id>/<task name>").
func workflowOf(task string) string {
	wf, _, _ := strings.Cut(task, "/")
	return wf
}

type outFrame struct {
	data   []byte
	binary bool
}

// maxQueued bounds the frames waiting for one worker; a worker that cannot
// keep up with its frames is disconnected.
const maxQueued = 256

// enqueue queues a frame for the worker and starts a writer if none runs.
// It never blocks.
func (c *conn) enqueue(f *protocol.Frame) {
	data, bin, err := protocol.Encode(f)
	if err != nil {
		c.log.Error("encode frame", "type", f.Type, "err", err)
		return
	}
	c.qmu.Lock()
	defer c.qmu.Unlock()
	select {
	case <-c.done:
		return
	default:
	}
	if len(c.queue) >= maxQueued {
		c.log.Warn("worker send queue full; closing connection")
		go closeWith(c.ws, websocket.CloseTryAgainLater, "send queue full") // never block the caller
		return
	}
	c.queue = append(c.queue, outFrame{data, bin})
	if !c.writing {
		c.writing = true
		go c.writeQueued()
	}
}

// writeQueued writes queued frames until the queue is empty, then exits.
func (c *conn) writeQueued() {
	for {
		c.qmu.Lock()
		if len(c.queue) == 0 {
			c.writing = false
			c.queue = nil
			c.qmu.Unlock()
			return
		}
		f := c.queue[0]
		c.queue = c.queue[1:]
		c.qmu.Unlock()
		err := c.write(f.binary, f.data)
		if err != nil {
			c.ws.Close()
			c.qmu.Lock()
			c.writing = false
			c.queue = nil
			c.qmu.Unlock()
			return
		}
	}
}

// write sends one message to the worker, within frameWriteTimeout.
func (c *conn) write(binary bool, data []byte) error {
	return writeMessage(&c.wmu, c.ws, binary, data, frameWriteTimeout)
}

// frameWriteTimeout bounds the writing of one frame to a worker: a worker
// that reads nothing for that long is disconnected.
const frameWriteTimeout = 30 * time.Second

// writeMessage sends one message on ws, holding mu, within timeout.
func writeMessage(mu *sync.Mutex, ws *websocket.Conn, binary bool, data []byte, timeout time.Duration) error {
	typ := websocket.TextMessage
	if binary {
		typ = websocket.BinaryMessage
	}
	mu.Lock()
	defer mu.Unlock()
	if err := ws.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	return ws.WriteMessage(typ, data)
}

// closeWith sends a close message with code and reason (cut to what a
// close message holds), then closes ws. It may run beside a writer.
func closeWith(ws *websocket.Conn, code int, reason string) {
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, truncate(reason, 120)), time.Now().Add(time.Second))
	ws.Close()
}

// hub holds this replica's connected workers.
type hub struct {
	mu       sync.Mutex
	conns    map[string]*conn
	attempts map[int64]*conn
	// open holds the connections that may have a free slot: every one
	// with free > 0 that is not paused, and some that no longer have
	// one, which reserve drops as it meets them. reserve walks it instead
	// of every connection, so that volunteers who are paused or busy cost
	// a dispatch round nothing (docs/RATIONALE.md).
	open map[*conn]struct{}
	// silent is how long a worker may go without sending a frame before
	// it gets no more work: a little over two heartbeat intervals, well
	// within a lease.
	silent time.Duration
	// idleSilent is silent for the workers that heartbeat at the idle
	// interval (conn.idle).
	idleSilent time.Duration
	// payload bounds the payload bytes of all workers' frames held on
	// this replica (see payloadLimits).
	payload byteBudget
	// handBacks has the volunteer identities that handed back attempts:
	// their budgets and holds, kept across reconnections (at most
	// maxLimitedAddrs of them).
	handBacks map[string]*handBack
	// gates holds back what workers say of attempts sent before their
	// claim committed (dispatcher.submit).
	gates claimGates
	// owners counts the attempts in the connections' running by owner
	// (those whose owner is known): the dispatch queue's fair share
	// between owners (store.Candidates).
	owners map[int64]int
}

// handBack is a volunteer identity's record of attempts handed back
// (hub.handedBack).
type handBack struct {
	budget *rate.Limiter // handBackBurst, then one every handBackEvery
	until  time.Time     // no new work before then
	holds  int           // holds in a row, without an accepted result between them
}

func newHub(silent, idleSilent time.Duration) *hub {
	return &hub{conns: map[string]*conn{}, attempts: map[int64]*conn{}, open: map[*conn]struct{}{}, silent: silent,
		idleSilent: idleSilent, handBacks: map[string]*handBack{}, owners: map[int64]int{}}
}

// countLocked adds n attempts running for owner to h.owners; hub.mu held.
func (h *hub) countLocked(owner int64, n int) {
	if owner == 0 {
		return
	}
	if h.owners[owner] += n; h.owners[owner] <= 0 {
		delete(h.owners, owner)
	}
}

// runningByOwner returns how many attempts this replica's workers hold for
// each owner (a copy).
func (h *hub) runningByOwner() map[int64]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.owners)
}

// heardFrom records that a frame arrived from c now. It reports whether c
// had been silent (and so received no work) until then.
func (h *hub) heardFrom(c *conn) bool {
	now := time.Now().UnixNano()
	limit := h.silent
	if c.idle.Load() {
		limit = h.idleSilent
	}
	return now-c.heard.Swap(now) > int64(limit)
}

// reserve takes up to max free slots, spread round-robin over the workers,
// and returns the worker of each slot. The slots stay taken until assigned
// or given back with release.
//
// A worker that has been silent for longer than h.silent gets nothing. Its
// socket may stay open long after it stopped listening (a tab frozen in
// the back/forward cache, a phone that lost its network: the read loop
// notices only after two leases): without this, the free slots and queue
// room of such a worker would take every retry of a task whose lease lapsed
// there, each retry lapsing in turn and using up one of the task's attempts.
func (h *hub) reserve(max int) []*conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	var slots []*conn
	now := time.Now()
	quiet := now.UnixNano() - int64(h.silent)
	for more := true; more && len(slots) < max; {
		more = false
		for c := range h.open {
			if c.free <= 0 || c.paused {
				delete(h.open, c) // back with opened when it has room again
				continue
			}
			// A held worker stays open: the dispatcher's poll finds it
			// again once its hold ends.
			if len(slots) < max && c.heard.Load() >= quiet && c.slots-c.free < c.allowed() && !now.Before(c.heldUntil) {
				c.free--
				slots = append(slots, c)
				more = more || c.free > 0
			}
		}
	}
	return slots
}

// maxFencedRun and fencedPenalty: a connection whose reports are refused
// unread this many times in a row is closed, and its address may not
// connect again (but with an operator key) for this long. An honest worker
// sends a few such reports after its leases lapsed, not dozens.
const (
	maxFencedRun  = 16
	fencedPenalty = 10 * time.Second
)

// failStreakFewer is the failures in a row after which a connection gets
// one attempt at a time (conn.failStreak), unless its worker has at least
// failStreakRecord accepted results: an honest worker with a record that
// meets a workflow whose every task fails keeps its slots (its failures
// are then confirmed, not disproved, and earn no strikes).
const (
	failStreakFewer  = 4
	failStreakRecord = 20
)

// allowed is how many attempts c may hold at once (hub.mu held): all its
// slots, or fewer while its standing is poor (sched.Standing) or its
// latest reports were all failures. The operator's workers are not held
// back.
func (c *conn) allowed() int {
	if c.operator {
		return c.slots
	}
	n := c.record.Standing().Allowance(c.slots)
	results := max(c.record.Standing().Results, int64(c.tasksDone))
	if c.failStreak >= failStreakFewer && results < failStreakRecord {
		n = min(n, 1)
	}
	if results == 0 {
		// A new identity has earned nothing yet: one attempt until its
		// first result (a record is only worth something if a fresh one
		// gets little).
		n = min(n, 1)
	}
	return n
}

// setQueue changes c's queue to queue attempts ahead of time. Room taken
// beyond the new size is not taken back: free goes below 0 until enough
// of c's attempts end. It reports whether c has more free room than before.
func (h *hub) setQueue(c *conn, queue int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := c.threads + queue - c.slots
	c.slots += d
	c.free += d
	h.openedLocked(c)
	return d > 0 && c.free > 0
}

// openedLocked puts c in h.open if it has room for an attempt (h.mu
// held): called wherever c.free grows or c resumes.
func (h *hub) openedLocked(c *conn) {
	if c.free > 0 && !c.paused && h.conns[c.id] == c {
		h.open[c] = struct{}{}
	}
}

// release gives back reserved slots that received no task; slots of a
// connection that has been replaced meanwhile are simply dropped.
func (h *hub) release(slots []*conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range slots {
		if h.conns[c.id] == c {
			c.free++
			h.openedLocked(c)
		}
	}
}

// started records attempts now running on c, the connection whose slots
// were reserved for them, of owners (owners[i] owns as[i], in ascending
// attempt order). It reports false when c is no longer the worker's
// connection (it left or reconnected meanwhile). An attempt older than one
// c holds is not recorded, and its index is in stale: the caller must not
// send it. A worker's attempts are numbered in the order it gets them (the
// reaper and the bound on wall time rank them by id), and two claims for
// one worker may reach here in another order than their ids'. The caller
// holds c.assignMu until it has queued the frames of those recorded.
func (h *hub) started(c *conn, as []protocol.Assign, owners []int64) (stale []int, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns[c.id] != c {
		return nil, false
	}
	newest := c.newestLocked()
	for i := range as {
		if as[i].Attempt < newest {
			stale = append(stale, i)
			continue
		}
		newest = as[i].Attempt
		if old, ok := c.running[as[i].Attempt]; ok {
			h.countLocked(old.owner, -1)
		}
		c.running[as[i].Attempt] = heldAttempt{module: as[i].Module, workflow: workflowOf(as[i].Task), owner: owners[i]}
		h.countLocked(owners[i], 1)
		h.attempts[as[i].Attempt] = c
		if su := as[i].Setup; su != nil {
			for _, f := range su.Files {
				if f.Blob != "" {
					c.keep(f.Blob)
				}
			}
		}
	}
	return stale, true
}

// newestAttempt returns the newest (highest) attempt id that the
// workers of reserved slots hold on this replica, 0 if none: attempts
// sent to them next must have higher ids, so that each worker's attempts
// are in the order it got them (the reaper and the bound on wall time
// count on it).
func (h *hub) newestAttempt(reserved map[string][]*conn) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var newest int64
	for _, cs := range reserved {
		var last *conn // a worker's slots are one connection, repeated
		for _, c := range cs {
			if c != last {
				newest = max(newest, c.newestLocked())
				last = c
			}
		}
	}
	return newest
}

// newestLocked returns the highest attempt id c holds, 0 if none: those
// it runs, and those whose outcome arrived and is not committed yet (they
// still run as far as the database knows); hub.mu held.
func (c *conn) newestLocked() int64 {
	var newest int64
	for id := range c.running {
		newest = max(newest, id)
	}
	for id := range c.outcomes {
		newest = max(newest, id)
	}
	return newest
}

// keep records that the worker of c keeps blob id (it was given a task
// that reads it, or said so in its hello), up to maxHeld blobs; hub.mu
// held (or c not yet shared).
func (c *conn) keep(id string) {
	if c.data == nil {
		c.data = map[string]bool{}
	}
	if len(c.data) < maxHeld {
		c.data[id] = true
	}
}

// maxHeld bounds the blobs a connection is known to hold.
const maxHeld = protocol.MaxHelloData

// holds reports whether attempt runs (or waits) on c, as far as this
// replica knows, and its module ("" when unknown).
func (h *hub) holds(c *conn, attempt int64) (module string, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a, ok := c.running[attempt]
	return a.module, ok
}

// renews reports whether a heartbeat of c renews attempt's lease: c runs
// it, or its outcome arrived on c and is not committed yet (being
// committed, or waiting at the worker to be sent again after an ack that
// said retry: the attempt keeps its lease meanwhile, docs/PROTOCOL.md).
// reported says its outcome arrived (store.Renewal.Reported): being
// committed, or waiting at the worker after an ack that said retry. The
// attempt's deadline bounds neither: the commit is the server's part, and
// a retry comes of a commit that failed, which no worker can make happen
// (a database outage, but also locks or flushes that time out while the
// lease reaper goes on, which no gap covers).
func (h *hub) renews(c *conn, attempt int64) (ok, reported bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ha, running := c.running[attempt]; running {
		// One taken back (dropQueued) has ended: a renewal would find it
		// lost and drop it from c.running, and the worker's report of
		// it cancelled, which follows, would be fenced.
		return !ha.given, false
	}
	_, ok = c.outcomes[attempt]
	return ok, ok
}

// finished records that an attempt stopped on c and frees its slot. It
// reports whether c was running it.
func (h *hub) finished(c *conn, attempt int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.finishedLocked(c, attempt)
}

// finishedLocked is finished with h.mu held.
func (h *hub) finishedLocked(c *conn, attempt int64) bool {
	a, ok := c.running[attempt]
	if !ok {
		return false
	}
	delete(c.running, attempt)
	h.countLocked(a.owner, -1)
	delete(h.attempts, attempt)
	c.free++
	h.openedLocked(c)
	return true
}

// outcome is an attempt whose outcome arrived on its connection and awaits
// its commit's verdict.
type outcome struct {
	retry bool         // its commit failed: the worker was told to send it again
	hold  *payloadHold // the payload bytes of the frame that carried it
}

// The fencing rule for outcomes (result, fail). A connection's word counts
// only for the attempts it holds: an outcome for any other attempt is
// refused in memory, before its payload is read, buffered or sent to the
// database ("refused: this connection does not hold attempt N", no retry).
// A connection holds
//   - the attempts in c.running: assigned to it (hub.started), or listed in
//     its hello's running and kept by the server (greet, reg.Kept);
//   - the attempts in c.outcomes marked retry: their outcome arrived (which
//     freed their slots and took them out of c.running) but its commit
//     failed and the ack asked the worker to send it again.
// An outcome being committed is not held: a second one for it is refused
// (an honest worker sends an outcome again only once told to retry). A
// reconnected worker re-sends its unacknowledged outcomes on its new
// connection, whose c.running has every attempt the server kept for it.

// mayReport reports whether c may report the outcome of attempt (the rule
// above), without changing anything.
func (h *hub) mayReport(c *conn, attempt int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := c.running[attempt]; ok {
		return true
	}
	o := c.outcomes[attempt]
	return o != nil && o.retry
}

// takeOutcome applies the rule above to an outcome of attempt that arrived
// on c: when c holds the attempt, the outcome is accepted (its commit under
// way, holding hold until settled) and the attempt's slot, if it still had
// one, freed. It reports whether the outcome is accepted, whether a slot
// was freed, and the attempt's workflow when c knew it.
func (h *hub) takeOutcome(c *conn, attempt int64, hold *payloadHold) (ok, freed bool, workflow string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if a, running := c.running[attempt]; running {
		workflow = a.workflow
		delete(c.running, attempt)
		h.countLocked(a.owner, -1)
		delete(h.attempts, attempt)
		c.free++
		h.openedLocked(c)
		freed = true
	} else if o := c.outcomes[attempt]; o == nil || !o.retry {
		return false, false, ""
	}
	if c.outcomes == nil {
		c.outcomes = map[int64]*outcome{}
	}
	hold.ref()
	c.outcomes[attempt] = &outcome{hold: hold}
	return true, freed, workflow
}

// settleOutcome records the verdict on the commit of an outcome of attempt
// from c: retry keeps the attempt for the worker to send it again; otherwise
// (committed or refused) c is done with it. Either way the outcome's payload
// bytes are no longer held.
func (h *hub) settleOutcome(c *conn, attempt int64, retry bool) {
	h.mu.Lock()
	o := c.outcomes[attempt]
	if o != nil {
		if retry {
			c.outcomes[attempt] = &outcome{retry: true}
		} else {
			delete(c.outcomes, attempt)
		}
	}
	h.mu.Unlock()
	if o != nil {
		o.hold.done()
	}
}

// cancel sends cancel frames for those attempts that run on this replica.
// With free, it also frees their slots at once, as for attempts sent
// before a commit that did not happen (dispatcher.submit); otherwise they
// are freed when the worker reports them cancelled.
func (h *hub) cancel(attempts []int64, reason string, free bool) {
	by := map[*conn][]int64{}
	h.mu.Lock()
	for _, a := range attempts {
		if c := h.attempts[a]; c != nil {
			by[c] = append(by[c], a)
			if free {
				h.finishedLocked(c, a)
			}
		}
	}
	h.mu.Unlock()
	for c, as := range by {
		c.enqueue(&protocol.Frame{Type: protocol.TypeCancel, Cancel: &protocol.Cancel{Attempts: as, Reason: reason}})
	}
}

func (h *hub) add(c *conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if old := h.conns[c.id]; old != nil {
		// The same worker reconnected before its old socket was noticed gone.
		// (CloseNow: a close handshake could wait on a dead peer while the
		// hub is locked.)
		old.ws.Close()
		h.dropLocked(old)
	}
	h.conns[c.id] = c
	for a, held := range c.running {
		h.attempts[a] = c
		h.countLocked(held.owner, 1)
	}
	if hb := h.handBacks[c.id]; hb != nil {
		c.heldUntil = hb.until // a reconnection does not end a hold
	}
	h.openedLocked(c)
}

// remove forgets c, the worker's connection that ended. Unless the worker
// has a newer connection to this replica already, it returns the attempts
// c held that cannot have started, and those that may have: a worker runs
// at most threads attempts at once, the oldest it holds (attempt ids grow
// in the order of assignment, and a worker starts its queued attempts in
// that order), so the others waited in its queue (docs/RATIONALE.md).
func (h *hub) remove(c *conn) (unstarted, mayHaveRun []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns[c.id] != c {
		return nil, nil
	}
	h.dropLocked(c)
	held := c.rankedLocked()
	n := min(len(held), c.threads)
	return held[n:], held[:n]
}

// rankedLocked returns the attempts c holds, oldest first, but for those
// taken back from its queue already (dropQueued: ended, waiting for the
// worker's report): they rank for nothing. hub.mu held.
func (c *conn) rankedLocked() []int64 {
	held := make([]int64, 0, len(c.running))
	for a, ha := range c.running {
		if !ha.given {
			held = append(held, a)
		}
	}
	slices.Sort(held)
	return held
}

// dropQueued takes back, from c's worker that has been silent for longer
// than h.silent (its read loop waited that long for a frame: not while it
// handled one, which may wait for the database), the attempts that wait
// in its queue: it runs at most
// threads attempts at once, its oldest, so the others cannot have started
// before it fell silent (remove's rule). It sends the worker a cancel for
// them; they stay in c.running, their slots taken, until the worker
// reports them cancelled (a report for an attempt it does not hold would
// count against it: fencedReport), and count no more for their owners. It
// returns those it took back now, sorted; none for a worker that holds
// nothing beyond its threads, is idle (paused with nothing held), or is
// not silent at now (Unix ns).
func (h *hub) dropQueued(c *conn, now int64) []int64 {
	if c.idle.Load() || !silentFor(c, now, h.silent) {
		return nil
	}
	// The cancel goes after the assign frames of attempts recorded for c
	// (hub.started holds assignMu until they are queued): a worker
	// ignores a cancel for an attempt it has not heard of.
	c.assignMu.Lock()
	defer c.assignMu.Unlock()
	h.mu.Lock()
	if h.conns[c.id] != c || len(c.running) <= c.threads {
		h.mu.Unlock()
		return nil
	}
	held := c.rankedLocked()
	var queued []int64
	if len(held) > c.threads {
		queued = held[c.threads:]
	}
	for _, a := range queued {
		ha := c.running[a]
		h.countLocked(ha.owner, -1)
		ha.owner, ha.given = 0, true
		c.running[a] = ha
	}
	h.mu.Unlock()
	if len(queued) > 0 {
		c.enqueue(&protocol.Frame{Type: protocol.TypeCancel, Cancel: &protocol.Cancel{Attempts: queued,
			Reason: "you fell silent with it in your queue: it was given to another worker"}})
	}
	return queued
}

func (h *hub) dropLocked(c *conn) {
	delete(h.conns, c.id)
	delete(h.open, c)
	for a, held := range c.running {
		if h.attempts[a] == c {
			delete(h.attempts, a)
		}
		if held.owner != 0 {
			// Counted no more, and not again when c's read loop ends
			// the attempt after all.
			h.countLocked(held.owner, -1)
			held.owner = 0
			c.running[a] = held
		}
	}
}

// all returns the connected workers' connections.
func (h *hub) all() []*conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := make([]*conn, 0, len(h.conns))
	for _, c := range h.conns {
		cs = append(cs, c)
	}
	return cs
}

// held lists the connected workers and the session of each.
func (h *hub) held() (ids []string, sessions []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids, sessions = make([]string, 0, len(h.conns)), make([]int64, 0, len(h.conns))
	for id, c := range h.conns {
		ids, sessions = append(ids, id), append(sessions, c.session)
	}
	return ids, sessions
}

// ids lists the connected workers.
func (h *hub) ids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.conns))
	for id := range h.conns {
		ids = append(ids, id)
	}
	return ids
}

// activeIDs lists the connected workers that are not paused: those whose
// records the plan may read.
func (h *hub) activeIDs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.conns))
	for id, c := range h.conns {
		if !c.paused {
			ids = append(ids, id)
		}
	}
	return ids
}

func (h *hub) countByKind() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := map[string]int{}
	for _, c := range h.conns {
		m[c.kind]++
	}
	return m
}

// heartbeat records a heartbeat's device state on c (none: no device): a
// sample for the stability class, the state itself, whether the worker
// paused, and whether it now heartbeats at the idle interval (paused, and
// holding no attempt). It reports whether the worker resumed from a pause.
func (h *hub) heartbeat(c *conn, now time.Time, hb *protocol.Heartbeat, interval, idleInterval time.Duration) (resumed bool) {
	dev := hb.Device
	idle := dev != nil && dev.Paused && len(hb.Running) == 0
	c.idle.Store(idle)
	s := deviceSample(now, dev)
	s.Every = interval
	if idle {
		s.Every = idleInterval
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	c.addSample(s, interval)
	if dev == nil {
		return false
	}
	c.device = *dev
	resumed = c.paused && !dev.Paused
	c.paused = dev.Paused
	h.openedLocked(c)
	return resumed
}

// succeeded records a result of c that was accepted.
func (h *hub) succeeded(c *conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.tasksDone++
	c.failStreak = 0
	if hb := h.handBacks[c.id]; hb != nil {
		hb.holds = 0
	}
}

// handBackBurst and handBackEvery are a volunteer's budget of attempts
// handed back (protocol.ReasonWorker: it paused, it is closing, its
// runner broke): those cost no one anything (store.EndHandedBack), so a
// worker that hands back every attempt as soon as it gets it, broken or
// hostile, would otherwise take the same task back at once, forever, and
// write an attempt each time. What a worker hands back while paused costs
// one from the budget, whatever its number (a volunteer's pause hands back
// all it holds, its queue included). Past the budget, the identity is held
// for handBackHold, doubled for each hold in a row up to maxHandBackHold
// (docs/SECURITY.md).
const (
	handBackBurst   = 64
	handBackEvery   = 5 * time.Second
	handBackHold    = 5 * time.Second
	maxHandBackHold = 5 * time.Minute
)

// handedBack records that c handed back those of attempts it holds, now,
// and returns how long its worker is now held (0: not held by this call).
// Call it before the attempts' slots are freed. The operator's workers are
// not held back.
func (h *hub) handedBack(c *conn, attempts []int64, now time.Time) time.Duration {
	if c.operator || len(attempts) == 0 {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, a := range attempts {
		if _, ok := c.running[a]; ok {
			n++
		}
	}
	if n == 0 {
		return 0
	}
	if c.paused {
		n = 1
	}
	hb := h.handBacks[c.id]
	if hb == nil {
		h.makeRoomForHandBacksLocked(now)
		hb = &handBack{budget: rate.NewLimiter(rate.Every(handBackEvery), handBackBurst)}
		h.handBacks[c.id] = hb
	}
	if hb.budget.AllowN(now, n) {
		return 0
	}
	hb.budget.AllowN(now, min(n, int(hb.budget.TokensAt(now)))) // what is left goes too
	if now.Before(hb.until) {
		return 0 // held already
	}
	d := min(handBackHold<<min(hb.holds, 16), maxHandBackHold)
	hb.holds++
	hb.until = now.Add(d)
	c.heldUntil = hb.until
	return d
}

// makeRoomForHandBacksLocked keeps h.handBacks under maxLimitedAddrs
// records (h.mu held): those with a full budget and no hold go first, then
// any not held.
func (h *hub) makeRoomForHandBacksLocked(now time.Time) {
	if len(h.handBacks) < maxLimitedAddrs {
		return
	}
	for id, hb := range h.handBacks {
		if !now.Before(hb.until) && hb.budget.TokensAt(now) >= handBackBurst {
			delete(h.handBacks, id)
		}
	}
	for id, hb := range h.handBacks {
		if len(h.handBacks) < maxLimitedAddrs {
			return
		}
		if !now.Before(hb.until) {
			delete(h.handBacks, id)
		}
	}
}

// failedOnce records a failure c reported that counts against it and
// returns its failures in a row.
func (h *hub) failedOnce(c *conn) (streak int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.failStreak++
	return c.failStreak
}

// setRecords gives this replica's connections their workers' database
// records (those of workers connected elsewhere are ignored).
func (h *hub) setRecords(recs []store.WorkerRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range recs {
		if c := h.conns[r.ID]; c != nil {
			c.record = r
		}
	}
}

// connState is a copy of what a connection says of its worker now, read
// under the hub's lock, for the plan and the workers' listing.
type connState struct {
	record    store.WorkerRecord
	slots     int
	running   int
	tasksDone int
	allowed   int
	setup     bool
	device    protocol.Device
	samples   []sched.Sample
	data      map[string]bool // nil when it keeps no blob
}

// states returns the state of each of cs now, under one hold of the
// lock (the plan asks for every reserved worker's in each round).
func (h *hub) states(cs []*conn) []connState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]connState, len(cs))
	for i, c := range cs {
		out[i] = c.stateLocked()
	}
	return out
}

// stateOf returns the state of worker id's connection to this replica, if
// it has one.
func (h *hub) stateOf(id string) (connState, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.conns[id]
	if c == nil {
		return connState{}, false
	}
	return c.stateLocked(), true
}

func (c *conn) stateLocked() connState {
	st := connState{record: c.record, slots: c.slots, running: len(c.running), tasksDone: c.tasksDone, allowed: c.allowed(),
		setup: c.setup, device: c.device, samples: slices.Clone(c.samples)}
	if len(c.data) > 0 {
		st.data = maps.Clone(c.data)
	}
	return st
}
