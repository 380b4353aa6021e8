//go:build unix

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
)

const (
	charging    = `{level: 0.8, charging: true}`
	discharging = `{level: 0.8, charging: false}`
)

// openVolunteerPage opens the server's volunteer page with ?autostart=1 and
// waits for the browser worker to connect.
func openVolunteerPage(t *testing.T, b *browser, url string) {
	t.Helper()
	openVolunteerPageWith(t, b, url, "")
}

// openVolunteerPageWith is openVolunteerPage with query (name=value&...)
// added to the page's address.
func openVolunteerPageWith(t *testing.T, b *browser, url, query string) {
	t.Helper()
	u := url + "/?autostart=1"
	if query != "" {
		u += "&" + query
	}
	b.do(chromedp.Navigate(u))
	eventually(t, 30*time.Second, "the browser worker to connect", func() bool { return b.status().Connected })
}

// setShare sets the page's CPU share (percent) as a volunteer would, with
// its slider.
func setShare(t *testing.T, b *browser, pct int) {
	t.Helper()
	var share int
	b.eval(fmt.Sprintf(`(() => { const s = document.getElementById("share"); s.value = "%d"; s.dispatchEvent(new Event("change"));
		return window.cyclepool.settings.share; })()`, pct), &share)
	if share != pct {
		t.Fatalf("the page's share is %d after setting %d", share, pct)
	}
}

// setThreads sets how many tasks the page runs at once, as a volunteer
// would in its settings, and waits until its worker runs with them.
func setThreads(t *testing.T, b *browser, n int) {
	t.Helper()
	var threads int
	b.eval(fmt.Sprintf(`(() => { const s = document.getElementById("threads"); s.value = "%d"; s.dispatchEvent(new Event("change"));
		return window.cyclepool.settings.threads; })()`, n), &threads)
	if threads != n {
		t.Fatalf("the page's threads are %d after setting %d", threads, n)
	}
	eventually(t, 30*time.Second, "the page's worker to run with its new threads", func() bool {
		s := b.status()
		return s.Connected && s.Threads == n
	})
}

// The volunteer page computes a workflow in Chromium, and every output is
// byte-identical to a headless worker's (wazero) for the same tasks: stdin,
// /in, /out, argv, progress and checkpoints, and the deterministic clock
// and random numbers that echo's det.txt prints.
func TestBrowserMatchesHeadless(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	echo, primes := push(t, p.client, "echo"), push(t, p.client, "primes")
	wf := workflow("browser-vs-headless",
		task{"name": "count", "module": primes, "args": []string{"0", "2000000"}, "checkpoint_interval": "1s"},
		task{"name": "count-2", "module": primes, "args": []string{"300000", "400000"}},
		task{"name": "echo", "module": echo, "args": []string{"a b", "ünïcode"}, "stdin": map[string]any{"data": "from stdin\n"},
			"inputs": map[string]any{"z-count": map[string]any{"from": "count"}, "a-count": map[string]any{"from": "count-2"}}},
		task{"name": "echo-plain", "module": echo},
	)

	b := newBrowser(t, 360, 800, charging)
	started := time.Now()
	openVolunteerPage(t, b, p.srv.url)
	t.Logf("page open and worker connected in %v", time.Since(started))
	b.screenshot("volunteer-idle", 360, 800)

	id := submit(t, p.client, wf)
	st := wait(t, p.client, id, 90*time.Second)
	if st.State != "done" {
		t.Fatalf("workflow in the browser ended %s: %+v", st.State, st.Tasks)
	}
	eventually(t, 5*time.Second, "the page to count the tasks", func() bool { return b.status().Done >= len(st.Tasks) })
	b.screenshot("volunteer-working", 360, 800)
	b.screenshot("volunteer-working", 1280, 900)
	var text string
	b.eval(`document.getElementById("stat-done").textContent`, &text)
	if text == "0" {
		t.Errorf("the page shows no task done")
	}
	browserOut := map[string]string{}
	for _, tk := range st.Tasks {
		for _, name := range []string{"stdout", "args.txt", "det.txt"} {
			if tk.Name != "echo" && tk.Name != "echo-plain" && name != "stdout" {
				continue
			}
			browserOut[tk.Name+"/"+name] = output(t, p.client, id, tk.Name, name)
		}
	}
	// Stop the page: from now on only a headless worker computes.
	stopPage(t, b)

	startWorker(t, "headless", 2, p.srv.url)
	id2 := submit(t, p.client, wf) // same name and tasks: same seeds
	st2 := wait(t, p.client, id2, 90*time.Second)
	if st2.State != "done" {
		t.Fatalf("workflow on the headless worker ended %s", st2.State)
	}
	for key, want := range browserOut {
		task, name, _ := strings.Cut(key, "/")
		got := output(t, p.client, id2, task, name)
		if got != want {
			t.Errorf("%s differs:\nbrowser:  %q\nheadless: %q", key, want, got)
		}
	}
	if !strings.HasPrefix(browserOut["echo/det.txt"], "random ") || browserOut["echo/stdout"] == "" {
		t.Errorf("unexpected echo outputs: %q", browserOut)
	}
	t.Logf("echo det.txt in Chromium:\n%s", browserOut["echo/det.txt"])
}

