// Package server is cyclepool's server: the owners' REST API, the worker
// WebSocket hub, the dispatcher that hands ready tasks to idle worker slots,
// and the maintenance (lease reaper) that one replica at a time runs.
//
// A server keeps no state of its own besides its open sockets: every
// decision is committed to PostgreSQL (package store) before it is
// acknowledged, so that any number of replicas can share one database and
// any of them can die.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/version"
	"github.com/cyclepool/cyclepool/web"

	"github.com/gorilla/websocket"
)

// Config configures a Server. Zero fields take the defaults given.
type Config struct {
	// Replica names this process among the replicas sharing the database
	// (default: a random name).
	Replica string
	// Lease is how long an attempt stays held without a heartbeat before
	// it is lost and its task queued again (default 15s).
	Lease time.Duration
	// Heartbeat is the interval at which workers are asked to heartbeat
	// (default Lease/5).
	Heartbeat time.Duration
	// Poll is how often the dispatcher looks for ready tasks when no
	// notification woke it (default 1s).
	Poll time.Duration
	// MaxFrameBytes bounds one worker frame (default
	// protocol.DefaultMaxFrameBytes, 80 MiB).
	MaxFrameBytes int
	// MaxModuleBytes bounds an uploaded module (default 64 MiB).
	MaxModuleBytes int
	// DataQuota is how many bytes of data blobs one owner may keep
	// (default 10 GiB); it also bounds one blob.
	DataQuota int64
	// WorkerRetention is how long the record of a disconnected worker is
	// kept (default 30 days); maintenance deletes older ones, every hour.
	WorkerRetention time.Duration
	// Verify is the verification policy: replicas and quorum when a
	// workflow asks for verification without saying, the most replicas,
	// and when a worker is trusted alone (default sched.DefaultVerify).
	// Open the store with store.WithTrust of the same.
	Verify sched.VerifyConfig
	// Fairness is the fairness strategy of the dispatcher (default none);
	// deadlock prevention switches it off for a task that waited too long.
	Fairness sched.Strategy
	// FrameAncestors lists the sites that may embed the volunteer page in
	// a frame (CSP frame-ancestors; default 'self': only the server's own
	// pages).
	FrameAncestors string
	// NewWorkerBurst and NewWorkerEvery bound the new worker identities
	// made per source address: NewWorkerBurst at once, then one every
	// NewWorkerEvery (defaults 30 and 20s; NewWorkerEvery < 0: no bound).
	// Workers with an operator key are not bound.
	NewWorkerBurst int
	NewWorkerEvery time.Duration
	// SessionKey signs the dashboard's session cookies: at least
	// MinSessionKeyBytes, shared by the replicas behind one load balancer
	// (ParseSessionKey reads CYCLEPOOL_SESSION_KEY). Empty: a random key
	// per process, and a restart signs everyone out.
	SessionKey []byte
	Logger     *slog.Logger
}

// MinSessionKeyBytes is the shortest Config.SessionKey.
const MinSessionKeyBytes = 32

