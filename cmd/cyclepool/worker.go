package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
	"github.com/cyclepool/cyclepool/wasmworker/headless"
)

// runWorker runs a headless worker: tasks run with wazero.
func runWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	servers := fs.String("server", os.Getenv("CYCLEPOOL_SERVER"), "server URL; several, comma-separated, for failover")
	slots := fs.Int("slots", runtime.NumCPU(), "tasks run at once")
	queue := fs.Int("queue", -1, "tasks accepted ahead of time, waiting for a free slot (default: as many as slots)")
	maxQueue := fs.Int("max-queue", -1, "longest queue: the queue grows from --queue up to this while tasks are short and small, "+
		"and shrinks to one per slot while they are long; no more than --queue keeps it fixed (default: 32 per slot, at most 1024)")
	gather := fs.Duration("gather", defaultGather, "how long a finished task's result may wait for others, to travel to the server "+
		"in one frame with them, while other tasks run or wait (0: never)")
	cache := fs.String("cache-dir", defaultCacheDir(), "directory of the compiled-module cache")
	cacheMiB := fs.Int64("cache-mib", headless.DefaultCompileCacheBytes>>20, "bound of the compiled-module cache in MiB, kept at start "+
		"(the modules read least recently go first; any unread for 30 days too)")
	dataDir := fs.String("data-dir", "", "directory of the data cache: the blobs tasks mount, kept for later tasks (default: the user's cache directory)")
	dataMiB := fs.Int64("data-cache-mib", headless.DefaultDataCacheBytes>>20, "bound of the data cache in MiB (blobs in use are never evicted)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	pprofAddr := fs.String("pprof", "", "serve Go's profiler on this address (e.g. 127.0.0.1:6060)")
	key := fs.String("key", os.Getenv("CYCLEPOOL_WORKER_KEY"), "operator key (the server's --data-dir/worker.key): this machine is "+
		"the operator's own, so its failures are verdicts; volunteers leave it empty")
	keyFile := fs.String("key-file", "", "read the operator key from this file")
	cpuShare := fs.Int("cpu-share", 100, "percentage of each slot's CPU time that tasks may use (10 to 100, Linux only): below 100 a task "+
		"computes for that share of every 100 ms and is stopped for the rest, as BOINC's \"use at most N% of CPU time\"")
	procs := fs.Int("procs", 0, "CPUs running the worker's own code at once (GOMAXPROCS; tasks run in separate slot processes); default: GOMAXPROCS if set, else max(1, CPUs/4)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	runtime.GOMAXPROCS(workerProcs(*procs, os.Getenv("GOMAXPROCS") != "", runtime.NumCPU()))
	if *servers == "" {
		return errors.New("worker: --server URL is required")
	}
	if err := checkCPUShare("worker: --cpu-share", *cpuShare); err != nil {
		return err
	}
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			return fmt.Errorf("worker: --key-file: %w", err)
		}
		*key = strings.TrimSpace(string(b))
	}
	log := newLogger(*logLevel)
	servePprof(*pprofAddr, log)
	r, err := headless.New(ctx, headless.Config{CacheDir: *cache, Logger: log, DataDir: *dataDir, DataCacheBytes: *dataMiB << 20,
		CacheBytes: *cacheMiB << 20, CPUShare: *cpuShare})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer r.Close(context.Background())
	var urls []string
	for _, u := range strings.Split(*servers, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if *queue < 0 {
		*queue = *slots
	}
	if *maxQueue < 0 {
		*maxQueue = protocol.QueueLimit(*slots)
	}
	w := newHeadlessWorker(urls, *slots, *queue, *maxQueue, max(*gather, 0), r, *key, log)
	// Run outlives ctx (SIGINT, SIGTERM) by the hand-back: the attempts the
	// worker holds go back to the server, which queues their tasks again at
	// once without using up an attempt, rather than when their leases
	// lapse.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	// A second signal ends the worker at once (its slot processes die with
	// it). Not serve's: it stops PostgreSQL after the first.
	signal.Reset(os.Interrupt, syscall.SIGTERM)
	log.Info("stopping: handing the attempts back")
	w.HandBack("the worker is shutting down", handBackWait)
	stop()
	return <-done
}

// newHeadlessWorker is a headless worker on servers: cyclepool worker, and
// serve's local worker.
func newHeadlessWorker(servers []string, slots, queue, maxQueue int, gather time.Duration, r wasmworker.Runner, key string,
	log *slog.Logger) *wasmworker.Worker {
	return wasmworker.New(wasmworker.Config{Servers: servers, Slots: slots, Queue: queue, MaxQueue: maxQueue, Gather: gather,
		Kind: protocol.KindHeadless, Runner: r, Key: key, Logger: log, Device: headlessDevice})
}

// handBackWait bounds how long a stopping worker waits for the server to
// acknowledge the attempts it hands back.
const handBackWait = 3 * time.Second

// defaultGather is how long a headless worker's outcome may wait for
// others while the worker has more to do (wasmworker.Config.Gather). In
// the dispatch benchmark (no-op tasks, two workers of 16 slots), 5 ms gave
// 16,500-16,900 tasks/s at 101-102 µs of CPU per task, 2 ms 15,000-15,700
// at 108-116, 1 ms 15,100-16,100 at 104-110, none 15,100-15,500 at
// 112-115: fewer result frames to write and read, and larger batches to
// commit. An outcome of a worker with nothing else to do goes at once.
const defaultGather = 5 * time.Millisecond

// workerProcs is the GOMAXPROCS of a headless worker process: flag when
// set, else the runtime's own when the environment sets GOMAXPROCS, else a
// quarter of the CPUs, at least one. The worker relays frames between the
// server and its slot processes, where the tasks run; with more Ps than it
// needs, a goroutine that wakes up on one P often has to wake another
// thread first (futex), which cost about a fifth of its CPU per task on 2
// cores in the dispatch benchmark. One P does the relaying of some 12,000
// short tasks per second.
func workerProcs(flag int, envSet bool, cpus int) int {
	return procs(flag, envSet, max(1, cpus/4))
}

// procs is a process's GOMAXPROCS: flag when set, else the runtime's own
// when the environment sets GOMAXPROCS, else def.
func procs(flag int, envSet bool, def int) int {
	switch {
	case flag > 0:
		return flag
	case envSet:
		return runtime.GOMAXPROCS(0)
	}
	return def
}

func defaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "cyclepool", "wazero")
	}
	return filepath.Join(os.TempDir(), "cyclepool-wazero")
}

// headlessDevice describes a server: always powered and online.
func headlessDevice() protocol.Device {
	return protocol.Device{Charging: protocol.Unknown, Connection: "wired", Online: "yes", Visibility: protocol.Unknown,
		SaveData: "no", Cores: runtime.NumCPU()}
}

// checkCPUShare reports a CPU share (--cpu-share, and serve's
// --local-worker-cpu-share) that is not a percentage from 10 to 100, named
// by flag.
func checkCPUShare(flag string, pct int) error {
	if pct < 10 || pct > 100 {
		return fmt.Errorf("%s %d is not a percentage from 10 to 100", flag, pct)
	}
	return nil
}
