package main

import (
	"context"
	"flag"
	"os"
	"strings"

	"github.com/cyclepool/cyclepool/internal/bench"
)

// runBench measures the platform on this machine and prints `name: value`
// lines (docs/BENCHMARKS.md).
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	cfg := bench.Config{Out: os.Stdout}
	fs.StringVar(&cfg.Repo, "repo", ".", "repository root (for bin/tasks and tasks/ sources)")
	fs.IntVar(&cfg.Tasks, "tasks", 20000, "no-op tasks in the throughput run")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "throughput runs; dispatch_tasks_per_s is their median")
	fs.IntVar(&cfg.Conns, "conns", 5000, "idle worker connections")
	fs.IntVar(&cfg.Singles, "singles", 300, "one-at-a-time tasks for the latency figures")
	fs.IntVar(&cfg.Slots, "slots", 16, "slots per worker process")
	fs.IntVar(&cfg.Workers, "workers", 2, "worker processes")
	fs.IntVar(&cfg.Queue, "queue", 64, "tasks each worker accepts ahead of time")
	fs.IntVar(&cfg.BrowserTasks, "browser-tasks", 10000, "no-op tasks in the browser throughput run")
	fs.StringVar(&cfg.Chromium, "chromium", bench.DefaultChromium, "the Chromium the browser part drives")
	fs.IntVar(&cfg.ChurnTasks, "churn-tasks", 0, "counter tasks (about 1 s each) in the churn soak (default: 32 per CPU)")
	fs.IntVar(&cfg.HostileTasks, "hostile-tasks", 2000, "counter tasks in the hostile part's honest workflow")
	fs.IntVar(&cfg.HostileTaskMS, "hostile-task-ms", 10, "busy milliseconds of each task of the hostile part")
	only := fs.String("only", "", "comma-separated parts to run: single, dispatch, churn, conns, wasm, browser, hostile")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	return bench.Run(ctx, cfg)
}