// ParseSessionKey reads a session key written in hex (as
// CYCLEPOOL_SESSION_KEY holds it): "" is none; anything but at least
// MinSessionKeyBytes of hex is an error that says what is wrong, so that a
// server refuses to start rather than fall back to a random key.
func ParseSessionKey(h string) ([]byte, error) {
	if h == "" {
		return nil, nil
	}
	key, err := hex.DecodeString(strings.TrimSpace(h))
	if err != nil {
		return nil, fmt.Errorf("the session key is not hex: %w", err)
	}
	if len(key) < MinSessionKeyBytes {
		return nil, fmt.Errorf("the session key has %d bytes, want at least %d (%d hex digits; openssl rand -hex 32 makes one)",
			len(key), MinSessionKeyBytes, 2*MinSessionKeyBytes)
	}
	return key, nil
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *Config) setDefaults() {
	if c.Replica == "" {
		c.Replica = "replica-" + randomHex(4)
	}
	if c.Lease <= 0 {
		c.Lease = 15 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = c.Lease / 5
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = protocol.DefaultMaxFrameBytes
	}
	if c.DataQuota <= 0 {
		c.DataQuota = 10 << 30
	}
	if c.MaxModuleBytes <= 0 {
		c.MaxModuleBytes = 64 << 20
	}
	if c.Verify == (sched.VerifyConfig{}) {
		c.Verify = sched.DefaultVerify()
	}
	if c.NewWorkerBurst <= 0 {
		c.NewWorkerBurst = 30
	}
	if c.NewWorkerEvery == 0 {
		c.NewWorkerEvery = 20 * time.Second
	}
	if c.WorkerRetention <= 0 {
		c.WorkerRetention = 30 * 24 * time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Server is one cyclepool replica.
type Server struct {
	cfg   Config
	store *store.Store
	// upgrader accepts workers' WebSockets (session.go).
	upgrader websocket.Upgrader
	log      *slog.Logger
	hub      *hub
	metrics  *metrics
	wakeC    chan struct{}
	// tasksWake says a wake-up was for tasks that became ready (wake), not
	// only for free slots (wakeSlots).
	tasksWake atomic.Bool
	// readyLeft is the dispatcher's: its last round may have left ready
	// tasks unclaimed. While it is false a small submission may claim its
	// own ready tasks for idle slots (submit) without overtaking older ones.
	readyLeft atomic.Bool
	// widen is the dispatcher's: the candidate window of its next round is
	// 2^widen times the usual (candidateWindow).
	widen int
	// readyGen counts the wake-ups for tasks that became ready (wake);
	// cands, the dispatcher's, are ready tasks it read and has not
	// claimed, good while readyGen has not moved.
	readyGen atomic.Uint64
	cands    candidateCache

	ctx  context.Context // cancelled when Run's context is done; sockets live under it
	stop context.CancelFunc

	renewals    *batcher[renewal]
	completions *batcher[completion]

	owners       sync.Map // token -> store.Owner, positive cache
	knownModules sync.Map // ownedModule -> true: modules an owner has pushed
	modules      *moduleCache
	blobKeys     blobKeys
	uploads      workerUploads // output uploads in progress, per worker

	rt   *runtimes
	ends *finishWaiters // requests waiting for workflows to end

	// health says whether this replica can write to the database.
	health *writeHealth
	// gate decides, per source address, who may connect as a worker.
	gate *gatekeeper
}

type renewal struct {
	c *conn
	r store.Renewal
}

type completion struct {
	c    *conn
	comp store.Completion
	of   string
}

// New returns a server on st. Call Run to start its services and serve
// Handler over HTTP.
func New(st *store.Store, cfg Config) *Server {
	cfg.setDefaults()
	s := &Server{
		cfg: cfg, store: st, log: cfg.Logger.With("replica", cfg.Replica),
		hub: newHub(2*cfg.Heartbeat + cfg.Heartbeat/2), wakeC: make(chan struct{}, 1),
		modules: newModuleCache(64 << 20),
		rt:      newRuntimes(),
		ends:    newFinishWaiters(),
		gate:    newGatekeeper(cfg.NewWorkerEvery, cfg.NewWorkerBurst),
	}
	s.upgrader = websocket.Upgrader{
		// Workers need no origin: volunteers' pages may be served from
		// anywhere.
		CheckOrigin: func(*http.Request) bool { return true },
		// Reads use the HTTP server's own 4 KiB buffer; a write takes a
		// buffer from the pool for the length of one message, so an idle
		// connection holds none (idle_worker_conn_kib).
		WriteBufferPool: &sync.Pool{},
		// No compression: frames are small and mostly unique.
		EnableCompression: false,
		HandshakeTimeout:  10 * time.Second,
		Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
			http.Error(w, "a worker's WebSocket: "+reason.Error(), status)
		},
	}
	s.readyLeft.Store(true) // until the dispatcher's first round
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.health = newWriteHealth(s.log, max(2*time.Second, cfg.Heartbeat), s.wake)
	s.metrics = newMetrics(s)
	s.renewals = newBatcher(4096, 2000, 1, s.flushRenewals)
	// One completion flusher: two waited for each other anyway on the
	// row of a workflow whose tasks both were completing (from its update
	// to the commit), and one makes batches twice as large, each paying
	// its statements and commit once.
	s.completions = newBatcher(8192, 1000, 1, s.flushCompletions)
	return s
}

// Config returns the configuration in force, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Run starts the dispatcher, the batchers, the notification listener and the
// maintenance loop, and returns when ctx is done and they have stopped.
func (s *Server) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, s.stop)
	defer stop()
	var wg sync.WaitGroup
	for _, f := range []func(context.Context){s.renewals.run, s.completions.run, s.dispatch, s.listen, s.maintain, s.touchWorkers, s.refreshStats} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx)
		}()
	}
	wg.Wait()
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.store.ReplicaGone(gctx, s.cfg.Replica); err != nil {
		s.log.Warn("mark workers disconnected", "err", err)
	}
	if err := s.store.FlushTallies(gctx); err != nil {
		s.log.Warn("write the dashboard's counts", "err", err)
	}
	return nil
}

