//go:build unix

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// A DAG of echo and reduce tasks completes, each task seeing exactly the
// outputs of the tasks it names, by name.
func TestDAGCompletesWithCorrectOutputs(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	startWorker(t, "worker", 2, p.srv.url)
	echo := push(t, p.client, "echo")
	reduce := push(t, p.client, "reduce")
	primes := push(t, p.client, "primes")
	id := submit(t, p.client, workflow("dag",
		task{"name": "a", "module": echo, "stdin": map[string]any{"data": "alpha\n"}, "args": []string{"x", "y"}},
		task{"name": "b", "module": echo, "stdin": map[string]any{"data": "beta\n"}},
		task{"name": "c", "module": echo, "inputs": map[string]any{
			"1-first":  map[string]any{"from": "a"},
			"2-second": map[string]any{"from": "b"},
			"3-args":   map[string]any{"from": "a", "output": "args.txt"},
		}, "stdin": map[string]any{"from": "b"}},
		task{"name": "p0", "module": primes, "args": []string{"0", "100000"}},
		task{"name": "p1", "module": primes, "args": []string{"100000", "1000000"}},
		task{"name": "sum", "module": reduce, "inputs": map[string]any{
			"a": map[string]any{"from": "p0"}, "b": map[string]any{"from": "p1"}}},
	))
	st := wait(t, p.client, id, 2*time.Minute)
	if st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	if got := output(t, p.client, id, "a", "stdout"); got != "alpha\n" {
		t.Errorf("a stdout = %q", got)
	}
	if got := output(t, p.client, id, "a", "args.txt"); !strings.Contains(got, "x y") {
		t.Errorf("a args.txt = %q", got)
	}
	// c: stdin (b's stdout), then its /in files in name order.
	if got, want := output(t, p.client, id, "c", "stdout"), "beta\nalpha\nbeta\n"; !strings.HasPrefix(got, want) || !strings.Contains(got, "x y") {
		t.Errorf("c stdout = %q, want %q followed by a's args", got, want)
	}
	if got := strings.TrimSpace(output(t, p.client, id, "sum", "stdout")); got != "78498" {
		t.Errorf("primes below 10^6 = %s, want 78498", got)
	}
	for _, tk := range st.Tasks {
		if tk.Attempts != 1 || tk.State != "done" {
			t.Errorf("task %s: state %s after %d attempts", tk.Name, tk.State, tk.Attempts)
		}
	}
}

