package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/cyclepool/cyclepool/internal/chromium"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
	"github.com/cyclepool/cyclepool/wasmworker/headless"
)

// DefaultChromium is Debian's Chromium, which the browser part drives.
const DefaultChromium = chromium.Path

// browserPage is one headless Chromium with the volunteer page open and
// computing (no headless worker is connected meanwhile).
type browserPage struct {
	ctx    context.Context
	cancel func()
}

// pageTrace is window.cyclepool.status.trace (wasmworker/browser: pathTrace).
type pageTrace struct {
	N           int     `json:"n"`
	Prepare     float64 `json:"prepare"`
	ToTask      float64 `json:"toTask"`
	Instantiate float64 `json:"instantiate"`
	Run         float64 `json:"run"`
	Collect     float64 `json:"collect"`
	Back        float64 `json:"back"`
	Return      float64 `json:"return"`
	LastRun     float64 `json:"lastRun"`
	FromSocket  float64 `json:"fromSocket"`
	ToSocket    float64 `json:"toSocket"`
	Send        float64 `json:"send"`
	Sent        int     `json:"sent"` // results that ToSocket and Send cover
}

type pageStatus struct {
	Connected bool      `json:"connected"`
	Done      int       `json:"done"`
	Failed    int       `json:"failed"`
	Trace     pageTrace `json:"trace"`
}

// openBrowser starts Chromium, gives the page `threads` threads with no
// pause conditions, and starts computing.
func (b *bench) openBrowser(ctx context.Context, threads int) (*browserPage, error) {
	exe := b.cfg.Chromium
	if exe == "" {
		exe = DefaultChromium
	}
	if _, err := os.Stat(exe); err != nil {
		return nil, fmt.Errorf("chromium: %w", err)
	}
	opts := append(chromium.Options(exe), chromedp.UserDataDir(filepath.Join(b.tmp, "chromium")))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	cctx, cancel := chromedp.NewContext(actx)
	p := &browserPage{ctx: cctx, cancel: func() { cancel(); cancelAlloc() }}
	settings, _ := json.Marshal(map[string]any{"threads": threads, "share": 100, "charging": false, "floor": 0,
		"metered": false, "hidden": false})
	err := chromedp.Do(cctx,
		chromedp.Navigate(b.url+"/"),
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`localStorage.setItem("cyclepool.settings", %q)`, settings)),
		chromedp.Navigate(b.url+"/?autostart=1"))
	if err == nil {
		err = p.waitFor(30*time.Second, func(s pageStatus) bool { return s.Connected })
	}
	if c := chromedp.FromContext(cctx); c != nil && c.Browser != nil && c.Browser.Process() != nil {
		b.browserPID = c.Browser.Process().Pid
	}
	if err != nil {
		p.cancel()
		return nil, fmt.Errorf("open the volunteer page: %w", err)
	}
	return p, nil
}

func (p *browserPage) status() (pageStatus, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](`window.cyclepool.status`))
	var s pageStatus
	if err == nil && string(raw) != "null" {
		err = json.Unmarshal(raw, &s)
	}
	return s, err
}

func (p *browserPage) waitFor(limit time.Duration, cond func(pageStatus) bool) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if s, err := p.status(); err == nil && cond(s) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("timed out waiting for the page")
}

// browser runs the browser figures: single-task latency and where its time
// goes, throughput, and the prime counter in Chromium against wazero.
func (b *bench) browser(ctx context.Context) error {
	p, err := b.openBrowser(ctx, 2)
	if err != nil {
		return err
	}
	defer p.cancel()
	if err := b.browserSingle(ctx, p); err != nil {
		b.printf("browser_single_task_ms: error: %v", err)
	}
	if err := b.browserThroughput(ctx, p); err != nil {
		b.printf("browser_tasks_per_s: error: %v", err)
	}
	if err := b.browserVsWazero(ctx, p); err != nil {
		b.printf("browser_vs_wazero: error: %v", err)
	}
	// What the page costs once it has settled, waiting for work: a
	// volunteer's tab open with nothing to do.
	time.Sleep(3 * time.Second)
	idle0, idleStart := b.cpuNow(), time.Now()
	time.Sleep(10 * time.Second) // CPU time comes in ticks of 10 ms
	idle := b.cpuNow().sub(idle0)
	b.printf("browser_idle_settled_chromium_cpu_ms_per_s: %.1f", float64(idle.browser.Microseconds())/1000/time.Since(idleStart).Seconds())
	return nil
}