// wake asks the dispatcher for a round soon: tasks may have become ready.
func (s *Server) wake() {
	s.readyGen.Add(1)
	s.tasksWake.Store(true)
	s.wakeSlots()
}

// wakeSlots asks the dispatcher for a round soon because slots came free
// (an attempt ended, a worker arrived or resumed, a queue grew). The
// dispatcher skips the round when its last one left no ready task behind:
// there is nothing for the slots until a task becomes ready, which wakes
// it again (wake).
func (s *Server) wakeSlots() {
	select {
	case s.wakeC <- struct{}{}:
	default:
	}
}

// dispatch matches ready tasks with free slots of this replica's workers
// whenever woken (a task became ready, a slot came free, a worker arrived),
// and at least every Poll.
func (s *Server) dispatch(ctx context.Context) {
	t := time.NewTicker(s.cfg.Poll)
	defer t.Stop()
	// left (readyLeft): the last round may have left ready tasks
	// unclaimed (it had fewer slots than tasks, read as many candidates as
	// it could, or could not look).
	left := true
	defer s.readyLeft.Store(true)
	for {
		s.readyLeft.Store(left)
		select {
		case <-ctx.Done():
			return
		case <-s.wakeC:
			if !s.tasksWake.Swap(false) && !left {
				s.metrics.rounds.WithLabelValues("skipped").Inc()
				continue
			}
		case <-t.C:
			s.tasksWake.Store(false)
			s.cands.drop() // the poll reads the queue anew
		}
		if failing, _ := s.health.state(); failing {
			// Claims would fail too: the round waits for the database
			// to write again (writeHealth wakes the dispatcher then).
			left = true
			continue
		}
		s.readyLeft.Store(true) // until this round has claimed what it could
		for races := 0; ctx.Err() == nil; {
			slots := s.hub.reserve(1000)
			if len(slots) == 0 {
				left = true
				break
			}
			s.metrics.rounds.WithLabelValues("run").Inc()
			widen := s.widen
			n, planned, more, err := s.assign(ctx, slots)
			s.health.observe("claim", err)
			left = more
			if err != nil {
				left = true
				if ctx.Err() == nil {
					s.log.Log(ctx, s.health.level(err), "dispatch", "err", err)
				}
				break
			}
			if n < planned && races < 3 {
				// Another replica claimed some of the planned tasks: plan
				// again with what is left.
				races++
				continue
			}
			// Slots left idle wait for the next wake-up, unless this round
			// widened the window: a wider one may find work for them now.
			if n < len(slots) && s.widen <= widen {
				break
			}
		}
	}
}