// Operators see health, readiness and the metrics the issue names.
func TestOperationsEndpoints(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	startWorker(t, "worker", 1, p.srv.url)
	noop := push(t, p.client, "noop")
	id := submit(t, p.client, workflow("ops", task{"name": "n", "module": noop}))
	wait(t, p.client, id, time.Minute)
	get := func(path string) (int, string) {
		resp, err := http.Get(p.srv.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || !strings.HasPrefix(body, "ok cyclepool devel") {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	wants := []string{
		`cyclepool_tasks{state="ready"}`,
		`cyclepool_tasks_dispatched_total 1`,
		`cyclepool_attempt_completions_total{outcome="succeeded"} 1`,
		`cyclepool_workers_connected{kind="headless"} 1`,
		`cyclepool_replica_workers{kind="headless"} 1`,
		`cyclepool_db_batch_seconds_count{op="complete"}`,
		`cyclepool_lease_expiries_total 0`,
		`cyclepool_maintenance_leader 1`,
	}
	// The owner may hear of the workflow's end (from the database) a
	// moment before the replica that committed it has counted it.
	var metrics string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, metrics = get("/metrics")
		missing := 0
		for _, want := range wants {
			if !strings.Contains(metrics, want) {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range wants {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The task was claimed by its submission (idle worker) or, had the
	// worker's slot not been known yet, by a dispatcher's round.
	if !regexp.MustCompile(`cyclepool_db_batch_size_count\{op="(submission|claim)"\} [1-9]`).MatchString(metrics) {
		t.Errorf("/metrics counts no claim batch")
	}

	// The plots' data: this platform's one task and one worker show in
	// the last minutes (the task may have ended in the minute before),
	// the task once the server has written its counts (every 2 s).
	var act struct {
		Minutes []struct {
			Minute    time.Time `json:"minute"`
			TasksDone int       `json:"tasks_done"`
			Workers   int       `json:"workers"`
		} `json:"minutes"`
	}
	done := 0
	for deadline := time.Now().Add(10 * time.Second); done == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		getJSON(t, p.srv, "/api/v1/activity?minutes=3", &act)
		done = 0
		for _, m := range act.Minutes {
			done += m.TasksDone
		}
	}
	if n := len(act.Minutes); n != 3 || done != 1 || act.Minutes[n-1].Workers != 1 {
		t.Errorf("GET /api/v1/activity?minutes=3 = %+v, want 3 minutes, 1 task done, 1 worker now", act.Minutes)
	}
	if code, body := get("/api/v1/activity"); code != http.StatusUnauthorized {
		t.Errorf("activity without a token: %d %q, want 401", code, body)
	}
}

// A finished attempt frees a slot, but when the last dispatch round left no
// ready task the dispatcher does not read the ready tasks again for it
// (cyclepool_dispatch_rounds_total counts the skipped wake-ups); tasks
// that become ready still start at once (the chain below runs one task at
// a time, each made ready by its predecessor's completion). The server
// polls only every 10 minutes, so the chain ends within its minute only if
// every release woke the dispatcher.
func TestFreedSlotsSkipRoundsWithNothingReady(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--poll", "10m")
	startWorker(t, "worker", 2, p.srv.url)
	noop := push(t, p.client, "echo")
	tasks := []task{{"name": "t0", "module": noop, "stdin": map[string]any{"data": "x"}}}
	for i := 1; i < 6; i++ {
		tasks = append(tasks, task{"name": fmt.Sprintf("t%d", i), "module": noop,
			"stdin": map[string]any{"from": fmt.Sprintf("t%d", i-1)}})
	}
	id := submit(t, p.client, workflow("chain", tasks...))
	if st := wait(t, p.client, id, time.Minute); st.State != "done" {
		t.Fatalf("workflow %s", st.State)
	}
	if got := output(t, p.client, id, "t5", "stdout"); got != "x" {
		t.Errorf("t5's output %q, want x", got)
	}
	if n := dispatchRounds(t, p.srv.url, "skipped"); n < 3 {
		t.Errorf("%d wake-ups for freed slots skipped, want most of the 6", n)
	}
}

// dispatchRounds reads cyclepool_dispatch_rounds_total{outcome} from the
// metrics of the replica at url.
func dispatchRounds(t *testing.T, url, outcome string) int {
	t.Helper()
	return metric(t, url, `cyclepool_dispatch_rounds_total{outcome="`+outcome+`"}`)
}

// metric reads the counter series (name and labels, as /metrics writes
// them) from the metrics of the replica at url.
func metric(t *testing.T, url, series string) int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\d+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics lacks %s:\n%s", series, b)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// A small submission to a replica whose workers have idle slots claims its
// ready tasks in its own transaction and sends them (counted as
// "submission" rounds); every replica hears of ready tasks left by a
// submission by the commit's notification, so a task submitted to a
// replica without workers starts at once on another's, and tasks beyond the
// idle slots start as slots come free, long before any replica polls (every
// 10 minutes here: a task that waited for a poll would not end within its
// minute).
func TestSubmissionClaimsItsReadyTasks(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	r1 := startServer(t, "replica1", db, t.TempDir(), 0, "--poll", "10m")
	r2 := startServer(t, "replica2", db, t.TempDir(), 0, "--poll", "10m")
	startWorker(t, "worker", 2, r1.url) // room for 4: 2 slots, 2 queued
	for _, r := range []*server{r1, r2} {
		c := client.New(r.url, r.token)
		echo := push(t, c, "echo")
		for i := range 4 {
			want := fmt.Sprintf("x%d", i)
			id := submit(t, c, workflow("one", task{"name": "t", "module": echo, "stdin": map[string]any{"data": want}}))
			if st := wait(t, c, id, time.Minute); st.State != "done" {
				t.Fatalf("workflow %s", st.State)
			}
			if got := output(t, c, id, "t", "stdout"); got != want {
				t.Errorf("output %q, want %q", got, want)
			}
		}
	}
	if n := dispatchRounds(t, r1.url, "submission"); n < 3 {
		t.Errorf("%d submissions claimed their tasks, want most of the 4 submissions to replica 1", n)
	}

	// Ten ready tasks, room for four: the other six wait for free slots.
	c := client.New(r1.url, r1.token)
	echo := push(t, c, "echo")
	var tasks []task
	for i := range 10 {
		tasks = append(tasks, task{"name": fmt.Sprint("t", i), "module": echo, "stdin": map[string]any{"data": fmt.Sprint("x", i)}})
	}
	id := submit(t, c, workflow("ten", tasks...))
	if st := wait(t, c, id, 20*time.Second); st.State != "done" {
		t.Fatalf("workflow %s: ready tasks beyond the idle slots waited for a poll", st.State)
	}
	for i := range 10 {
		if got, want := output(t, c, id, fmt.Sprint("t", i), "stdout"), fmt.Sprint("x", i); got != want {
			t.Errorf("t%d: output %q, want %q", i, got, want)
		}
	}
}
