// Package bench measures cyclepool on this machine (`cyclepool-bench`, `make
// bench`): it starts the embedded PostgreSQL, a server process and headless
// worker processes, drives them through the real API and WebSockets, and
// prints one `name: value` line per figure. It reports numbers and passes or
// fails nothing, but for the hostile part, which fails the run when a task
// of its honest workflow did not end done under attack.
package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cyclepool/cyclepool/internal/store"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/pgembed"
)

// Config configures a run.
type Config struct {
	Repo    string    // repository root: bin/tasks/*.wasm and tasks/ sources
	Out     io.Writer // where the figures go
	Tasks   int       // tasks in the throughput run (default 20,000)
	Rounds  int       // measured throughput runs, of Tasks each (default 3)
	Conns   int       // idle worker connections (default 5,000)
	Singles int       // one-at-a-time tasks for latency (default 300)
	Slots   int       // worker slots per worker process (default 16)
	Workers int       // worker processes (default 2)
	Queue   int       // attempts each worker accepts ahead of time
	Only    []string  // run only these parts: single, dispatch, river, data, churn, conns, wasm, browser, hostile, scale
	// ScaleConns is the number of volunteers the scale part connects
	// (default 36,000), over three replicas and several swarm processes.
	ScaleConns int
	// ChurnTasks is the number of counter tasks in the churn soak
	// (default 32 per CPU).
	ChurnTasks int
	// BrowserTasks is the number of no-op tasks in the browser throughput
	// run (default 10,000); Chromium is the browser (default DefaultChromium).
	BrowserTasks int
	Chromium     string
	// HostileTasks is the number of counter tasks of the hostile part's
	// honest workflow (default 2,000), HostileTaskMS the busy time of each
	// (default 10 ms).
	HostileTasks  int
	HostileTaskMS int
	Logger        *slog.Logger
	Executable    string // the cyclepool binary (default: Repo/bin/cyclepool)
}

// noopModule is the smallest WASI command: it exports a memory and an empty
// _start. It measures the platform, not the task.
var noopModule = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
	0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type () -> ()
	0x03, 0x02, 0x01, 0x00, // one function of type 0
	0x05, 0x03, 0x01, 0x00, 0x01, // one memory, min 1 page
	0x07, 0x13, 0x02, // two exports
	0x06, 'm', 'e', 'm', 'o', 'r', 'y', 0x02, 0x00,
	0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00,
	0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b, // code: empty body
}

