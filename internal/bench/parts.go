package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
	"github.com/cyclepool/cyclepool/wasmworker/headless"
)

// idleConns opens cfg.Conns worker connections that say hello and then only
// heartbeat, and reports the server's resident memory per connection.
func (b *bench) idleConns(ctx context.Context) error {
	pid := b.server.cmd.Process.Pid
	time.Sleep(time.Second)
	before, err := rssKiB(pid)
	if err != nil {
		return err
	}
	ws := "ws" + strings.TrimPrefix(b.url, "http") + "/ws/worker"
	hello, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{
		Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1, Device: protocol.Device{Paused: true, PausedBecause: "benchmark"}}})
	hb, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Running: []protocol.Progress{}}})
	// As the operator's own connections: a server bounds the new worker
	// identities one address makes, and every one of these comes from
	// this machine.
	key, err := os.ReadFile(filepath.Join(b.tmp, "srv", "worker.key"))
	if err != nil {
		return fmt.Errorf("read the server's operator key: %w", err)
	}
	opts := &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(key))}}}
	conns := make([]*websocket.Conn, b.cfg.Conns)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, _, err := websocket.Dial(cctx, ws, opts)
			if err == nil {
				err = c.Write(cctx, websocket.MessageText, hello)
			}
			if err == nil {
				_, _, err = c.Read(cctx)
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			conns[i] = c
			// Drain whatever the server sends, as a worker would.
			go func() {
				for {
					if _, _, err := c.Read(cctx); err != nil {
						return
					}
				}
			}()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("open connections: %w", firstErr)
	}
	// Heartbeat everyone for a few seconds so the server is in its steady
	// idle state, then measure.
	for range 4 {
		for _, c := range conns {
			_ = c.Write(cctx, websocket.MessageText, hb)
		}
		time.Sleep(time.Second)
	}
	after, err := rssKiB(pid)
	if err != nil {
		return err
	}
	b.printf("idle_worker_conn_kib: %.1f", float64(after-before)/float64(len(conns)))
	b.printf("idle_worker_conns: %d", len(conns))
	if os.Getenv("CYCLEPOOL_BENCH_PPROF") != "" {
		time.Sleep(30 * time.Second) // time to profile the server with its idle connections
	}
	for _, c := range conns {
		c.CloseNow()
	}
	return nil
}

// nopHost discards progress and accepts checkpoints.
type nopHost struct{}

func (nopHost) Progress(float64)                         {}
func (nopHost) Started()                                 {}
func (nopHost) Checkpoint(context.Context, []byte) error { return nil }

// wasmVsNative times the prime counter under wazero and natively.
func (b *bench) wasmVsNative(ctx context.Context) error {
	const lo, hi = "0", "3000000"
	wasm, err := os.ReadFile(filepath.Join(b.cfg.Repo, "bin", "tasks", "primes.wasm"))
	if err != nil {
		return fmt.Errorf("%w (run make tasks)", err)
	}
	native := filepath.Join(b.tmp, "primes-native")
	build := exec.CommandContext(ctx, "go", "build", "-o", native, "./tasks/primes")
	build.Dir = b.cfg.Repo
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build native primes: %v: %s", err, out)
	}
	r, err := headless.New(ctx, headless.Config{CacheDir: filepath.Join(b.tmp, "wcache")})
	if err != nil {
		return err
	}
	defer r.Close(ctx)
	sum := sha256.Sum256(wasm)
	id := "sha256:" + hex.EncodeToString(sum[:])
	run := func() (time.Duration, string, error) {
		job := &wasmworker.Job{ModuleID: id, Host: nopHost{},
			Assign: &protocol.Assign{Attempt: 1, Module: id, Args: []string{lo, hi}},
			Fetch:  func(context.Context) ([]byte, error) { return wasm, nil }}
		start := time.Now()
		out := r.Run(ctx, job)
		if out.Reason != "" {
			return 0, "", fmt.Errorf("%s: %s", out.Reason, out.Message)
		}
		return time.Since(start), string(out.Outputs[0].Data), nil
	}
	if _, _, err := run(); err != nil { // compile
		return err
	}
	best := func(f func() (time.Duration, string, error)) (time.Duration, string, error) {
		var min time.Duration
		var res string
		for i := range 3 {
			d, r, err := f()
			if err != nil {
				return 0, "", err
			}
			if i == 0 || d < min {
				min, res = d, r
			}
		}
		return min, res, nil
	}
	wd, wres, err := best(run)
	if err != nil {
		return err
	}
	nd, nres, err := best(func() (time.Duration, string, error) {
		start := time.Now()
		out, err := exec.CommandContext(ctx, native, lo, hi).Output()
		return time.Since(start), string(out), err
	})
	if err != nil {
		return err
	}
	if wres != nres {
		return fmt.Errorf("wasm and native disagree: %q vs %q", wres, nres)
	}
	b.printf("primes_wasm_ms: %.0f", ms(wd))
	b.printf("primes_native_ms: %.0f", ms(nd))
	b.printf("wasm_vs_native: %.2f", float64(wd)/float64(nd))
	return nil
}