// With "only while charging" (the default) and a discharging battery, the
// browser worker reports itself paused and the server gives it nothing.
func TestBrowserOnlyWhileCharging(t *testing.T) {
	t.Parallel()
	// Heartbeats 4 s apart: a worker on battery gets work once the server
	// holds three of its samples (the battery's trend).
	p := newPlatform(t, "--lease", "20s")
	noop := push(t, p.client, "noop")
	b := newBrowser(t, 360, 800, discharging)
	openVolunteerPage(t, b, p.srv.url)
	eventually(t, 10*time.Second, "the worker to pause", func() bool { return b.status().Paused })
	if why := b.status().PausedBecause; why != "not charging" {
		t.Errorf("paused because %q", why)
	}
	id := submit(t, p.client, workflow("not-on-battery", task{"name": "n", "module": noop}))
	time.Sleep(3 * time.Second)
	st, err := p.client.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Tasks[0].State != "ready" || st.Tasks[0].Attempts != 0 {
		t.Fatalf("a task was taken on battery: %+v", st.Tasks[0])
	}
	if s := b.status(); s.TaskWorkers.Started != 0 || s.Done+s.Failed+s.Cancelled != 0 {
		t.Fatalf("the page ran something: %+v", s)
	}
	var state string
	b.eval(`document.getElementById("state").textContent`, &state)
	if !strings.Contains(state, "not charging") {
		t.Errorf("the page says %q", state)
	}
	b.screenshot("volunteer-paused", 360, 800)

	// Allowing work on battery (unticking the box) lets the task through.
	b.do(chromedp.Click(chromedp.ID("charging")))
	if wait(t, p.client, id, 30*time.Second).State != "done" {
		t.Fatal("the task did not run once allowed")
	}
}

// A change of the volunteer's settings reaches the server at once, in a
// heartbeat sent on the change, not at the next tick: with a lease of 10
// minutes the ticks are 2 minutes apart, so within the test's waits (a
// minute at most) every heartbeat the server sees was sent out of turn.
// A busy machine may delay it by seconds, never by a tick.
func TestBrowserPauseReachesTheServerAtOnce(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "10m")
	b := newBrowser(t, 360, 800, discharging)
	openVolunteerPage(t, b, p.srv.url)
	eventually(t, 10*time.Second, "the worker to pause", func() bool { return b.status().Paused })
	conn, err := pgx.Connect(context.Background(), p.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	serverPaused := func(want bool) func() bool {
		return func() bool {
			var paused bool
			err := conn.QueryRow(context.Background(),
				`SELECT coalesce((device->>'paused')::bool, false) FROM workers WHERE connected LIMIT 1`).Scan(&paused)
			return err == nil && paused == want
		}
	}
	// Allowing work on battery resumes the worker, then forbidding it
	// again pauses it: the second change is what the server must see,
	// from a state it saw.
	b.do(chromedp.Click(chromedp.ID("charging")))
	eventually(t, 20*time.Second, "the server to see the worker resume", serverPaused(false))
	clicked := time.Now()
	b.do(chromedp.Click(chromedp.ID("charging")))
	eventually(t, 20*time.Second, "the server to see the pause", serverPaused(true))
	t.Logf("the server saw the pause %v after the click", time.Since(clicked).Round(time.Millisecond))
}

// A module is downloaded once per volunteer: a second visit, even with the
// HTTP cache cleared, takes it from IndexedDB and never asks the server.
// And once the page has started, it needs none of the server's static files
// to run a task: a task Web Worker is started from the copy of task.js the
// page fetched when it started, not from the server, which may be gone by
// then (the offline test cuts it off right after its first assignment).
func TestBrowserModuleCacheAcrossVisits(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	echo := push(t, p.client, "echo")
	proxy := newCountingProxy(t, p.srv.url) // the page's origin: it counts what reaches the server
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, proxy.url)
	proxy.refuse("/static/")
	id := submit(t, p.client, workflow("visit-1", task{"name": "e", "module": echo, "args": []string{"one"}}))
	if st := wait(t, p.client, id, 60*time.Second); st.State != "done" {
		t.Fatalf("first visit: workflow ended %s", st.State)
	}
	proxy.refuse("")
	if n := proxy.count("/modules/"); n != 1 {
		t.Fatalf("first visit: %d module requests, want 1", n)
	}
	eventually(t, 5*time.Second, "the page to count the fetch", func() bool { return b.status().Modules.Fetched == 1 })

	// The volunteer comes back another day: the HTTP cache is gone (it is
	// small on a phone), IndexedDB is not.
	b.do(chromedp.Navigate("about:blank"))
	if _, err := chromedp.Call(b.ctx, network.ClearBrowserCache, cdpEmpty); err != nil {
		t.Fatalf("clear the HTTP cache: %v", err)
	}
	openVolunteerPage(t, b, proxy.url)
	id = submit(t, p.client, workflow("visit-2", task{"name": "e", "module": echo, "args": []string{"two"}}))
	if st := wait(t, p.client, id, 60*time.Second); st.State != "done" {
		t.Fatalf("second visit: workflow ended %s", st.State)
	}
	if got := output(t, p.client, id, "e", "args.txt"); !strings.Contains(got, "two") {
		t.Errorf("second visit: args.txt %q", got)
	}
	eventually(t, 5*time.Second, "the page to count the cache hit", func() bool { return b.status().Modules.Cached == 1 })
	if n := proxy.count("/modules/"); n != 1 {
		t.Fatalf("second visit fetched the module again: %d module requests in all", n)
	}
	if s := b.status(); s.Modules.Fetched != 0 {
		t.Fatalf("second visit: %+v", s.Modules)
	}
}