// Run runs the benchmark and prints its figures.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Tasks <= 0 {
		cfg.Tasks = 20000
	}
	if cfg.Conns <= 0 {
		cfg.Conns = 5000
	}
	if cfg.Singles <= 0 {
		cfg.Singles = 300
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 16
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 4 * cfg.Slots
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.BrowserTasks <= 0 {
		cfg.BrowserTasks = 10000
	}
	if cfg.ChurnTasks <= 0 {
		cfg.ChurnTasks = 32 * runtime.NumCPU()
	}
	if cfg.ScaleConns <= 0 {
		cfg.ScaleConns = 36000
	}
	if cfg.HostileTasks <= 0 {
		cfg.HostileTasks = 2000
	}
	if cfg.HostileTaskMS <= 0 {
		cfg.HostileTaskMS = 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if cfg.Executable == "" {
		cfg.Executable = filepath.Join(cfg.Repo, "bin", "cyclepool")
	}
	if exe, err := filepath.Abs(cfg.Executable); err == nil {
		cfg.Executable = exe
	}
	want := func(part string) bool { return len(cfg.Only) == 0 || slices.Contains(cfg.Only, part) }
	b := &bench{cfg: cfg, out: cfg.Out}
	tmp, err := os.MkdirTemp("", "cpb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b.tmp = tmp

	if want("wasm") {
		if err := b.wasmVsNative(ctx); err != nil {
			b.printf("wasm_vs_native: error: %v", err)
		}
	}
	if !want("single") && !want("dispatch") && !want("churn") && !want("conns") && !want("browser") && !want("hostile") && !want("data") && !want("scale") && !want("river") {
		return nil
	}
	// The embedded default, durable as in production.
	pgcfg := pgembed.Config{Dir: filepath.Join(tmp, "pg")}
	if os.Getenv(statementsEnv) != "" {
		pgcfg.Settings = statementsSettings
	}
	cl, err := pgembed.Start(ctx, pgcfg)
	if err != nil {
		return err
	}
	defer cl.Stop(context.Background())
	b.db, err = pgxpool.New(ctx, cl.URL())
	if err != nil {
		return err
	}
	defer b.db.Close()
	if err := b.startServer(ctx, cl.URL()); err != nil {
		return err
	}
	defer func() { b.server.stop() }() // the last server: parts may start a fresh one
	mod, err := b.client.PushModule(ctx, noopModule)
	if err != nil {
		return fmt.Errorf("push the no-op module: %w", err)
	}
	b.noop = mod.ID
	if want("single") || want("dispatch") {
		for i := range cfg.Workers {
			w, err := b.startWorker(ctx, fmt.Sprintf("worker-%d", i), cfg.Slots)
			if err != nil {
				return err
			}
			defer w.stop()
		}
		if err := b.waitWorkers(ctx, cfg.Workers); err != nil {
			return err
		}
	}
	if want("single") {
		if err := b.single(ctx); err != nil {
			b.printf("single_task_ms: error: %v", err)
		}
	}
	if want("dispatch") {
		if err := b.dispatch(ctx); err != nil {
			b.printf("dispatch_tasks_per_s: error: %v", err)
		}
	}
	if want("river") { // after dispatch, so that the two are measured in the same minutes
		if err := b.river(ctx, cl.URL()); err != nil {
			b.printf("river_jobs_per_s: error: %v", err)
		}
	}
	if want("data") {
		if err := b.data(ctx); err != nil {
			b.printf("blob_download_mib_per_s: error: %v", err)
		}
	}
	if want("churn") {
		for _, w := range b.workers { // the churn part starts its own
			w.stop()
		}
		if err := b.churn(ctx); err != nil {
			b.printf("churn: error: %v", err)
		}
	}
	if want("conns") {
		for _, w := range b.workers {
			w.stop()
		}
		if err := b.freshServer(ctx, cl.URL()); err != nil {
			return err
		}
		if err := b.idleConns(ctx); err != nil {
			b.printf("idle_worker_conn_kib: error: %v", err)
		}
	}
	if want("browser") {
		for _, w := range b.workers { // the page alone computes
			w.stop()
		}
		if err := b.browser(ctx); err != nil {
			b.printf("browser: error: %v", err)
		}
	}
	if want("scale") {
		for _, w := range b.workers { // the scale part starts its own
			w.stop()
		}
		b.workers = nil
		if err := b.scale(ctx, cl.URL()); err != nil {
			b.printf("scale: error: %v", err)
		}
	}
	if want("hostile") { // last: it leaves the hostile workers' traces behind
		for _, w := range b.workers { // the hostile part starts its own
			w.stop()
		}
		if err := b.freshServer(ctx, cl.URL()); err != nil {
			return err
		}
		if err := b.hostile(ctx); err != nil {
			b.printf("hostile: error: %v", err)
			return fmt.Errorf("hostile: %w", err)
		}
	}
	return nil
}

type bench struct {
	cfg     Config
	out     io.Writer
	tmp     string
	db      *pgxpool.Pool
	server  *process
	workers []*process
	url     string
	client  *client.Client
	// ownerToken is the owner's token, which client holds.
	ownerToken string
	noop       string
	// dispatchRate is dispatch_tasks_per_s once the dispatch part ran, for
	// the river part's ratio.
	dispatchRate float64
	// browserPID is the Chromium of the browser part, once started.
	browserPID int
}

func (b *bench) printf(format string, args ...any) {
	fmt.Fprintf(b.out, format+"\n", args...)
}

// process is a child cyclepool process.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// kill ends the process with SIGKILL, as a volunteer's machine that
// vanishes would (the worker's slot processes die with it), and waits for
// it to exit.
func (p *process) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (b *bench) spawn(args []string, lines func(string)) (*process, error) {
	cmd := exec.Command(b.cfg.Executable, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if lines != nil {
				lines(sc.Text())
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// freshServer replaces the server process with a new one on the same
// database (and data directory: the same owner token and operator key),
// for the parts that measure the server's memory: a Go process keeps the
// heap earlier parts grew: measured into it, idle connections read 9 KiB
// each instead of 25, and the hostile part's baseline peaked at 511 MiB
// (the earlier parts' heap) instead of 136.
func (b *bench) freshServer(ctx context.Context, db string) error {
	b.server.stop()
	return b.startServer(ctx, db)
}

var tokenRE = regexp.MustCompile(`CYCLEPOOL_TOKEN=(\S+)`)

func (b *bench) startServer(ctx context.Context, db string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	b.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	tok := make(chan string, 1)
	// The database runs on this machine, as serve's embedded one would:
	// the server gets the CPUs it would get with it (serve --procs).
	args := []string{"serve", "--addr", fmt.Sprintf("127.0.0.1:%d", port), "--database-url", db,
		"--data-dir", filepath.Join(b.tmp, "srv"), "--log-level", "warn", "--procs", strconv.Itoa(max(1, runtime.NumCPU()/2))}
	if addr := os.Getenv("CYCLEPOOL_BENCH_PPROF"); addr != "" {
		args = append(args, "--pprof", addr) // to profile the server under the benchmark's load
	}
	b.server, err = b.spawn(args, func(s string) {
		if m := tokenRE.FindStringSubmatch(s); m != nil {
			tok <- m[1]
		}
	})
	if err != nil {
		return err
	}
	select {
	case t := <-tok:
		b.client, b.ownerToken = client.New(b.url, t), t
		return nil
	case <-b.server.done:
		return errors.New("the server exited at start")
	case <-time.After(60 * time.Second):
		return errors.New("the server did not start within a minute")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *bench) startWorker(ctx context.Context, name string, slots int) (*process, error) {
	return b.startWorkerArgs(name, "--slots", strconv.Itoa(slots), "--queue", strconv.Itoa(b.cfg.Queue))
}

// startWorkerArgs starts a headless worker process of the server with
// these flags besides the server, the shared module cache, the log level
// and the server's operator key: the benchmark's workers are the
// operator's own machines, not bound by the new identities an address may
// make (the churn part makes one every few seconds).
func (b *bench) startWorkerArgs(name string, flags ...string) (*process, error) {
	args := append([]string{"worker", "--server", b.url, "--cache-dir", filepath.Join(b.tmp, "cache"), "--log-level", "warn",
		"--key-file", filepath.Join(b.tmp, "srv", "worker.key")}, flags...)
	if addr := os.Getenv("CYCLEPOOL_BENCH_WORKER_PPROF"); addr != "" {
		// host:port of the first worker's profiler; the next workers take
		// the next ports.
		if host, port, err := net.SplitHostPort(addr); err == nil {
			if n, err := strconv.Atoi(port); err == nil {
				args = append(args, "--pprof", net.JoinHostPort(host, strconv.Itoa(n+len(b.workers))))
			}
		}
	}
	p, err := b.spawn(args, nil)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	b.workers = append(b.workers, p)
	return p, nil
}

func (b *bench) waitWorkers(ctx context.Context, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var got int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FROM workers WHERE connected`).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("workers did not connect")
}

// waitDone waits for the end of a workflow, up to limit: it listens for
// the notification the database sends when the transaction that finished
// the workflow commits (store.ChannelFinished), so the time measured ends
// at the durable completion, without polling (which costs the machine CPU
// that the platform under measurement needs) and without reading the status
// of every task.
func (b *bench) waitDone(ctx context.Context, id string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	conn, err := b.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+store.ChannelFinished); err != nil {
		return err
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "UNLISTEN *"); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		var state string
		if err := conn.QueryRow(ctx, `SELECT state FROM workflows WHERE id = $1`, id).Scan(&state); err != nil {
			return err
		}
		switch state {
		case "done":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("workflow %s ended %s", id, state)
		}
		for {
			n, err := conn.Conn().WaitForNotification(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("workflow %s not done after %v", id, limit)
				}
				return err
			}
			if n.Payload == id {
				break
			}
		}
	}
}

// waitResult waits for a workflow's result as its owner would: one
// long-polling status request, answered when the server hears that the
// workflow ended.
func (b *bench) waitResult(ctx context.Context, id string) error {
	st, err := b.client.StatusWhenFinished(ctx, id, 30*time.Second)
	if err != nil {
		return err
	}
	if st.State != "done" {
		return fmt.Errorf("workflow %s is %s, not done", id, st.State)
	}
	return nil
}

func (b *bench) workflowJSON(name string, n int) []byte {
	type task struct {
		Name   string `json:"name"`
		Module string `json:"module"`
	}
	tasks := make([]task, n)
	for i := range tasks {
		tasks[i] = task{Name: fmt.Sprintf("t%d", i), Module: b.noop}
	}
	data, _ := json.Marshal(map[string]any{"name": name, "priority": "interactive", "tasks": tasks})
	return data
}

// single submits one no-op task at a time and measures submission to
// durable result, and (from the database's clock) ready to running.
func (b *bench) single(ctx context.Context) error {
	var lat []time.Duration
	var ids []string
	wf := b.workflowJSON("single", 1)
	var cpu0 cpuShare
	var began time.Time
	var batches0 map[string][3]float64
	for i := range b.cfg.Singles + 20 {
		if i == 20 {
			b.resetStatements(ctx)
			batches0 = b.batchStats(ctx)
			cpu0, began = b.cpuNow(), time.Now()
		}
		start := time.Now()
		id, err := b.submitAndWait(ctx, wf)
		if err != nil {
			return err
		}
		if i >= 20 { // warm-up
			lat = append(lat, time.Since(start))
			ids = append(ids, id)
		}
	}
	cpu, wall := b.cpuNow().sub(cpu0), time.Since(began)
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	b.printf("single_task_ms_p50: %.2f", ms(p50))
	b.printf("single_task_ms_p99: %.2f", ms(p99))
	// Where a single task's time goes, by the database's clock (medians):
	// claimed to the start of its completion's transaction (worker round
	// trip: assign frame, run, result frame, completion queue).
	var worker float64
	err := b.db.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.ended_at - a.started_at))
		FROM tasks t JOIN attempts a ON a.task_id = t.id WHERE t.workflow_id = ANY($1::uuid[])`, ids).Scan(&worker)
	if err != nil {
		return err
	}
	b.printf("single_task_claim_to_result_p50_ms: %.2f", worker*1000)
	b.printCPU("single", cpu, len(lat), wall)
	// The submission's transaction (with its claim) and the completion's,
	// as the server timed them: most of a lone task's time.
	b.printBatches("single", batches0, b.batchStats(ctx))
	b.printStatements(ctx, "single", len(lat))
	// The same in two requests, as before POST ?wait= (the owner's
	// long poll then comes while the task runs).
	var two []time.Duration
	for range max(b.cfg.Singles/2, 10) {
		start := time.Now()
		if _, err := b.submitThenWait(ctx, wf); err != nil {
			return err
		}
		two = append(two, time.Since(start))
	}
	b.printf("single_task_two_requests_ms_p50: %.2f", ms(percentile(two, 50)))
	return b.readyToRunning(ctx)
}

// submitAndWait submits a workflow and waits for its durable result as an
// interactive owner would: in one request (POST /api/v1/workflows?wait=).
func (b *bench) submitAndWait(ctx context.Context, wf []byte) (string, error) {
	st, err := b.client.SubmitAndWait(ctx, wf, 30*time.Second)
	if err != nil {
		return "", err
	}
	if st.State != "done" {
		return st.ID, fmt.Errorf("workflow %s is %s, not done", st.ID, st.State)
	}
	return st.ID, nil
}

// submitThenWait is submitAndWait in two requests: the submission, then
// the long poll (GET /api/v1/workflows/{id}?wait=).
func (b *bench) submitThenWait(ctx context.Context, wf []byte) (string, error) {
	s, err := b.client.Submit(ctx, wf)
	if err != nil {
		return "", err
	}
	return s.ID, b.waitResult(ctx, s.ID)
}

// readyToRunning measures, by the database's clock, how long a task that
// becomes ready waits for its attempt while idle workers wait: the second
// task of two-task chains submitted one at a time, made ready by the
// commit that completes the first, and claimed by a dispatcher's round.
// (A single task submitted to idle workers is claimed in the transaction
// that writes it: it is never ready for a dispatcher to see, and its wait
// would measure 0.)
func (b *bench) readyToRunning(ctx context.Context) error {
	wf, _ := json.Marshal(map[string]any{"name": "chain", "priority": "interactive", "tasks": []map[string]any{
		{"name": "a", "module": b.noop},
		{"name": "b", "module": b.noop, "inputs": map[string]any{"in": map[string]any{"from": "a"}}},
	}})
	var ids []string
	for i := range max(b.cfg.Singles/2, 10) + 10 {
		id, err := b.submitAndWait(ctx, wf)
		if err != nil {
			return err
		}
		if i >= 10 { // warm-up
			ids = append(ids, id)
		}
	}
	rows, err := b.db.Query(ctx, `SELECT extract(epoch FROM a.started_at - (t.sort_key + interval '5 minutes'))
		FROM tasks t JOIN attempts a ON a.task_id = t.id WHERE t.workflow_id = ANY($1::uuid[]) AND t.name = 'b'`, ids)
	if err != nil {
		return err
	}
	r2r, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (time.Duration, error) {
		var s float64
		err := r.Scan(&s)
		return time.Duration(s * float64(time.Second)), err
	})
	if err != nil {
		return err
	}
	b.printf("ready_to_running_p50_ms: %.2f", ms(percentile(r2r, 50)))
	b.printf("ready_to_running_p99_ms: %.2f", ms(percentile(r2r, 99)))
	return nil
}

// dispatch submits cfg.Tasks no-op tasks at once and measures submission to
// the durable completion of the last.
//
// A warm-up workflow runs first, so that every worker has started its slot
// processes (a worker starts them as its attempts first run side by side,
// and keeps them for later attempts; starting one costs tens of
// milliseconds of CPU, once per worker rather than per task).
func (b *bench) dispatch(ctx context.Context) error {
	warm := b.workflowJSON("warm-up", max(2000, 4*b.cfg.Workers*(b.cfg.Slots+b.cfg.Queue)))
	ws, err := b.client.Submit(ctx, warm)
	if err != nil {
		return err
	}
	if err := b.waitDone(ctx, ws.ID, 10*time.Minute); err != nil {
		return err
	}
	wf := b.workflowJSON("dispatch", b.cfg.Tasks)
	batches0 := b.batchStats(ctx)
	b.resetStatements(ctx)
	cpu0 := b.cpuNow()
	var rounds []dispatchRound
	var wall time.Duration
	for range b.cfg.Rounds {
		start := time.Now()
		s, err := b.client.Submit(ctx, wf)
		if err != nil {
			return err
		}
		submitted := time.Since(start)
		if err := b.waitDone(ctx, s.ID, 10*time.Minute); err != nil {
			return err
		}
		r := dispatchRound{id: s.ID, start: start, submitted: submitted, took: time.Since(start)}
		rounds = append(rounds, r)
		wall += r.took
	}
	cpu := b.cpuNow().sub(cpu0)
	perS := make([]string, len(rounds))
	for i, r := range rounds {
		perS[i] = fmt.Sprintf("%.0f", float64(b.cfg.Tasks)/r.took.Seconds())
	}
	// The median round: the middle one, or the slower of the two middle
	// ones for an even count.
	med := slices.Clone(rounds)
	slices.SortFunc(med, func(a, b dispatchRound) int { return cmp.Compare(a.took, b.took) })
	m := med[len(med)/2]
	b.dispatchRate = float64(b.cfg.Tasks) / m.took.Seconds()
	b.printf("dispatch_tasks_per_s: %.0f", b.dispatchRate)
	b.printf("dispatch_tasks_per_s_rounds: %s", strings.Join(perS, ","))
	b.printf("dispatch_submit_ms: %.0f", ms(m.submitted))
	b.printf("dispatch_total_s: %.2f", m.took.Seconds())
	b.printCPU("dispatch", cpu, b.cfg.Tasks*len(rounds), wall)
	b.printBatches("dispatch", batches0, b.batchStats(ctx))
	b.printStatements(ctx, "dispatch", b.cfg.Tasks*len(rounds))
	b.printTimeline(ctx, "dispatch", m.id, m.start) // after: not one of the run's statements
	return nil
}

// dispatchRound is one measured run of the dispatch part: a workflow of
// Config.Tasks no-op tasks, from the submission request (start) to its
// durable completion (took).
type dispatchRound struct {
	id              string
	start           time.Time
	submitted, took time.Duration
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[min(i, len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rssKiB reads a process's resident set size.
func rssKiB(pid int) (int64, error) { return procStatusKiB(pid, "VmRSS") }

// procStatusKiB reads one of the sizes in kB of /proc/PID/status (VmRSS,
// VmHWM, ...).
func procStatusKiB(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f, ok := strings.CutPrefix(line, field+":"); ok {
			if fs := strings.Fields(f); len(fs) > 0 {
				return strconv.ParseInt(fs[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