// submit writes a workflow. When this replica's workers have idle slots
// and its dispatcher left no older ready task waiting, a small workflow's
// ready tasks are planned for those slots before it is written, claimed in
// the submission's own transaction (store.CreateWorkflowClaiming), then
// sent: on the path of every interactive task, that saves the dispatcher's
// wake-up and the claim's own transaction. Ready tasks it leaves, and
// those of any other submission, wake every replica's dispatcher by the
// commit's notification.
func (s *Server) submit(ctx context.Context, ownerID int64, nw *store.NewWorkflow) (string, error) {
	var slots []*conn
	var cands []store.Candidate
	now := time.Now()
	// Not while ready tasks may wait: those the last round left, those a
	// round under way has not claimed yet, those a wake-up announced.
	if nw.Claimable() && !s.readyLeft.Load() && !s.tasksWake.Load() {
		if cands = s.store.SubmissionCandidates(nw, now); len(cands) > 0 {
			// Two slots a replica, spread over the workers (reserve): the
			// plan has a choice, and concurrent submissions find slots too.
			pending := 0
			for _, c := range cands {
				pending += c.Pending
			}
			slots = s.hub.reserve(min(2*pending, 1000))
		}
	}
	if len(slots) == 0 {
		return s.store.CreateWorkflow(ctx, ownerID, nw)
	}
	reserved := byWorker(slots)
	picks := s.plan(now, cands, s.planWorkers(reserved))
	sp := make([]store.SubmitPick, len(picks))
	for i, p := range picks {
		sp[i] = store.SubmitPick{Task: int(p.TaskID), Worker: p.Worker, CkptMS: p.CkptMS, Solo: p.Solo}
	}
	// Not the request's context: once its claims may have committed, they
	// must reach their workers even if the owner hangs up.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	id, claimed, err := s.store.CreateWorkflowClaiming(cctx, ownerID, nw, sp, s.cfg.Lease)
	if err != nil {
		for _, cs := range reserved {
			s.hub.release(cs)
		}
		s.wakeSlots()
		return "", err
	}
	if len(claimed) > 0 {
		s.metrics.rounds.WithLabelValues("submission").Inc()
	}
	s.metrics.observeBatch("submission", len(claimed), now)
	s.deliver(cctx, claimed, nil, reserved)
	switch {
	case len(claimed) < len(sp):
		s.wake() // a refused pick left its task ready, and nobody was told
	case len(claimed) < len(slots):
		s.wakeSlots() // a round that ran meanwhile found these slots taken
	}
	return id, nil
}

// assign plans which ready tasks go to the reserved slots (plan), claims
// them and sends them out; it returns how many were claimed and how many
// were planned, and whether ready tasks may be left unclaimed; it gives
// back the slots it did not use.
func (s *Server) assign(ctx context.Context, slots []*conn) (claimedN, plannedN int, more bool, err error) {
	reserved := byWorker(slots)
	start := time.Now()
	limit := candidateWindow(len(slots), s.widen)
	cands, err := s.candidates(ctx, limit)
	if err != nil {
		for _, cs := range reserved {
			s.hub.release(cs)
		}
		return 0, 0, true, err
	}
	pending := 0
	for _, c := range cands {
		pending += c.Pending
	}
	picks := s.plan(time.Now(), cands, s.planWorkers(reserved))
	claimed, err := s.store.ClaimPicks(ctx, picks, s.cfg.Lease)
	s.metrics.observeBatch("claim", len(claimed), start)
	undelivered := s.deliver(ctx, claimed, err, reserved)
	more = len(cands) == limit || len(claimed) < pending || undelivered > 0
	excluding := false // a worker ran a replica of a candidate: the plan could not give it that one
	for i := range cands {
		excluding = excluding || len(cands[i].Exclude) > 0
	}
	s.widen = nextWiden(s.widen, limit, len(cands), len(picks), len(slots), excluding)
	s.cands.claimed(claimed, len(picks), len(slots), err, time.Now())
	return len(claimed), len(picks), more, err
}

// candidates returns the window of ready tasks a round plans with: the
// first limit of those the dispatcher read before and has not claimed,
// while no task became ready since (readyGen) and they fill the window
// (or were the whole queue), or else the first limit of a fresh read of
// twice as many. Each task is then read about once before its claim
// rather than at every round that does not reach it. While the cache is
// off (candidateCache.off), every round reads its window anew.
func (s *Server) candidates(ctx context.Context, limit int) ([]store.Candidate, error) {
	gen := s.readyGen.Load()
	c := &s.cands
	if time.Now().Before(c.offUntil) {
		c.drop()
		return s.store.Candidates(ctx, limit)
	}
	if !c.ok || c.gen != gen || (len(c.tasks) < limit && c.full) {
		read := min(2*limit, maxCandidates)
		tasks, err := s.store.Candidates(ctx, read)
		if err != nil {
			c.drop()
			return nil, err
		}
		*c = candidateCache{tasks: tasks, gen: gen, full: len(tasks) == read, ok: true}
	}
	return c.tasks[:min(limit, len(c.tasks))], nil
}

// candidateCache holds the ready tasks the dispatcher read and has not
// claimed, in dispatch order.
type candidateCache struct {
	tasks []store.Candidate
	gen   uint64 // Server.readyGen when read
	full  bool   // the read filled its limit: more ready tasks may follow
	ok    bool
	// offUntil: no cache before then (claimed says why).
	offUntil time.Time
}

// cacheOff is how long the cache stays off after a round found it wrong.
const cacheOff = 10 * time.Second