// The page keeps computing when it loses its server (checkpoints made
// meanwhile do not block the task: the worker keeps the latest), and
// delivers the result when it reconnects; the attempt still holds its lease, so the
// result is accepted, once, and the task is not run again.
func TestBrowserOfflineDelivery(t *testing.T) {
	t.Parallel()
	db, data, port := migratedDB(t), t.TempDir(), freePort(t)
	srv := startServer(t, "server", db, data, port, "--lease", "30s")
	c := client.New(srv.url, srv.token)
	counter := push(t, c, "counter")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, srv.url)
	id := submit(t, c, workflow("offline", task{"name": "count", "module": counter, "args": []string{"30", "100"},
		"checkpoint_interval": "1s"}))
	eventually(t, 30*time.Second, "the task to run in the browser", func() bool { return len(b.status().Running) == 1 })

	// The network goes quiet first, as when a laptop leaves the Wi-Fi: the
	// frozen server acknowledges nothing, so the checkpoint the task makes
	// meanwhile waits for an ack that the end of the connection then loses.
	// The task must go on at once rather than wait for a reconnection.
	if err := syscall.Kill(-srv.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	srv.kill() // the connection is gone
	eventually(t, 10*time.Second, "the page to see it is disconnected", func() bool { return !b.status().Connected })
	// Not eventually: on a timeout, what the page last reported (the
	// task's progress, its task Web Workers) says where it stopped.
	for deadline := time.Now().Add(patience * 30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if s := b.status(); s.Done == 1 && !s.Connected {
			break
		}
		if time.Now().After(deadline) {
			st, _ := json.Marshal(b.status())
			t.Fatalf("the task did not finish offline; the page's last status: %s", st)
		}
	}
	// A task whose checkpoint is never answered goes on after 75 s, saying
	// so: the answer was lost, which is a bug even though the task ended.
	if logs := b.logs.String(); strings.Contains(logs, "no answer to a checkpoint") {
		t.Errorf("a checkpoint's answer was lost:\n%s", logs)
	}
	b.screenshot("volunteer-offline", 360, 800)

	srv = startServer(t, "server-again", db, data, port, "--lease", "30s")
	c = client.New(srv.url, srv.token)
	st := wait(t, c, id, 30*time.Second)
	if st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	if out := output(t, c, id, "count", "stdout"); out != "counted 30 from 0\n" {
		t.Errorf("stdout %q", out)
	}
	as, err := c.Attempts(context.Background(), id, "count")
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || st.Tasks[0].Attempts != 1 {
		t.Fatalf("attempts %+v: want the one that ran offline, and no other", as)
	}
	eventually(t, 5*time.Second, "the page to be connected", func() bool { return b.status().Connected })
	time.Sleep(time.Second) // any second delivery would have been answered by now
	if s := b.status(); s.Refused != 0 || s.Done != 1 {
		t.Fatalf("page status after reconnecting: %+v", s)
	}
	t.Logf("attempt %d: %s, %s", as[0].ID, as[0].State, as[0].Reason)
}

// Cancelling a workflow terminates the task Web Worker running its task,
// even a tight loop that never calls the host.
func TestBrowserCancelTerminatesTaskWorker(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	spin := push(t, p.client, "spin")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	id := submit(t, p.client, workflow("spin", task{"name": "loop", "module": spin}))
	eventually(t, 30*time.Second, "the loop to run in a task Web Worker", func() bool {
		s := b.status()
		return s.TaskWorkers.Busy == 1 && len(s.Running) == 1
	})
	b.screenshot("volunteer-running", 1280, 900)
	b.screenshot("volunteer-running", 360, 800)
	before := b.status().TaskWorkers
	time.Sleep(300 * time.Millisecond)
	cancelled := time.Now()
	if _, err := p.client.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the task Web Worker to be terminated", func() bool {
		s := b.status().TaskWorkers
		return s.Terminated == before.Terminated+1 && s.Busy == 0
	})
	t.Logf("task Web Worker terminated %v after the cancel", time.Since(cancelled))
	as, err := p.client.Attempts(context.Background(), id, "loop")
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || as[0].State != "cancelled" {
		t.Fatalf("attempts: %+v", as)
	}
}

// A task checkpointed from the browser resumes from that checkpoint on a
// headless worker once the volunteer closes the tab (the lease lapses).
func TestBrowserTabClosedResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	counter := push(t, p.client, "counter")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	setShare(t, b, heldShare) // the counter is there to take time
	id := submit(t, p.client, workflow("resume", task{"name": "count", "module": counter, "args": []string{"40", heldStep(100)},
		"checkpoint_interval": "1s"}))
	eventually(t, 30*time.Second, "a checkpoint from the browser", func() bool {
		st, err := p.client.Status(ctx, id)
		return err == nil && st.Tasks[0].Checkpoints > 0
	})
	if s := b.status(); len(s.Running) != 1 {
		t.Fatalf("the browser is not running the task: %+v", s)
	}
	b.do(chromedp.Navigate("about:blank")) // the volunteer closes the tab
	startHeldWorker(t, "headless", 1, p.srv.url)
	st := wait(t, p.client, id, 60*time.Second)
	if st.State != "done" {
		as, _ := p.client.Attempts(ctx, id, "count")
		t.Fatalf("workflow ended %s: %+v; attempts %+v", st.State, st.Tasks, as)
	}
	out := output(t, p.client, id, "count", "stdout")
	if !strings.HasPrefix(out, "counted 40 from ") || strings.HasPrefix(out, "counted 40 from 0\n") {
		t.Fatalf("stdout %q: want a resumed count", out)
	}
	// The closed tab's attempt is lost, charged to that worker, not to the
	// task: the task was charged only the attempt that succeeded.
	as, err := p.client.Attempts(ctx, id, "count")
	if err != nil || len(as) != 2 || as[0].State != "lost" || as[1].State != "succeeded" {
		t.Errorf("attempts %+v (%v), want 2 (lost in the browser, then succeeded headless)", as, err)
	}
	if st.Tasks[0].Attempts != 1 {
		t.Errorf("the task was charged %d attempts, want 1: a closed tab is not the task's failure", st.Tasks[0].Attempts)
	}
	t.Logf("headless worker: %s", strings.TrimSpace(out))
}

