package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/cyclepool/cyclepool/internal/pgembed"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/server"
	"github.com/cyclepool/cyclepool/wasmworker"
	"github.com/cyclepool/cyclepool/wasmworker/headless"
	"github.com/cyclepool/cyclepool/web"
)

// serveProcs is the GOMAXPROCS of a server process: flag when set, else
// the runtime's own when the environment sets GOMAXPROCS, else half the
// CPUs (at least one) when the server starts its embedded PostgreSQL, and
// all of them otherwise. With the database, and usually the local worker,
// on the same CPUs, the server's own spare Ps cost more than they give: on
// 2 cores its CPU per single task fell by a sixth with one P, and the
// task's latency by 0.15 to 0.3 ms (docs/RATIONALE.md, GOMAXPROCS).
func serveProcs(flag int, envSet, embedded bool, cpus int) int {
	def := cpus
	if embedded {
		def = max(1, cpus/2)
	}
	return procs(flag, envSet, def)
}

// runServe runs a server replica, with the embedded PostgreSQL unless a
// database URL is given, and optionally a local headless worker.
func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", ":8080", "address to listen on")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL; empty starts a private cluster under --data-dir")
	dataDir := fs.String("data-dir", "data", "directory for the embedded PostgreSQL, the owner token and caches")
	localSlots := fs.Int("local-worker", 0, "also run a headless worker with this many slots in this process (0: none)")
	localShare := fs.Int("local-worker-cpu-share", 100, "the local worker's --cpu-share: percentage of each slot's CPU time that tasks may use (10 to 100, Linux only)")
	lease := fs.Duration("lease", 15*time.Second, "how long an attempt survives without a heartbeat before its task is requeued")
	reconnectGrace := fs.Duration("reconnect-grace", 0, "how long the attempts a worker may have been running wait for it to come back after its socket closed, "+
		"before their tasks are requeued (0: a third of --lease; at most --lease)")
	wallGrace := fs.Duration("wall-grace", 0, "how long past its task's wall time a worker may hold an attempt before the server takes it back, "+
		"charged to the worker (0: six leases and five minutes)")
	retention := fs.Duration("worker-retention", 30*24*time.Hour, "how long the record of a disconnected worker is kept (its reputation with it)")
	poll := fs.Duration("poll", time.Second, "how often the dispatcher looks for ready tasks without being told of them (notifications tell it at once)")
	replica := fs.String("replica", "", "name of this replica (default: host name and port)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	pprofAddr := fs.String("pprof", "", "serve Go's profiler on this address (e.g. 127.0.0.1:6060)")
	fairness := fs.String("fairness", "none", "fairness strategy: none, not-best, worst, worse-than-average, worse-than-majority or equal-or-worse-than-majority")
	frameAncestors := fs.String("frame-ancestors", "'self'", "sites that may embed the volunteer page in a frame, as a CSP frame-ancestors source list (e.g. \"'self' https://project.example\"; 'none': no page, not even the server's own)")
	workerKey := fs.String("worker-key", os.Getenv("CYCLEPOOL_WORKER_KEY"), "an operator key to accept from workers (as well as "+
		"the one in --data-dir/worker.key, made on first start): workers that present one are the operator's own machines")
	newWorkerBurst := fs.Int("new-workers-per-address", 30, "new worker identities one address may make at once, then one per --new-worker-every")
	newWorkerEvery := fs.Duration("new-worker-every", 20*time.Second, "how often an address may make one more new worker identity "+
		"(0: no limit; behind a reverse proxy every volunteer has the proxy's address)")
	dataQuota := fs.Int64("data-quota", 10<<10, "MiB of data blobs and modules one owner may keep (docs/DATA.md)")
	moduleSpool := fs.Int64("module-spool", 0, "MiB of disk for the module files served to workers, kept in --data-dir/modules "+
		"(0: the larger of 1 GiB and 8 of the largest modules)")
	nprocs := fs.Int("procs", 0, "CPUs running the server's code at once (GOMAXPROCS); default: GOMAXPROCS if set, else half the CPUs with the embedded PostgreSQL, all of them with --database-url")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	runtime.GOMAXPROCS(serveProcs(*nprocs, os.Getenv("GOMAXPROCS") != "", *dbURL == "", runtime.NumCPU()))
	strategy, err := sched.ParseStrategy(*fairness)
	if err != nil {
		return err
	}
	if err := checkCPUShare("serve: --local-worker-cpu-share", *localShare); err != nil {
		return err
	}
	if msg := web.CheckFrameAncestors(*frameAncestors); msg != "" {
		return fmt.Errorf("--%s", msg)
	}
	sessionKey, err := server.ParseSessionKey(os.Getenv("CYCLEPOOL_SESSION_KEY"))
	if err != nil {
		return fmt.Errorf("CYCLEPOOL_SESSION_KEY: %w", err)
	}
	log := newLogger(*logLevel)
	// The address first: a port in use is told at once, not after the
	// embedded PostgreSQL's start.
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	defer ln.Close()
	servePprof(*pprofAddr, log)
	if *dbURL == "" {
		c, err := pgembed.Start(ctx, pgembed.Config{Dir: filepath.Join(*dataDir, "postgres"), Logger: log})
		if err != nil {
			return fmt.Errorf("start the embedded PostgreSQL: %w", err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.Stop(sctx); err != nil {
				log.Error("stop PostgreSQL", "err", err)
			}
		}()
		*dbURL = c.URL()
	}
	verify := sched.DefaultVerify() // the server's and the store's
	st, err := store.Open(ctx, *dbURL, store.WithTrust(verify), store.WithWallGrace(*wallGrace))
	if err != nil {
		return err
	}
	defer st.Close()
	if *replica == "" {
		host, _ := os.Hostname()
		*replica = fmt.Sprintf("%s:%d", host, ln.Addr().(*net.TCPAddr).Port)
	}
	opKey, err := ensureOperatorKey(ctx, st, *dataDir, *workerKey)
	if err != nil {
		return fmt.Errorf("operator key: %w", err)
	}
	every := *newWorkerEvery
	if every == 0 {
		every = -1 // server.Config: no limit
	}
	srv := server.New(st, server.Config{Replica: *replica, Lease: *lease, ReconnectGrace: *reconnectGrace, Poll: *poll, Fairness: strategy, WorkerRetention: *retention,
		DataQuota: *dataQuota << 20, ModuleSpoolDir: filepath.Join(*dataDir, "modules"), ModuleSpoolBytes: *moduleSpool << 20, FrameAncestors: *frameAncestors, NewWorkerBurst: *newWorkerBurst, NewWorkerEvery: every, SessionKey: sessionKey, Verify: verify,
		Logger: log})
	hs := srv.HTTPServer()
	// The server outlives ctx (SIGINT, SIGTERM) by the local worker's
	// hand-back, which it commits (see below).
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Run(sctx)
	}()
	go func() {
		<-sctx.Done()
		shctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(shctx)
	}()
	url := "http://" + displayAddr(ln.Addr().(*net.TCPAddr))
	fmt.Printf("cyclepool serving at %s\n", url)
	fmt.Printf("  volunteers: %s/   owners' dashboard: %s/app/\n", url, url)
	if tok, err := ensureLocalOwner(ctx, st, *dataDir); err != nil {
		log.Warn("owner token", "err", err)
	} else if tok != "" {
		fmt.Printf("owner token (also in %s):\n  export CYCLEPOOL_SERVER=%s CYCLEPOOL_TOKEN=%s\n",
			filepath.Join(*dataDir, "owner.token"), url, tok)
	}
	fmt.Printf("your own machines' workers (volunteers need no key):\n  cyclepool worker --server %s --key-file %s\n",
		url, filepath.Join(*dataDir, "worker.key"))
	var local *wasmworker.Worker
	if *localSlots > 0 {
		r, err := headless.New(ctx, headless.Config{CacheDir: filepath.Join(*dataDir, "cache"), DataDir: filepath.Join(*dataDir, "worker-data"), Logger: log,
			CPUShare: *localShare})
		if err != nil {
			stop()
			<-done
			return fmt.Errorf("local worker: %w", err)
		}
		defer r.Close(context.Background())
		local = newHeadlessWorker([]string{url}, *localSlots, *localSlots, protocol.QueueLimit(*localSlots), defaultGather, r, opKey,
			log.With("component", "local-worker"))
		go func() {
			if err := local.Run(sctx); err != nil {
				log.Error("local worker", "err", err)
			}
		}()
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-sctx.Done():
			return
		}
		if local != nil {
			// The local worker's attempts go back to the queue, uncounted,
			// while the server can still commit that (cyclepool worker
			// does the same on its own).
			local.HandBack("the server is shutting down", handBackWait)
		}
		stop()
	}()
	err = hs.Serve(ln)
	stop()
	<-done
	if cerr := srv.Close(); cerr != nil {
		log.Warn("close the server", "err", cerr)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func displayAddr(a *net.TCPAddr) string {
	if a.IP.IsUnspecified() {
		return fmt.Sprintf("localhost:%d", a.Port)
	}
	return a.String()
}

// ensureLocalOwner makes sure the owner "local" exists and returns its
// token, kept in DATA_DIR/owner.token so that it survives restarts.
func ensureLocalOwner(ctx context.Context, st *store.Store, dataDir string) (string, error) {
	path := filepath.Join(dataDir, "owner.token")
	if b, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(b))
		if _, err := st.OwnerByToken(ctx, tok); err == nil {
			return tok, nil
		}
	}
	name := "local"
	tok, err := st.CreateOwner(ctx, name)
	if err != nil {
		// "local" exists but its token file is gone: make another owner.
		name = fmt.Sprintf("local-%d", time.Now().Unix())
		if tok, err = st.CreateOwner(ctx, name); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return tok, err
	}
	return tok, os.WriteFile(path, []byte(tok+"\n"), 0o600)
}

// ensureOperatorKey makes sure the operator's workers have a key: flag's,
// when set, and the one in dataDir/worker.key, made when missing. It
// returns the key the local worker presents.
func ensureOperatorKey(ctx context.Context, st *store.Store, dataDir, flag string) (string, error) {
	if flag != "" {
		if err := st.AddOperatorKey(ctx, flag); err != nil {
			return "", err
		}
	}
	path := filepath.Join(dataDir, "worker.key")
	key := ""
	if b, err := os.ReadFile(path); err == nil {
		key = strings.TrimSpace(string(b))
	}
	if key == "" {
		key = store.NewToken("cwk_")
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return "", err
		}
		if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
			return "", err
		}
	}
	return key, st.AddOperatorKey(ctx, key)
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}