func (c *candidateCache) drop() { *c = candidateCache{offUntil: c.offUntil} }

// claimed updates the cache after a round planned picks for its slots and
// claimed claimed (err: the claim's error) at now. Claimed tasks leave it.
// It is dropped when it may hide better candidates: after an error, or
// when slots were left idle (the tasks behind the cached ones may fit
// them). It is also turned off for a while (cacheOff) when it proves
// wrong, so that rounds read no more than their window: after a pick that
// was not claimed (another replica took the task: replicas' claims send
// no notification, so caches would keep offering what others took) or
// with a replicated task in it (whose replicas left and exclusions change
// with every claim).
func (c *candidateCache) claimed(claimed []store.Claimed, picks, slots int, err error, now time.Time) {
	off := func() {
		c.drop()
		c.offUntil = now.Add(cacheOff)
	}
	switch {
	case err != nil || picks < slots:
		c.drop()
		return
	case len(claimed) < picks:
		off()
		return
	}
	for i := range c.tasks {
		if t := &c.tasks[i]; t.Replicas > 1 || t.Pending > 1 || len(t.Exclude) > 0 {
			off()
			return
		}
	}
	if !c.ok {
		return
	}
	gone := make(map[int64]bool, len(claimed))
	for i := range claimed {
		gone[claimed[i].TaskID] = true
	}
	c.tasks = slices.DeleteFunc(c.tasks, func(t store.Candidate) bool { return gone[t.TaskID] })
}

// maxCandidates bounds the candidate window of a round.
const maxCandidates = 4096

// candidateWindow is how many ready tasks a round of n slots reads: twice
// as many as it has slots (the plan chooses among them: longest first,
// replicas on distinct workers), plus a few for the smallest rounds, and
// 2^widen times that after rounds whose full window could not fill the
// slots (nextWiden). The read costs PostgreSQL and this process per task
// read, and a round claims at most one task per slot: with four times as
// many (4n+64), each task was read about five times before its claim,
// 10 to 15% of the CPU both spent per task in the dispatch benchmark.
func candidateWindow(n, widen int) int {
	return min((2*n+16)<<min(widen, 12), maxCandidates)
}

// nextWiden is the widening of the next round's window after a round read
// got candidates of a window of limit and planned picks for its slots,
// excluding some workers from some candidates (replicas they ran). A full
// window that could not fill the slots for that reason may hide ready
// tasks that could (the oldest ready tasks may all be replicas that these
// workers ran already): the next round, at once, reads twice as many, up
// to maxCandidates. A round that filled its slots, saw the whole queue,
// or left slots idle for another reason (fairness, stability: a wider
// window would not change that) goes back to the usual window.
func nextWiden(widen, limit, got, picks, slots int, excluding bool) int {
	switch {
	case got < limit || picks >= slots || !excluding:
		return 0
	case limit < maxCandidates:
		return widen + 1
	}
	return widen
}

// byWorker groups reserved slots by worker id.
func byWorker(slots []*conn) map[string][]*conn {
	reserved := map[string][]*conn{} // worker id -> its reserved slots
	for _, c := range slots {
		reserved[c.id] = append(reserved[c.id], c)
	}
	return reserved
}