// A task that allocates without bound fails with limit_memory in the
// browser too: its memory's maximum is the limit, so the tab never grows
// past it. The browser is a volunteer: its failure waits for a second
// worker, here one of the operator's, to confirm it.
func TestBrowserMemoryLimit(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	memhog := push(t, p.client, "memhog")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	id := submit(t, p.client, workflow("hog", task{"name": "hog", "module": memhog, "max_attempts": 1,
		"limits": map[string]any{"memory_mib": 32}}))
	ended := attemptEnded(t, p.client, id, "hog")
	if !strings.HasPrefix(ended.Reason, "limit_memory") {
		t.Fatalf("the browser's attempt %+v: want it ended by limit_memory", ended)
	}
	startWorker(t, "operator", 1, p.srv.url)
	st := wait(t, p.client, id, 60*time.Second)
	if st.State != "failed" || !strings.Contains(st.Tasks[0].Error, "memory limit") {
		t.Fatalf("workflow %s, task %+v: want a memory limit failure", st.State, st.Tasks[0])
	}
}

// A task's files in the browser are held to its limits as it writes, as
// in the headless runner: one writing 64 MiB to /out with an output limit
// of 1 MiB is stopped at the write that would pass it (the message says
// "would"; measured only once the task ended, the page had held all 64),
// and one making 2,000 files is stopped at the 1,001st; one opening a file
// 10,000 times is refused past 4,096 descriptors.
func TestBrowserFilesHeldToTheirLimits(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	fill := push(t, p.client, "outfill")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	id := submit(t, p.client, workflow("fill",
		task{"name": "bytes", "module": fill, "args": []string{"bytes", strconv.Itoa(64 << 20)}, "max_attempts": 1,
			"limits": map[string]any{"output_mib": 1}},
		task{"name": "files", "module": fill, "args": []string{"files", "2000"}, "max_attempts": 1}))
	for name, want := range map[string]string{
		"bytes": "limit_output: output limit of 1048576 bytes exceeded: files under /out would add up to more",
		"files": "limit_output: output limit of 1000 files and directories under /out exceeded",
	} {
		if a := attemptEnded(t, p.client, id, name); !strings.HasPrefix(a.Reason, want) {
			t.Errorf("%s: the browser's attempt ended %q, want %q", name, a.Reason, want)
		}
	}
	// Open descriptors are bounded too: past 4,096 an open fails with
	// EMFILE, which the task sees and goes on from.
	probe := push(t, p.client, "fsprobe")
	id = submit(t, p.client, workflow("fds", task{"name": "open", "module": probe, "args": []string{"write", "/out/f", "x", "open", "/out/f", "10000"}}))
	if st := wait(t, p.client, id, 60*time.Second); st.State != "done" {
		t.Fatalf("the workflow ended %s", st.State)
	}
	if got := output(t, p.client, id, "open", "stdout"); !strings.Contains(got, "ok\nopened 4091: open /out/f: Too many open files") {
		t.Errorf("the task printed %q, want its 4,092nd open refused with EMFILE (3 standard streams, 2 preopens)", got)
	}
}

// attemptEnded waits for the first attempt of a task to end and returns
// it.
func attemptEnded(t *testing.T, c *client.Client, id, task string) client.Attempt {
	t.Helper()
	var first client.Attempt
	eventually(t, 60*time.Second, "the task's first attempt to end", func() bool {
		as, err := c.Attempts(context.Background(), id, task)
		if err != nil || len(as) == 0 || as[0].State == "running" {
			return false
		}
		first = as[0]
		return true
	})
	return first
}

// A task that outlives its wall time in the browser fails with
// limit_wall_time (counted from its start in a task Web Worker, not from
// its assignment), and its task Web Worker is terminated; the page goes on
// with the next task.
func TestBrowserWallTimeLimit(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	spin := push(t, p.client, "spin")
	noop := push(t, p.client, "noop")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	before := b.status().TaskWorkers
	id := submit(t, p.client, workflow("wall", task{"name": "loop", "module": spin, "max_attempts": 1, "timeout": "2s"},
		task{"name": "after", "module": noop}))
	if a := attemptEnded(t, p.client, id, "loop"); !strings.HasPrefix(a.Reason, "limit_wall_time: wall time limit of 2s exceeded") {
		t.Fatalf("the browser's attempt %+v: want it ended by limit_wall_time", a)
	}
	// A volunteer's failure waits for a second worker to confirm it.
	startWorker(t, "operator", 1, p.srv.url)
	st := wait(t, p.client, id, 60*time.Second)
	if st.State != "failed" {
		t.Fatalf("workflow %s: want failed", st.State)
	}
	// The page's counters follow the outcome it reported (and the workflow
	// is known to have ended as soon as its last task was committed).
	var terminated int
	eventually(t, 10*time.Second, "the page to count its task Web Worker terminated", func() bool {
		terminated = b.status().TaskWorkers.Terminated
		return terminated >= before.Terminated+1
	})
	if terminated != before.Terminated+1 {
		t.Fatalf("task Web Workers terminated: %d, want %d", terminated, before.Terminated+1)
	}
	for _, task := range st.Tasks {
		if task.Name == "after" && task.State != "done" {
			t.Fatalf("the next task: %+v", task)
		}
	}
}

