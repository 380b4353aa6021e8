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
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/throttle"
	"github.com/cyclepool/cyclepool/internal/version"
	"github.com/cyclepool/cyclepool/internal/wasmcheck"
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
	// ReconnectGrace is how long the attempts a worker may have been
	// running wait for it to come back after its socket closed, instead of
	// the rest of their leases (default Lease/3, at most Lease).
	ReconnectGrace time.Duration
	// Heartbeat is the interval at which workers are asked to heartbeat
	// (default Lease/5).
	Heartbeat time.Duration
	// IdleHeartbeat is the interval of a worker that is paused and holds
	// no attempt (default 4 heartbeats, at most half of a connection's
	// silence limit: docs/PROTOCOL.md).
	IdleHeartbeat time.Duration
	// Poll is how often the dispatcher looks for ready tasks when no
	// notification woke it (default 1s).
	Poll time.Duration
	// MaxFrameBytes bounds one worker frame (default
	// protocol.DefaultMaxFrameBytes, 80 MiB).
	MaxFrameBytes int
	// MaxModuleBytes bounds an uploaded module (default 64 MiB).
	MaxModuleBytes int
	// ModuleSpoolDir is the directory where module bodies are kept in
	// files to be served (GET /modules/{id}): one that the server owns,
	// cleared of the files an earlier process left when first used.
	// Empty: a directory the server makes under os.TempDir() and removes
	// on Close.
	ModuleSpoolDir string
	// ModuleSpoolBytes bounds the disk that module files take, the least
	// recently used going first (default the larger of 1 GiB and 8
	// MaxModuleBytes); files being served are never removed, so that
	// those beyond the bound are the ones in use, one per module.
	ModuleSpoolBytes int64
	// DataQuota is how many bytes of data blobs and modules one owner
	// may keep (default 10 GiB); it also bounds one blob.
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
	// HeaderTimeout bounds the wait for a request's header, from the
	// connection's start or its first byte (default 10s); IdleTimeout the
	// wait for the next request on a kept-alive connection (default 2
	// minutes). HTTPServer sets them.
	HeaderTimeout time.Duration
	IdleTimeout   time.Duration
	Logger        *slog.Logger
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

// silenceLimit is how long a worker may send nothing before its
// connection is closed: two leases, at least 10 s (its attempts' leases
// lapsed long before).
func (c *Config) silenceLimit() time.Duration { return max(2*c.Lease, 10*time.Second) }