// deliver sends claimed attempts to the reserved slots of their workers
// and gives back the slots left unused. An attempt that cannot be sent
// (its worker left meanwhile, its inputs are missing or too large for a
// frame, or the claim committed but its inputs could not be read: err)
// is ended at once; it returns how many were, after waking the dispatcher
// for their tasks.
func (s *Server) deliver(ctx context.Context, claimed []store.Claimed, err error, reserved map[string][]*conn) (undelivered int) {
	byConn := map[*conn][]protocol.Assign{}
	var undeliverable []store.Completion
	end := func(cl *store.Claimed, c *conn, comp store.Completion) {
		comp.Attempt, comp.Worker = cl.Attempt, cl.Worker
		undeliverable = append(undeliverable, comp)
		s.hub.release([]*conn{c})
	}
	blobURL := func(id string) (string, error) {
		tok, err := s.blobToken(ctx, id)
		return "/blobs/" + id + "?k=" + tok, err
	}
	for i := range claimed {
		cl := &claimed[i]
		c := reserved[cl.Worker][0]
		reserved[cl.Worker] = reserved[cl.Worker][1:]
		switch {
		case err != nil: // the claim committed but its inputs could not be read
			end(cl, c, store.Completion{Reason: protocol.ReasonWorker, Message: "the server could not read the task's inputs; retried", End: store.EndServerFault})
		case cl.Missing != "":
			end(cl, c, store.Completion{Reason: "input", Message: cl.Missing, End: store.EndTaskFinal})
		case assignSize(cl) > s.cfg.MaxFrameBytes:
			end(cl, c, store.Completion{Reason: "input", End: store.EndTaskFinal, Message: fmt.Sprintf(
				"inputs, stdin and checkpoint take %d MiB, more than the %d MiB one assignment can carry", assignSize(cl)>>20, s.cfg.MaxFrameBytes>>20)})
		default:
			a, err := toAssign(cl, assignee{upload: c.upload, browser: c.kind == protocol.KindBrowser, blobURL: blobURL})
			switch {
			case err != nil:
				end(cl, c, store.Completion{Reason: protocol.ReasonWorker, Message: "the server could not sign the task's data addresses; retried", End: store.EndServerFault})
			case a.Setup != nil && !c.setup:
				end(cl, c, store.Completion{Reason: protocol.ReasonWorker, End: store.EndUnstarted,
					Message: "the task reads an output uploaded over HTTP, which this worker's build cannot download; queued again"})
			default:
				byConn[c] = append(byConn[c], a)
			}
		}
	}
	for _, cs := range reserved {
		s.hub.release(cs)
	}
	for c, as := range byConn {
		if !s.hub.started(c, as) {
			// The worker left (or reconnected) meanwhile: put its tasks back
			// at once, without using up an attempt.
			for i := range as {
				undeliverable = append(undeliverable, store.Completion{Attempt: as[i].Attempt, Worker: c.id, Reason: protocol.ReasonWorker,
					Message: "the worker disconnected before the task reached it; queued again", End: store.EndUnstarted})
			}
			continue
		}
		for _, batch := range assignFrames(as, s.cfg.MaxFrameBytes) {
			c.enqueue(&protocol.Frame{Type: protocol.TypeAssign, Assign: batch})
		}
	}
	s.metrics.dispatched.Add(float64(len(claimed) - len(undeliverable)))
	if len(undeliverable) > 0 {
		if _, cerr := s.store.Complete(ctx, undeliverable); cerr != nil {
			s.log.Error("end undeliverable attempts", "err", cerr)
		}
		s.wake()
	}
	return len(undeliverable)
}

// assignFrames splits one worker's attempts into assign frames: several to
// a frame (a worker decodes and handles one frame at a time, which matters
// most for a browser), as long as the frame stays well under the limits of
// a whole frame (maxFrame) and of its JSON header (1 MiB).
func assignFrames(as []protocol.Assign, maxFrame int) [][]protocol.Assign {
	const maxPerFrame, maxHeader = 64, 256 << 10
	var out [][]protocol.Assign
	for i := 0; i < len(as); {
		j, data, head := i, 0, 0
		for ; j < len(as) && j-i < maxPerFrame; j++ {
			a := &as[j]
			d := 64<<10 + len(a.Stdin.Data) + len(a.Restore.Data)
			h := 1024 + len(a.Task) + len(a.Module)
			for _, in := range a.Inputs {
				d += len(in.Data)
				h += 64 + len(in.Name)
			}
			for _, arg := range a.Args {
				h += 8 + 2*len(arg) // JSON may escape
			}
			if j > i && (data+d > maxFrame || head+h > maxHeader) {
				break
			}
			data, head = data+d, head+h
		}
		out = append(out, as[i:j])
		i = j
	}
	return out
}

// assignSize is about the size of the assign frame of a claimed task.
func assignSize(c *store.Claimed) int {
	n := 64<<10 + len(c.Stdin) + len(c.Restore)
	for _, in := range c.Inputs {
		n += len(in.Data)
	}
	return n
}

// assignee is what toAssign needs to know of the worker an attempt goes
// to.
type assignee struct {
	// upload: the worker uploads large outputs (protocol.FeatureUpload);
	// without it, output limits are at most what a result frame carries.
	upload  bool
	browser bool
	// blobURL is the address a worker downloads blob id from.
	blobURL func(id string) (string, error)
}