// browserSingle: one no-op task at a time through the page, submission to
// durable result; then where the median task's time went.
func (b *bench) browserSingle(ctx context.Context, p *browserPage) error {
	// What the page costs while it waits for work (its timers, heartbeats,
	// status reports), in CPU ms per second.
	idle0, idleStart := b.cpuNow(), time.Now()
	time.Sleep(2 * time.Second)
	idle, idleTook := b.cpuNow().sub(idle0), time.Since(idleStart)
	b.printf("browser_idle_chromium_cpu_ms_per_s: %.1f", float64(idle.browser.Microseconds())/1000/idleTook.Seconds())

	wf := b.workflowJSON("browser-single", 1)
	var lat []time.Duration
	var ids []string
	var before pageStatus
	var cpu0 cpuShare
	var threads0 map[int]threadStat
	var began time.Time
	for i := range b.cfg.Singles + 20 {
		if i == 20 { // after the warm-up
			s, err := p.status()
			if err != nil {
				return err
			}
			before = s
			cpu0, threads0, began = b.cpuNow(), threadCPU(b.browserPID), time.Now()
		}
		start := time.Now()
		id, err := b.submitAndWait(ctx, wf)
		if err != nil {
			return err
		}
		if i >= 20 {
			lat = append(lat, time.Since(start))
			ids = append(ids, id)
		}
	}
	cpu, threads, took := b.cpuNow().sub(cpu0), threadCPU(b.browserPID), time.Since(began)
	b.printf("browser_single_task_ms_p50: %.2f", ms(percentile(lat, 50)))
	b.printf("browser_single_task_ms_p99: %.2f", ms(percentile(lat, 99)))
	b.printCPU("browser_single", cpu, len(lat), took)
	b.printThreads("browser_single", cpu, threads0, threads, len(lat))

	// The server's side, by the database's clock (medians): ready to
	// claimed, claimed to the start of the completion's commit.
	var r2c, c2r float64
	err := b.db.QueryRow(ctx, `SELECT
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - (t.sort_key + interval '5 minutes'))),
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.ended_at - a.started_at))
		FROM tasks t JOIN attempts a ON a.task_id = t.id WHERE t.workflow_id = ANY($1::uuid[])`, ids).Scan(&r2c, &c2r)
	if err != nil {
		return err
	}
	b.printf("browser_single_ready_to_claim_ms_p50: %.2f", r2c*1000)
	b.printf("browser_single_claim_to_result_ms_p50: %.2f", c2r*1000)
	// Inside the browser (means over the same tasks; the page reports a
	// few times a second, so wait for its last report).
	time.Sleep(400 * time.Millisecond)
	after, err := p.status()
	if err != nil {
		return err
	}
	n := float64(after.Trace.N - before.Trace.N)
	if n <= 0 {
		return errors.New("the page traced no task")
	}
	a, z := after.Trace, before.Trace
	for _, seg := range []struct {
		name string
		v    float64
	}{{"prepare", a.Prepare - z.Prepare}, {"to_task_worker", a.ToTask - z.ToTask}, {"instantiate", a.Instantiate - z.Instantiate},
		{"run", a.Run - z.Run}, {"collect", a.Collect - z.Collect}, {"back", a.Back - z.Back}, {"return", a.Return - z.Return}} {
		b.printf("browser_path_ms_%s: %.3f", seg.name, seg.v/n)
	}
	b.printf("browser_path_ms_from_socket: %.3f", (a.FromSocket-z.FromSocket)/n)
	if sent := float64(a.Sent - z.Sent); sent > 0 {
		b.printf("browser_path_ms_to_socket: %.3f", (a.ToSocket-z.ToSocket)/sent)
		b.printf("browser_path_ms_socket_send: %.3f", (a.Send-z.Send)/sent)
	}
	return nil
}

// browserThroughput: cfg.BrowserTasks no-op tasks at once, completed
// durably by the one page.
func (b *bench) browserThroughput(ctx context.Context, p *browserPage) error {
	wf := b.workflowJSON("browser-dispatch", b.cfg.BrowserTasks)
	batches0, cpu0 := b.batchStats(ctx), b.cpuNow()
	threads0 := threadCPU(b.browserPID)
	start := time.Now()
	s, err := b.client.Submit(ctx, wf)
	if err != nil {
		return err
	}
	if err := b.waitDone(ctx, s.ID, 10*time.Minute); err != nil {
		return err
	}
	took := time.Since(start)
	cpu, threads := b.cpuNow().sub(cpu0), threadCPU(b.browserPID)
	b.printf("browser_tasks_per_s: %.0f", float64(b.cfg.BrowserTasks)/took.Seconds())
	b.printf("browser_dispatch_total_s: %.2f", took.Seconds())
	b.printCPU("browser_dispatch", cpu, b.cfg.BrowserTasks, took)
	b.printThreads("browser_dispatch", cpu, threads0, threads, b.cfg.BrowserTasks)
	b.printBatches("browser_dispatch", batches0, b.batchStats(ctx))
	return nil
}