func (c *Config) setDefaults() {
	if c.Replica == "" {
		c.Replica = "replica-" + randomHex(4)
	}
	if c.Lease <= 0 {
		c.Lease = 15 * time.Second
	}
	if c.ReconnectGrace <= 0 || c.ReconnectGrace > c.Lease {
		c.ReconnectGrace = min(c.Lease, max(c.Lease/3, c.ReconnectGrace))
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = c.Lease / 5
	}
	if c.IdleHeartbeat <= 0 {
		c.IdleHeartbeat = 4 * c.Heartbeat
	}
	c.IdleHeartbeat = min(max(c.IdleHeartbeat, c.Heartbeat), c.silenceLimit()/2)
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
	if c.ModuleSpoolBytes <= 0 {
		c.ModuleSpoolBytes = max(1<<30, 8*int64(c.MaxModuleBytes))
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
	if c.HeaderTimeout <= 0 {
		c.HeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Minute
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
	// disp matches ready tasks with free slots (dispatcher.go).
	disp *dispatcher

	ctx  context.Context // cancelled when Run's context is done; sockets live under it
	stop context.CancelFunc

	renewals    *batcher[renewal]
	completions *batcher[completion]
	hellos      *batcher[hello]

	owners       sync.Map // token -> store.Owner, positive cache
	knownModules sync.Map // ownedModule -> time.Time: modules an owner has pushed, and when that was found
	operatorKeys sync.Map // key -> true: operator keys, positive cache
	modules      *moduleSpool
	moduleStall  time.Duration // moduleStall, shorter in tests
	// moduleUploads bounds the module uploads read at once (in uploads):
	// each is held whole while it is checked, up to MaxModuleBytes.
	moduleUploads *turns
	// submissions bounds the workflow files read at once (in bytes):
	// parsed and written, one takes about 15 times its size.
	submissions submissionTurns
	fleet       fleetCount // workers connected to any replica, for replicaNotice
	blobKeys    blobKeys
	uploads     workerUploads // output uploads in progress, per worker
	streams     ownerStreams  // event streams open, per owner

	rt   *runtimes
	ends *finishWaiters // requests waiting for workflows to end

	// health says whether this replica can write to the database.
	health *writeHealth
	// gate decides, per source address, who may connect as a worker.
	gate *gatekeeper
	// failures counts the wrong secrets each address sent (owner tokens to
	// the API and the dashboard's sign-in, operator keys): past them, its
	// next are refused (429) before any lookup.
	failures *throttle.Failures
}

type renewal struct {
	c *conn
	r store.Renewal
}

type completion struct {
	c        *conn
	comp     store.Completion
	of       string
	workflow string // the attempt's, when its connection knew it
}

// HTTPServer returns the http.Server to serve s's Handler with: anyone
// on the internet may open connections, so each waits at most
// Config.HeaderTimeout for a request's header and Config.IdleTimeout for
// the next request (net/http waits for ever without these), and a header
// takes at most 64 KiB. Workers' WebSockets, taken over from net/http,
// keep their own silence limit.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{Handler: s.Handler(), ReadHeaderTimeout: s.cfg.HeaderTimeout, IdleTimeout: s.cfg.IdleTimeout,
		MaxHeaderBytes: 64 << 10}
}

// New returns a server on st. Call Run to start its services and serve
// Handler over HTTP.
func New(st *store.Store, cfg Config) *Server {
	cfg.setDefaults()
	s := &Server{
		cfg: cfg, store: st, log: cfg.Logger.With("replica", cfg.Replica),
		hub:           newHub(2*cfg.Heartbeat+cfg.Heartbeat/2, 2*cfg.IdleHeartbeat+cfg.IdleHeartbeat/2),
		modules:       newModuleSpool(cfg.ModuleSpoolDir, cfg.ModuleSpoolBytes, max(2*int64(cfg.MaxModuleBytes), 64<<20)),
		moduleStall:   moduleStall,
		moduleUploads: newTurns(wasmcheck.MaxConcurrent+2, 2),
		submissions:   newSubmissionTurns(),
		rt:            newRuntimes(),
		ends:          newFinishWaiters(),
		gate:          newGatekeeper(cfg.NewWorkerEvery, cfg.NewWorkerBurst),
		failures:      throttle.New(throttle.Config{}),
	}
	s.modules.log = s.log

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
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.health = newWriteHealth(s.log, max(2*time.Second, cfg.Heartbeat), s.wake)
	s.metrics = newMetrics(s)
	s.disp = &dispatcher{cfg: cfg, store: st, hub: s.hub, metrics: s.metrics, health: s.health, log: s.log, rt: s.rt,
		blobToken: s.blobToken, wakeC: make(chan struct{}, 1)}
	s.disp.readyLeft.Store(true) // until its first round
	s.renewals = newBatcher(4096, 2000, 1, s.flushRenewals)
	// One completion flusher: two waited for each other anyway on the
	// row of a workflow whose tasks both were completing (from its update
	// to the commit), and one makes batches twice as large, each paying
	// its statements and commit once.
	s.completions = newBatcher(8192, 1000, 1, s.flushCompletions)
	// Two hello flushers: one batch's transaction waits for its commit
	// while the next gathers and runs.
	s.hellos = newBatcher(4096, 500, 2, s.flushHellos)
	return s
}

// Close removes the files the server keeps of module bodies, and their
// directory when the server made it (Config.ModuleSpoolDir). Call it once
// Handler serves no more requests (after http.Server.Shutdown); module
// requests that still arrive are answered with a server error.
func (s *Server) Close() error {
	return s.modules.close()
}

