// Command cyclepool-bench measures cyclepool on this machine and prints one
// `name: value` line per figure (docs/BENCHMARKS.md). It is a command of its
// own, not a subcommand of cyclepool, so that the binary every operator runs
// carries none of the benchmark's harness (chromedp among it). `make bench`
// builds and runs it; it drives the cyclepool binary that `make build`
// writes (bin/cyclepool), as processes, through the real API and
// WebSockets.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cyclepool/cyclepool/internal/bench"
	"github.com/cyclepool/cyclepool/wasmworker/headless"
)

func main() {
	headless.ServeSlotIfChild() // the wasm part's runner starts slot processes from this binary
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == bench.SwarmCommand { // a child of the scale part
		if err := bench.RunSwarm(ctx, os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "cyclepool-bench swarm:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "cyclepool-bench:", err)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cyclepool-bench", flag.ContinueOnError)
	cfg := bench.Config{Out: os.Stdout}
	fs.StringVar(&cfg.Repo, "repo", ".", "repository root (for bin/tasks and tasks/ sources)")
	fs.StringVar(&cfg.Executable, "cyclepool", "", "the cyclepool binary the benchmark runs as server and workers (default: REPO/bin/cyclepool)")
	fs.IntVar(&cfg.Tasks, "tasks", 20000, "no-op tasks in the throughput run")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "throughput runs; dispatch_tasks_per_s is their median")
	fs.IntVar(&cfg.Conns, "conns", 5000, "idle worker connections")
	fs.IntVar(&cfg.Singles, "singles", 300, "one-at-a-time tasks for the latency figures")
	fs.IntVar(&cfg.Slots, "slots", 16, "slots per worker process")
	fs.IntVar(&cfg.Workers, "workers", 2, "worker processes")
	fs.IntVar(&cfg.Queue, "queue", 64, "the workers' starting queue: attempts each accepts ahead of time (it adapts from there, up to 32 per slot)")
	fs.IntVar(&cfg.BrowserTasks, "browser-tasks", 10000, "no-op tasks in the browser throughput run")
	fs.StringVar(&cfg.Chromium, "chromium", bench.DefaultChromium, "the Chromium the browser part drives")
	fs.IntVar(&cfg.ChurnTasks, "churn-tasks", 0, "counter tasks (about 1 s each) in the churn soak (default: 32 per CPU)")
	fs.IntVar(&cfg.ScaleConns, "scale-conns", 36000, "volunteers the scale part connects, over three replicas")
	fs.IntVar(&cfg.HostileTasks, "hostile-tasks", 2000, "counter tasks in the hostile part's honest workflow")
	fs.IntVar(&cfg.HostileTaskMS, "hostile-task-ms", 10, "busy milliseconds of each task of the hostile part")
	only := fs.String("only", "", "comma-separated parts to run: single, dispatch, river, data, churn, conns, wasm, browser, hostile, scale")
	versus := fs.String("versus", "", "another cyclepool binary: run the parts for both builds alternately, --repeat times each, and print each figure's median per build")
	repeat := fs.Int("repeat", 3, "with --versus: runs of each build")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (flags only: cyclepool-bench -h)", fs.Args())
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	if cfg.Executable == "" {
		cfg.Executable = filepath.Join(cfg.Repo, "bin", "cyclepool")
	}
	if _, err := os.Stat(cfg.Executable); err != nil {
		return fmt.Errorf("the cyclepool binary to measure: %w (make build writes bin/cyclepool)", err)
	}
	if *versus != "" {
		if _, err := os.Stat(*versus); err != nil {
			return fmt.Errorf("the cyclepool binary to compare with: %w", err)
		}
		if *repeat < 1 {
			return fmt.Errorf("--repeat must be at least 1, got %d", *repeat)
		}
		return bench.Versus(ctx, cfg, *versus, *repeat)
	}
	return bench.Run(ctx, cfg)
}