// browserVsWazero: the prime counter's run time in Chromium over its run
// time in wazero; and what one WASI call costs in each, from the clocks
// task (a million clock_time_get calls, less a run of none).
func (b *bench) browserVsWazero(ctx context.Context, p *browserPage) error {
	inBrowser, inWazero, err := b.runBoth(ctx, p, "primes", "0", "3000000")
	if err != nil {
		return err
	}
	b.printf("primes_chromium_ms: %.0f", ms(inBrowser))
	b.printf("primes_wazero_ms: %.0f", ms(inWazero))
	b.printf("browser_vs_wazero: %.2f", float64(inBrowser)/float64(inWazero))
	const calls = 1_000_000
	callsB, callsW, err := b.runBoth(ctx, p, "clocks", strconv.Itoa(calls))
	if err != nil {
		return err
	}
	noneB, noneW, err := b.runBoth(ctx, p, "clocks", "0")
	if err != nil {
		return err
	}
	perCall := func(d, none time.Duration) float64 { return float64(max(d-none, 0).Nanoseconds()) / calls }
	b.printf("wasi_call_ns_chromium: %.1f", perCall(callsB, noneB))
	b.printf("wasi_call_ns_wazero: %.1f", perCall(callsW, noneW))
	return nil
}

// runBoth runs the task module bin/tasks/<name>.wasm with args in the
// browser page (as a workflow: the page's own measure of the run) and in a
// headless runner, and returns the best run of each after a warm-up run.
func (b *bench) runBoth(ctx context.Context, p *browserPage, name string, args ...string) (inBrowser, inWazero time.Duration, err error) {
	wasm, err := os.ReadFile(filepath.Join(b.cfg.Repo, "bin", "tasks", name+".wasm"))
	if err != nil {
		return 0, 0, fmt.Errorf("%w (run make tasks)", err)
	}
	mod, err := b.client.PushModule(ctx, wasm)
	if err != nil {
		return 0, 0, err
	}
	wf, _ := json.Marshal(map[string]any{"name": "browser-" + name, "tasks": []map[string]any{
		{"name": name, "module": mod.ID, "args": args}}})
	for i := range 4 {
		s, err := b.client.Submit(ctx, wf)
		if err != nil {
			return 0, 0, err
		}
		if err := b.waitDone(ctx, s.ID, 2*time.Minute); err != nil {
			return 0, 0, err
		}
		time.Sleep(400 * time.Millisecond)
		st, err := p.status()
		if err != nil {
			return 0, 0, err
		}
		d := time.Duration(st.Trace.LastRun * float64(time.Millisecond))
		if i == 1 || (i > 1 && d < inBrowser) { // the first run compiles and warms up
			inBrowser = d
		}
	}
	r, err := headless.New(ctx, headless.Config{CacheDir: filepath.Join(b.tmp, "wcache-browser")})
	if err != nil {
		return 0, 0, err
	}
	defer r.Close(ctx)
	sum := sha256.Sum256(wasm)
	id := "sha256:" + hex.EncodeToString(sum[:])
	for i := range 4 {
		job := &wasmworker.Job{ModuleID: id, Host: nopHost{},
			Assign: &protocol.Assign{Attempt: int64(i + 1), Module: id, Args: args},
			Fetch:  func(context.Context) ([]byte, error) { return wasm, nil }}
		start := time.Now()
		out := r.Run(ctx, job)
		if out.Reason != "" {
			return 0, 0, fmt.Errorf("%s: %s: %s", name, out.Reason, out.Message)
		}
		if d := time.Since(start); i == 1 || (i > 1 && d < inWazero) {
			inWazero = d
		}
	}
	return inBrowser, inWazero, nil
}

// printThreads prints, per task, the CPU time of Chromium's threads by
// name, those that took at least a twentieth of Chromium's time; the Web
// Workers' threads share one name, so the busiest three of them also go
// one by one (the Go worker's and the two task Web Workers', most likely).
func (b *bench) printThreads(part string, cpu cpuShare, threads0, threads map[int]threadStat, tasks int) {
	byName := map[string]time.Duration{}
	var workers []time.Duration
	for tid, t := range threads {
		d := t.cpu - threads0[tid].cpu
		byName[t.name] += d
		if strings.HasPrefix(t.name, "DedicatedWorker") {
			workers = append(workers, d)
		}
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	sort.Strings(names)
	key := func(name string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return '_'
		}, strings.ToLower(name))
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(tasks) }
	for _, name := range names {
		if d := byName[name]; d > 0 && d*20 >= cpu.browser {
			b.printf("%s_cpu_us_per_task_chromium_thread_%s: %.0f", part, key(name), per(d))
		}
	}
	sort.Slice(workers, func(i, j int) bool { return workers[i] > workers[j] })
	for i, d := range workers[:min(3, len(workers))] {
		b.printf("%s_cpu_us_per_task_chromium_web_worker_%d: %.0f", part, i+1, per(d))
	}
}