// toAssign is the assignment of a claimed attempt for worker w. An input
// uploaded over HTTP becomes a file of the task's setup, at /in/NAME (or
// its own path), which the worker downloads.
func toAssign(c *store.Claimed, w assignee) (protocol.Assign, error) {
	a := protocol.Assign{
		Attempt: c.Attempt, Task: c.WorkflowID + "/" + c.Name, Module: c.Module, Args: c.Args,
		Stdin: protocol.Blob{Data: c.Stdin}, Restore: protocol.Blob{Data: c.Restore},
		Seed: uint64(c.Seed), CkptMS: c.CkptMS, Priority: c.Priority,
		Limits: protocol.Limits{MemoryPages: uint32(c.MemoryPages), WallMS: c.TimeoutMS, OutputBytes: c.OutputBytes, LogBytes: c.LogBytes},
	}
	if !w.upload {
		a.Limits.OutputBytes = min(a.Limits.OutputBytes, protocol.InlineOutputBytes)
	}
	if w.browser {
		a.Limits.OutputBytes = min(a.Limits.OutputBytes, protocol.BrowserOutputBytes)
	}
	if c.Setup != nil {
		// Written by toNewWorkflow from a protocol.Setup: it decodes.
		a.Setup = new(protocol.Setup)
		if err := json.Unmarshal(c.Setup, a.Setup); err != nil {
			a.Setup = nil
		}
	}
	if c.RestoreBlob != "" && w.upload {
		// (A worker of a build without uploads would not download it:
		// it starts from the beginning, which is always correct.)
		u, err := w.blobURL(c.RestoreBlob)
		if err != nil {
			return a, err
		}
		a.RestoreFrom = &protocol.File{Blob: c.RestoreBlob, Size: c.RestoreSize, URL: u}
	}
	for _, in := range c.Inputs {
		if in.Blob == "" {
			a.Inputs = append(a.Inputs, protocol.Blob{Name: in.Name, Data: in.Data})
			continue
		}
		u, err := w.blobURL(in.Blob)
		if err != nil {
			return a, err
		}
		if a.Setup == nil {
			a.Setup = new(protocol.Setup)
		}
		p := in.Name
		if !strings.HasPrefix(p, "/") {
			p = "/in/" + p
		}
		a.Setup.Files = append(a.Setup.Files, protocol.File{Path: p, Blob: in.Blob, Size: in.Size, URL: u})
	}
	return a, nil
}

func (s *Server) flushRenewals(ctx context.Context, batch []renewal) {
	type key struct {
		attempt int64
		worker  string
	}
	rs := make([]store.Renewal, len(batch))
	conns := map[key]*conn{}
	for i, b := range batch {
		rs[i] = b.r
		conns[key{b.r.Attempt, b.r.Worker}] = b.c
	}
	start := time.Now()
	lost, err := s.store.Renew(ctx, slices.Clone(rs), s.cfg.Lease)
	s.metrics.observeBatch("renew", len(batch), start)
	s.health.observe("renew leases", err)
	if err != nil {
		s.log.Log(ctx, s.health.level(err), "renew leases", "err", err)
		return
	}
	by := map[*conn][]int64{}
	lostSet := map[int64]bool{}
	for _, a := range lost {
		lostSet[a] = true
	}
	for _, r := range rs {
		if c := conns[key{r.Attempt, r.Worker}]; c != nil && lostSet[r.Attempt] {
			by[c] = append(by[c], r.Attempt)
			s.hub.finished(c, r.Attempt)
		}
	}
	for c, as := range by {
		c.enqueue(&protocol.Frame{Type: protocol.TypeCancel, Cancel: &protocol.Cancel{Attempts: as, Reason: "the attempt no longer holds its lease"}})
	}
}