// Config returns the configuration in force, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Run starts the dispatcher, the batchers, the notification listener and the
// maintenance loop, and returns when ctx is done and they have stopped.
func (s *Server) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, s.stop)
	defer stop()
	var wg sync.WaitGroup
	for _, f := range []func(context.Context){s.renewals.run, s.completions.run, s.hellos.run, s.disp.run, s.listen, s.maintain, s.touchWorkers, s.refreshStats, s.closeSilent} {
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
func (s *Server) wake() { s.disp.wake() }

// wakeSlots asks the dispatcher for a round soon: slots came free.
func (s *Server) wakeSlots() { s.disp.wakeSlots() }

// submit writes a workflow, through the dispatcher's shortcut when it
// applies (dispatcher.submit).
func (s *Server) submit(ctx context.Context, ownerID int64, nw *store.NewWorkflow) (string, error) {
	return s.disp.submit(ctx, ownerID, nw)
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
	// The workflows of the batch's attempts that long polls wait for:
	// only the batch can have finished them.
	watch := s.ends.beginReading(func(yield func(string) bool) {
		for _, b := range batch {
			if b.workflow != "" && !yield(b.workflow) {
				return
			}
		}
	}, store.MaxWatched)
	defer s.ends.endReading(watch)
	accepted, finished, statuses, err := s.store.CompleteWatching(ctx, cs, watch)
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
				s.hub.succeeded(b.c)
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
		if st, ok := statuses[id]; ok {
			s.ends.finished(id, &st)
		} else {
			s.ends.finished(id, nil)
		}
	}
}

// failed counts a failure (or a refused result) that c reported in its
// streak (conn.failStreak). Every failStreakFewer of them in a row, c's
// record is read again: the strikes the failures earned, once other
// workers' results disproved them, then hold it back (conn.allowed)
// without waiting for the next refresh of every record.
func (s *Server) failed(c *conn) {
	refresh := s.hub.failedOnce(c)%failStreakFewer == 0
	if refresh && !c.operator {
		go s.refreshRecords(s.ctx, []string{c.id})
	}
}

// replicaTouchEvery is how often a replica says it is alive.
const replicaTouchEvery = 10 * time.Second

// touchWorkers records every 10 seconds that this replica, and with it
// every worker connected to it, is alive (so that the leader can tell the
// workers of dead replicas), and reads again the records of its workers
// that are not paused (a paused worker gets no task, and its record is
// read when it resumes).
func (s *Server) touchWorkers(ctx context.Context) {
	touch := func(ctx context.Context) {
		if err := s.store.TouchReplica(ctx, s.cfg.Replica); err != nil && ctx.Err() == nil {
			s.log.Warn("touch replica", "err", err)
		}
	}
	// Every minute (and at start, which finds those of a previous run
	// under the same name), workers recorded as connected here that the
	// hub does not hold are marked gone, and those it holds that were
	// marked gone (the replica could not touch for a minute) connected.
	ghosts := func(ctx context.Context) {
		ids, sessions := s.hub.held()
		if err := s.store.ReconcileWorkers(ctx, s.cfg.Replica, ids, sessions); err != nil && ctx.Err() == nil {
			s.log.Warn("reconcile the workers' records", "err", err)
		}
	}
	// At once: a replica restarted under its name is alive again, and
	// the workers recorded as connected to its previous process get time
	// to come back (store.StartReplica).
	if err := s.store.StartReplica(ctx, s.cfg.Replica); err != nil && ctx.Err() == nil {
		s.log.Warn("record the replica's start", "err", err)
	}
	ghosts(ctx)
	n := 0
	every(ctx, replicaTouchEvery, func(ctx context.Context) {
		touch(ctx)
		if n++; n%6 == 0 {
			ghosts(ctx)
		}
		// Bounded: a read of records slower than the touch interval
		// would delay the next touch, and the replica would look dead
		// to the lease reaper. The next round reads them again.
		rctx, cancel := context.WithTimeout(ctx, replicaTouchEvery/2)
		s.refreshRecords(rctx, s.hub.activeIDs())
		cancel()
	})
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