// shortLoop is a WASI command (a memory and a _start) that counts to
// 1,500,000 and exits: well under a millisecond once V8 optimised it, so
// the page gives its attempts to its task Web Workers in batches
// (web/static/worker.js, pump), and a batch lasts long enough to be cut
// short by a cancel.
var shortLoop = wasmtest.Module(
	wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0})), // type: () -> ()
	wasmtest.Section(3, wasmtest.Vec([]byte{0})),          // one function of type 0
	wasmtest.Section(5, wasmtest.Vec([]byte{0, 1})),       // memory, min 1 page
	wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("memory"), 2, 0), append(wasmtest.Name("_start"), 0, 0))),
	// One local i32; loop { local = local + 1; br_if 0 (local < 1,500,000) }
	wasmtest.Section(10, wasmtest.Vec(append([]byte{0x16, 0x01, 0x01, 0x7f},
		0x03, 0x40, 0x20, 0x00, 0x41, 0x01, 0x6a, 0x22, 0x00, 0x41, 0xe0, 0xc6, 0xdb, 0x00, 0x49, 0x0d, 0x00, 0x0b, 0x0b))),
)

// Short attempts travel to the task Web Workers in batches: every task of a
// large workflow is done once, and cancelling a workflow while batches run
// terminates their task Web Workers without losing the page's other work.
func TestBrowserShortTasksInBatches(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	m, err := p.client.PushModule(context.Background(), shortLoop)
	if err != nil {
		t.Fatal(err)
	}
	many := func(name string, n int) map[string]any {
		tasks := make([]task, n)
		for i := range tasks {
			tasks[i] = task{"name": fmt.Sprintf("t%d", i), "module": m.ID}
		}
		return workflow(name, tasks...)
	}
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)

	id := submit(t, p.client, many("first", 400))
	if st := wait(t, p.client, id, 60*time.Second); st.State != "done" {
		t.Fatalf("first workflow ended %s", st.State)
	}
	st, err := p.client.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range st.Tasks {
		if tk.Attempts != 1 {
			t.Fatalf("task %s: %d attempts, want 1", tk.Name, tk.Attempts)
		}
	}
	// Once their run time is known (under 2 ms), they went several to a
	// message (how many depends on the machine's load: an attempt slowed
	// down past 2 ms goes alone).
	if tw := b.status().TaskWorkers; tw.Batches == 0 || tw.Batches >= tw.Sent {
		t.Errorf("%d attempts went to the task Web Workers in %d messages: none in batches", tw.Sent, tw.Batches)
	} else {
		t.Logf("%d attempts in %d messages", tw.Sent, tw.Batches)
	}

	// Cancel the second while it runs.
	done := b.status().Done
	id2 := submit(t, p.client, many("second", 2000))
	eventually(t, 30*time.Second, "the second workflow to be under way", func() bool { return b.status().Done >= done+100 })
	if _, err := p.client.Cancel(context.Background(), id2); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, p.client, id2, 30*time.Second); st.State != "cancelled" {
		t.Fatalf("second workflow ended %s, want cancelled", st.State)
	}
	eventually(t, 10*time.Second, "the task Web Workers to be idle", func() bool {
		s := b.status()
		return s.TaskWorkers.Busy == 0 && len(s.Running) == 0
	})
	t.Logf("task Web Workers after the cancel: %+v", b.status().TaskWorkers)

	id3 := submit(t, p.client, many("third", 100))
	if st := wait(t, p.client, id3, 60*time.Second); st.State != "done" {
		t.Fatalf("third workflow ended %s", st.State)
	}
}

// argLoop is a WASI command that counts to a billion once for each of its
// arguments: without any it ends at once (its module known to be short,
// so its attempts go in batches), with one it runs for a second or so.
// Each at (4 to 63) makes a module of its own: where it has the size of
// the arguments written.
func argLoop(at byte) []byte {
	code := []byte{
		0x41, 0x00, 0x41, at, 0x10, 0x00, 0x1a, // args_sizes_get(0, at); drop the errno
		0x41, 0x00, 0x28, 0x02, 0x00, 0x41, 0x01, 0x6b, 0xad, // (argc - 1) as i64
		0x42, 0x80, 0x94, 0xeb, 0xdc, 0x03, 0x7e, 0x21, 0x00, // times 10^9: local 0
		0x02, 0x40, 0x03, 0x40, // block, loop
		0x20, 0x01, 0x20, 0x00, 0x5a, 0x0d, 0x01, // local 1 >= local 0: out
		0x20, 0x01, 0x42, 0x01, 0x7c, 0x21, 0x01, 0x0c, 0x00, // local 1 += 1, again
		0x0b, 0x0b, // end loop, end block
	}
	body := append([]byte{0x01, 0x02, 0x7e}, append(code, 0x0b)...) // two i64 locals
	return wasmtest.Module(
		wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0}, []byte{0x60, 2, 0x7f, 0x7f, 1, 0x7f})),
		wasmtest.Section(2, wasmtest.Vec(append(append(wasmtest.Name("wasi_snapshot_preview1"), wasmtest.Name("args_sizes_get")...), 0x00, 0x01))),
		wasmtest.Section(3, wasmtest.Vec([]byte{0})),
		wasmtest.Section(5, wasmtest.Vec([]byte{0, 1})),
		wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("memory"), 2, 0), append(wasmtest.Name("_start"), 0, 1))),
		wasmtest.Section(10, wasmtest.Vec(append(wasmtest.ULEB(len(body)), body...))),
	)
}