func (s *Server) flushCompletions(ctx context.Context, batch []completion) {
	cs := make([]store.Completion, len(batch))
	for i, b := range batch {
		cs[i] = b.comp
	}
	start := time.Now()
	accepted, finished, err := s.store.CompleteFinished(ctx, cs)
	s.metrics.observeBatch("complete", len(batch), start)
	s.health.observe("commit results", err)
	acks := map[*conn][]protocol.Ack{}
	for i, b := range batch {
		ack := protocol.Ack{Attempt: b.comp.Attempt, Of: b.of}
		// After an error, accepted still tells the completions committed
		// anyway (the batch took two transactions and the second failed).
		committed := accepted != nil && accepted[i]
		switch {
		case committed && cs[i].Refused != "":
			// The result broke its task's rules: its attempt ended,
			// refused (store.EndRefused).
			ack.Error = "refused: " + cs[i].Refused
			s.metrics.completions.WithLabelValues("refused").Inc()
			s.failed(b.c)
		case committed:
			ack.OK = true
			if b.comp.OK {
				s.hub.mu.Lock()
				b.c.tasksDone++
				b.c.failStreak = 0
				s.hub.mu.Unlock()
				s.metrics.completions.WithLabelValues("succeeded").Inc()
			} else {
				s.metrics.completions.WithLabelValues("failed").Inc()
				if b.comp.End == store.EndTaskError || b.comp.End == store.EndRefused {
					s.failed(b.c)
				}
			}
		case err != nil:
			ack.Error, ack.Retry = "not committed: server error; send it again", true
		default:
			ack.Error = "refused: the attempt no longer holds its lease"
			s.metrics.completions.WithLabelValues("refused").Inc()
		}
		// Before the ack goes: a worker told to retry may send the
		// outcome again at once. This also lets go of its payload bytes.
		s.hub.settleOutcome(b.c, b.comp.Attempt, ack.Retry)
		acks[b.c] = append(acks[b.c], ack)
	}
	clear(cs) // the payloads go with the batch (the batcher clears its own)
	if err != nil {
		s.log.Log(ctx, s.health.level(err), "complete attempts", "n", len(batch), "err", err)
	}
	for c, as := range acks {
		c.enqueue(&protocol.Frame{Type: protocol.TypeAck, Acks: as})
	}
	// After the counts above: a waiter told of the end sees them.
	for _, id := range finished {
		s.ends.finished(id)
	}
}

// failed counts a failure (or a refused result) that c reported in its
// streak (conn.failStreak). Every failStreakFewer of them in a row, c's
// record is read again: the strikes the failures earned, once other
// workers' results disproved them, then hold it back (conn.allowed)
// without waiting for the next refresh of every record.
func (s *Server) failed(c *conn) {
	s.hub.mu.Lock()
	c.failStreak++
	refresh := c.failStreak%failStreakFewer == 0
	s.hub.mu.Unlock()
	if refresh && !c.operator {
		go s.refreshRecords(s.ctx, []string{c.id})
	}
}

// touchWorkers records every minute or so that this replica's workers are
// still connected, so that the leader can tell workers of dead replicas.
func (s *Server) touchWorkers(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			ids := s.hub.ids()
			if err := s.store.TouchWorkers(ctx, ids); err != nil && ctx.Err() == nil {
				s.log.Warn("touch workers", "err", err)
			}
			s.refreshRecords(ctx, ids)
		}
	}
}

// Handler returns the HTTP handler: the API, the worker socket, modules and
// the operations endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ws/worker", s.handleWorker)
	mux.HandleFunc("GET /modules/{id}", s.handleModule)
	mux.HandleFunc("GET /blobs/{id}", s.handleWorkerBlob)
	mux.HandleFunc("PUT /outputs/{attempt}", s.handleUploadOutput)
	mux.HandleFunc("PUT /checkpoints/{attempt}", s.handleUploadOutput)
	healthz := []byte("ok cyclepool " + version.String() + "\n")
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(healthz) })
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.Handle("GET /metrics", s.metrics.handler())
	s.routeAPI(mux, s.authed)
	// The volunteer page and its assets (package web).
	volunteer := web.Handler(s.cfg.FrameAncestors)
	mux.Handle("GET /{$}", volunteer)
	mux.Handle("GET /static/", volunteer)
	// The owners' dashboard (package web/app, server/dashboard.go).
	mux.Handle("/app/", s.Dashboard())
	return mux
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	// Anyone may read /readyz: it says why in plain words, never the
	// database's own message (its user, name, address, paths), which the
	// log has.
	if failing, why := s.health.state(); failing {
		http.Error(w, "not ready: the database cannot write: "+why, http.StatusServiceUnavailable)
		return
	}
	if err := s.store.Ping(ctx); err != nil {
		s.log.Debug("readiness: database ping failed", "err", err)
		http.Error(w, "not ready: "+store.FaultSummary(err), http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}
