package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"

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
	cache := fs.String("cache-dir", defaultCacheDir(), "directory of the compiled-module cache")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	pprofAddr := fs.String("pprof", "", "serve Go's profiler on this address (e.g. 127.0.0.1:6060)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *servers == "" {
		return errors.New("worker: --server URL is required")
	}
	log := newLogger(*logLevel)
	servePprof(*pprofAddr, log)
	r, err := headless.New(ctx, headless.Config{CacheDir: *cache, Logger: log})
	if err != nil {
		return err
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
	w := wasmworker.New(wasmworker.Config{Servers: urls, Slots: *slots, Queue: *queue, Kind: protocol.KindHeadless, Runner: r, Logger: log, Device: headlessDevice})
	return w.Run(ctx)
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