// behindALongAttempt opens a volunteer page running threads tasks at once
// and keeps all of them busy; then it queues a long attempt (of args
// billions of steps) of a module known to be short and, once that is
// assigned, seven short ones of another workflow (back to back, the short
// ones could be assigned first, run first in the batch, and leave it
// before a test sees them in it). Once all are assigned, a thread comes
// free and takes them together, the long one first, in one batch, which
// it waits to see. With several threads, the busy attempts run until
// cancelled and it cancels one: no thread comes free before a test says
// so, however a loaded machine shares the CPU between them, and free
// cancels the others and returns the task Web Workers' counts once theirs
// are terminated. With one, the busy attempt ends by itself. The two modules are argLoop(at[0]) and argLoop(at[1]). It
// returns the page, the two workflows' ids, free, and its task Web
// Workers' counts with the batch under way.
func behindALongAttempt(t *testing.T, p *platform, at [2]byte, threads int, args []string) (b *browser, long, short string, free func() taskWorkers, before taskWorkers) {
	t.Helper()
	ctx := context.Background()
	var mods [2]string
	for i := range at {
		m, err := p.client.PushModule(ctx, argLoop(at[i]))
		if err != nil {
			t.Fatal(err)
		}
		mods[i] = m.ID
	}
	loop, busy := mods[0], mods[1]
	b = newBrowser(t, 1280, 900, charging)
	// The loop module's attempts count as short (and go in batches) if
	// they ran under a second: on a loaded machine they may take more than
	// the usual 2 ms.
	openVolunteerPageWith(t, b, p.srv.url, "batch_short_ms=1000")
	if threads != b.status().Threads {
		setThreads(t, b, threads)
	}
	// The loop module's attempts are known to be short.
	warm := make([]task, 20)
	for i := range warm {
		warm[i] = task{"name": fmt.Sprintf("w%d", i), "module": loop}
	}
	if st := wait(t, p.client, submit(t, p.client, workflow("warm", warm...)), 60*time.Second); st.State != "done" {
		t.Fatalf("warm-up ended %s", st.State)
	}
	// With several threads, a minute of steps each: they end when
	// cancelled, so that no thread comes free before a test says so. With
	// one, three seconds of steps, which end by themselves.
	forever := []string{"x", "x", "x"}
	if threads > 1 {
		forever = make([]string, 60)
		for i := range forever {
			forever[i] = "x"
		}
	}
	busyTasks := make([]task, threads)
	for i := range busyTasks {
		busyTasks[i] = task{"name": fmt.Sprintf("busy%d", i), "module": busy, "args": forever}
	}
	busyID := submit(t, p.client, workflow("busy", busyTasks...))
	// Seen running by their workflow, not by the count of busy task Web
	// Workers: the page's status comes every 250 ms, later on a loaded
	// machine, and one from the warm-up's batches counted a busy task Web
	// Worker while the busy module still compiled. The long attempt then
	// took the free thread first and ran without the short ones.
	eventually(t, 30*time.Second, "the busy attempts to run in task Web Workers", func() bool {
		n := 0
		for _, r := range b.status().Running {
			if strings.HasPrefix(r.Task, busyID+"/") {
				n++
			}
		}
		return n >= threads
	})
	long = submit(t, p.client, workflow("long", task{"name": "long", "module": loop, "args": args}))
	eventually(t, 30*time.Second, "the long attempt to be assigned", func() bool {
		as, err := p.client.Attempts(ctx, long, "long")
		return err == nil && len(as) == 1
	})
	shorts := make([]task, 7)
	for i := range shorts {
		shorts[i] = task{"name": fmt.Sprintf("s%d", i), "module": loop}
	}
	short = submit(t, p.client, workflow("shorts", shorts...))
	eventually(t, 30*time.Second, "the short attempts to be assigned", func() bool {
		st, err := p.client.Status(ctx, short)
		return err == nil && !slices.ContainsFunc(st.Tasks, func(t api.Task) bool { return t.State != "running" })
	})
	cancelBusy := func(i int) {
		if _, err := p.client.CancelTask(ctx, busyID, fmt.Sprintf("busy%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if threads > 1 {
		cancelBusy(0)
	}
	eventually(t, 30*time.Second, "the long attempt to be given to a task Web Worker with the short ones", func() bool {
		s := b.status() // tasks named workflow/task
		return slices.ContainsFunc(s.Running, func(r runningTask) bool { return strings.HasPrefix(r.Task, long+"/") }) &&
			slices.ContainsFunc(s.Running, func(r runningTask) bool { return strings.HasPrefix(r.Task, short+"/") })
	})
	before = b.status().TaskWorkers
	free = func() taskWorkers {
		for i := 1; i < threads; i++ {
			cancelBusy(i)
		}
		var after taskWorkers
		eventually(t, 30*time.Second, "the busy attempts' task Web Workers to be terminated", func() bool {
			after = b.status().TaskWorkers
			return after.Terminated >= before.Terminated+threads-1
		})
		return after
	}
	return b, long, short, free, before
}

// Cancelling attempts that wait in a batch behind a running one skips
// them: the task Web Worker is not terminated, and the running attempt,
// another workflow's, goes on to its end rather than starting again.
func TestBrowserCancelInABatchSparesTheRunningAttempt(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	ctx := context.Background()
	// One thread: nothing is given back from the batch (no thread is
	// idle to take it), so the short attempts wait in it until cancelled.
	b, long, short, _, before := behindALongAttempt(t, p, [2]byte{4, 8}, 1, []string{"x"})
	if _, err := p.client.Cancel(ctx, short); err != nil {
		t.Fatal(err)
	}
	if st := wait(t, p.client, long, 60*time.Second); st.State != "done" {
		t.Fatalf("the long workflow ended %s", st.State)
	}
	if after := b.status().TaskWorkers.Terminated; after != before.Terminated {
		t.Errorf("%d task Web Workers terminated by the cancel of attempts that had not started, want none", after-before.Terminated)
	}
}

// An attempt of a module known to be short that runs long gives back the
// attempts waiting behind it in its batch: they run on another task Web
// Worker and end long before it does, once each, and no task Web Worker is
// terminated for it.
func TestBrowserLongAttemptGivesBackItsBatch(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	// Two threads: one for the long attempt, one to take what it gives
	// back; the long attempt runs two billion steps.
	b, long, short, free, before := behindALongAttempt(t, p, [2]byte{12, 16}, 2, []string{"x", "x"})
	freed := free() // the other thread comes free while the long attempt runs
	for _, id := range []string{long, short} {
		if st := wait(t, p.client, id, 60*time.Second); st.State != "done" {
			t.Fatalf("workflow %s ended %s", id, st.State)
		}
	}
	after := b.status().TaskWorkers
	if after.GivenBack <= before.GivenBack {
		t.Errorf("no attempt was given back from the long attempt's batch (%d before, %d after)", before.GivenBack, after.GivenBack)
	}
	if after.Terminated != freed.Terminated {
		t.Errorf("%d task Web Workers terminated, want none", after.Terminated-freed.Terminated)
	}
	la := attempts(t, p.client, long, "long")
	if len(la) != 1 || la[0].EndedAt == nil {
		t.Fatalf("the long task's attempts: %+v", la)
	}
	for i := range 7 {
		as := attempts(t, p.client, short, fmt.Sprintf("s%d", i))
		if len(as) != 1 || as[0].State != "succeeded" || as[0].EndedAt == nil {
			t.Errorf("short task s%d: attempts %+v, want one that succeeded", i, as)
			continue
		}
		if !as[0].EndedAt.Before(*la[0].EndedAt) {
			t.Errorf("short task s%d ended at %v, not before the long one (%v): it waited behind it", i, as[0].EndedAt, la[0].EndedAt)
		}
	}
}

// withStart is a WASI command with a start function (an empty one), which
// runs when the module is instantiated.
var withStart = wasmtest.Module(
	wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0})),   // type: () -> ()
	wasmtest.Section(3, wasmtest.Vec([]byte{0}, []byte{0})), // two functions of type 0
	wasmtest.Section(5, wasmtest.Vec([]byte{0, 1})),         // memory, min 1 page
	wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("memory"), 2, 0), append(wasmtest.Name("_start"), 0, 1))),
	wasmtest.Section(8, []byte{0}),                                             // start: function 0
	wasmtest.Section(10, wasmtest.Vec(wasmtest.Body(nil), wasmtest.Body(nil))), // two empty bodies
)

// An idle task Web Worker makes the instance of its next attempt ahead of
// time: attempts of one module, one after the other, run on instances made
// ahead and give byte for byte the outputs of a fresh instance (clocks and
// random numbers start with the attempt); a module with a start function
// is never instantiated ahead.
func TestBrowserInstanceAhead(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	echo := push(t, p.client, "echo")
	ws, err := p.client.PushModule(context.Background(), withStart)
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)

	wf := workflow("ahead", task{"name": "echo", "module": echo, "args": []string{"a"}, "stdin": map[string]any{"data": "in\n"}})
	var outs []string
	for range 4 {
		id := submit(t, p.client, wf) // same name and task: same seed
		if st := wait(t, p.client, id, 60*time.Second); st.State != "done" {
			t.Fatalf("echo ended %s: %+v", st.State, st.Tasks)
		}
		outs = append(outs, output(t, p.client, id, "echo", "det.txt")+output(t, p.client, id, "echo", "stdout"))
	}
	eventually(t, 5*time.Second, "the page to count the tasks", func() bool { return b.status().Done >= 4 })
	// The first attempt had a fresh instance, the next ones mostly one made
	// ahead by the task Web Worker that ran the one before.
	if n := b.status().TaskWorkers.Ahead; n < 2 {
		t.Errorf("%d attempts ran on an instance made ahead, want at least 2 of 4", n)
	}
	for i, o := range outs[1:] {
		if o != outs[0] {
			t.Errorf("attempt %d gave\n%q\nthe first gave\n%q", i+2, o, outs[0])
		}
	}

	before := b.status()
	for i := range 3 {
		id := submit(t, p.client, workflow(fmt.Sprintf("start-%d", i), task{"name": "s", "module": ws.ID}))
		if st := wait(t, p.client, id, 60*time.Second); st.State != "done" {
			t.Fatalf("the module with a start function ended %s: %+v", st.State, st.Tasks)
		}
	}
	eventually(t, 5*time.Second, "the page to count the tasks", func() bool { return b.status().Done >= before.Done+3 })
	if after := b.status().TaskWorkers.Ahead; after != before.TaskWorkers.Ahead {
		t.Errorf("%d attempts of the module with a start function ran on an instance made ahead", after-before.TaskWorkers.Ahead)
	}
}

// A volunteer who gives a fifth of the CPU has tasks held to a fifth,
// also a task that calls the host only after 50 ms of work or more (a step
// of the counter here, longer in a browser): the page's "CPU time given",
// its tasks' run time less the time they were held back, is about a fifth
// of the attempt's time on the server's clock. (Held back for 80 ms after
// each step, as the page once did, the task would use more than a third.)
// A busy machine only lowers the share a task gets.
func TestBrowserKeepsToItsCPUShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	counter := push(t, p.client, "counter")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	setShare(t, b, 20)
	id := submit(t, p.client, workflow("share", task{"name": "count", "module": counter, "args": []string{"4", "50"}}))
	if st := wait(t, p.client, id, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	as, err := p.client.Attempts(ctx, id, "count")
	if err != nil || len(as) != 1 || as[0].StartedAt == nil || as[0].EndedAt == nil {
		t.Fatalf("attempts: %+v, %v", as, err)
	}
	wall := as[0].EndedAt.Sub(*as[0].StartedAt)
	var cpu time.Duration
	eventually(t, 10*time.Second, "the page to count the task's CPU time", func() bool {
		cpu = time.Duration(b.status().CPUMs) * time.Millisecond
		return cpu > 0
	})
	t.Logf("CPU time given %v in an attempt of %v (%.0f%%, share 20%%)", cpu, wall, 100*cpu.Seconds()/wall.Seconds())
	if bound := wall/4 + 50*time.Millisecond; cpu > bound {
		t.Errorf("the page gave %v of CPU time in an attempt of %v, more than its 20%% share allows (%v)", cpu, wall, bound)
	}
}

// A page waiting for work does not redraw itself and save its totals four
// times a second: the worker reports its status only when it changed.
func TestBrowserIdlePageQuiet(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	b := newBrowser(t, 360, 800, "")
	openVolunteerPage(t, b, p.srv.url)
	eventually(t, 10*time.Second, "the page to wait for work", func() bool {
		var state string
		b.eval(`document.getElementById("state").textContent`, &state)
		return strings.Contains(state, "Waiting for work")
	})
	count := func() int {
		var n int
		b.eval(`window.cyclepool.statusMessages`, &n)
		return n
	}
	before := count()
	time.Sleep(3 * time.Second)
	if n := count() - before; n > 2 {
		t.Errorf("an idle page got %d status reports in 3 s, want at most 2 (nothing changed)", n)
	}
	// A task still shows at once.
	noop := push(t, p.client, "noop")
	id := submit(t, p.client, workflow("after-idle", task{"name": "n", "module": noop}))
	if st := wait(t, p.client, id, 30*time.Second); st.State != "done" {
		t.Fatalf("workflow %s", st.State)
	}
	eventually(t, 5*time.Second, "the page to count the task", func() bool { return b.status().Done == 1 })
}

// A volunteer's browser is the same worker on every visit, so that its
// record and reputation carry over (and the server does not keep a new
// worker per visit); a second page open meanwhile is another worker, since
// two connections cannot share one identity.
func TestBrowserKeepsItsWorkerIdentity(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	b := newBrowser(t, 1280, 900, charging)
	workerID := func(b *browser) string {
		t.Helper()
		var id string
		eventually(t, 10*time.Second, "the page to report its worker id", func() bool {
			id = b.status().Identity.ID
			return id != ""
		})
		return id
	}
	connected := func() []string {
		t.Helper()
		l, err := p.client.Workers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, w := range l.Workers {
			ids = append(ids, w.ID)
		}
		slices.Sort(ids)
		return ids
	}

	openVolunteerPage(t, b, p.srv.url)
	first := workerID(b)
	// The volunteer comes back: same worker.
	b.do(chromedp.Navigate("about:blank"))
	openVolunteerPage(t, b, p.srv.url)
	if id := workerID(b); id != first {
		t.Fatalf("second visit connected as worker %s, want %s as on the first", id, first)
	}
	// The worker stops and starts again in the same page: same worker.
	b.do(chromedp.Click(chromedp.ID("toggle")))
	eventually(t, 10*time.Second, "the worker to stop", func() bool { return !b.status().Connected })
	b.do(chromedp.Click(chromedp.ID("toggle")))
	eventually(t, 30*time.Second, "the worker to reconnect", func() bool { return b.status().Connected })
	if id := workerID(b); id != first {
		t.Fatalf("after stop and start the page is worker %s, want %s", id, first)
	}

	// A second page of the same origin open meanwhile (here in a frame: it
	// shares the first tab's storage and Web Locks as another tab would) is
	// a new worker.
	b.eval(`new Promise((resolve) => {
		const f = document.createElement("iframe");
		f.id = "second"; f.src = "/?autostart=1"; f.onload = () => resolve(true);
		document.body.append(f);
	})`, nil)
	var second string
	eventually(t, 30*time.Second, "the second page's worker to connect", func() bool {
		var st *pageStatus
		b.eval(`document.getElementById("second").contentWindow.cyclepool?.status ?? null`, &st)
		if st != nil && st.Connected {
			second = st.Identity.ID
		}
		return second != ""
	})
	if second == first {
		t.Fatalf("a second page took the first one's identity %s", first)
	}
	want := []string{first, second}
	slices.Sort(want)
	eventually(t, 10*time.Second, "the server to list both pages' workers", func() bool { return slices.Equal(connected(), want) })
	// It did not replace the first page's identity for later visits.
	var saved struct{ ID string }
	b.eval(`JSON.parse(localStorage.getItem("cyclepool.worker"))`, &saved)
	if saved.ID != first {
		t.Errorf("the identity kept for later visits is %q, want the first page's %s", saved.ID, first)
	}
}

// The page, too, hands back an attempt whose module it cannot fetch for
// the server's trouble (a 503), charging its task nothing; a module the
// server does not have would be the task's.
func TestBrowserModuleUnavailableChargesNobody(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	echo := push(t, p.client, "echo")
	proxy := newCountingProxy(t, p.srv.url)
	proxy.refuse("/modules/")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, proxy.url)
	id := submit(t, p.client, workflow("unavailable", task{"name": "e", "module": echo, "max_attempts": 1,
		"stdin": map[string]any{"data": "x\n"}}))
	handedBackForItsModule(t, p, proxy, id)
}
