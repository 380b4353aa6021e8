package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

func TestReorderArgs(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"flags after the id", []string{"ID", "--watch", "--json"}, []string{"--watch", "--json", "--", "ID"}},
		{"flags before the id", []string{"--watch", "ID"}, []string{"--watch", "--", "ID"}},
		{"value flag with separate value", []string{"ID", "-o", "out", "--watch"}, []string{"-o", "out", "--watch", "--", "ID"}},
		{"value flag with =", []string{"ID", "--timeout=10m"}, []string{"--timeout=10m", "--", "ID"}},
		{"value flag value looks like a positional", []string{"--timeout", "10m", "ID"}, []string{"--timeout", "10m", "--", "ID"}},
		{"bool flag does not eat the id", []string{"--watch", "ID", "-o", "d"}, []string{"--watch", "-o", "d", "--", "ID"}},
		{"double dash keeps the rest positional", []string{"ID", "--", "--watch"}, []string{"--", "ID", "--watch"}},
		{"single dash is positional", []string{"-", "--json"}, []string{"--json", "--", "-"}},
		{"unknown flag left for Parse", []string{"ID", "--nope"}, []string{"--nope", "--", "ID"}},
		{"no positionals", []string{"--json"}, []string{"--json"}},
		{"value flag at the end", []string{"ID", "-o"}, []string{"-o", "--", "ID"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			fs.Bool("watch", false, "")
			fs.Bool("json", false, "")
			fs.String("o", "", "")
			fs.Duration("timeout", 0, "")
			got := reorderArgs(fs, tt.args)
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("reorderArgs(%q) = %q, want %q", tt.args, got, tt.want)
			}
		})
	}
}

func TestParseFlagsAfterPositional(t *testing.T) {
	fs := newFlagSet("results")
	fs.SetOutput(io.Discard)
	dir := fs.String("o", "", "")
	rest, err := parseFlags(fs, []string{"wf1", "-o", "out dir"})
	if err != nil || *dir != "out dir" || len(rest) != 1 || rest[0] != "wf1" {
		t.Fatalf("rest=%q dir=%q err=%v", rest, *dir, err)
	}
}

func TestBar(t *testing.T) {
	for _, tt := range []struct {
		p    float64
		want string
	}{
		{0, "[..........]   0%"},
		{0.62, "[######....]  62%"},
		{0.999, "[#########.]  99%"},
		{1, "[##########] 100%"},
		{1.5, "[##########] 100%"},
		{-1, "[..........]   0%"},
	} {
		if got := bar(tt.p, 10); got != tt.want {
			t.Errorf("bar(%v) = %q, want %q", tt.p, got, tt.want)
		}
	}
}

var (
	t0  = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	now = t0.Add(83 * time.Second)
)

func exampleStatus() *client.Status {
	return &client.Status{
		ID: "6b0c", Name: "primes", Priority: "batch", State: "running", CreatedAt: t0,
		Counts: client.Counts{Done: 1, Running: 1, Failed: 1, Blocked: 1},
		Tasks: []client.Task{
			{Name: "count-0", State: "done", Attempts: 1, MaxAttempts: 3, Progress: 1, Checkpoints: 4},
			{Name: "count-1", State: "running", Attempts: 2, MaxAttempts: 3, Progress: 0.62, Checkpoints: 2},
			{Name: "count-2", State: "failed", Attempts: 3, MaxAttempts: 3, Error: "memory limit exceeded: 512 pages\nmore detail"},
			{Name: "sum", State: "blocked", MaxAttempts: 3},
		},
	}
}

func TestRenderStatusTable(t *testing.T) {
	got := strings.Join(renderStatus(exampleStatus(), 80, 0, now), "\n")
	want := strings.Join([]string{
		`workflow 6b0c "primes"  RUNNING  batch  elapsed 1m23s`,
		`4 tasks: 1 blocked, 1 running, 1 done, 1 failed`,
		``,
		`TASK     STATE    ATT  PROGRESS                       CKPT  ERROR`,
		`count-0  done     1/3  [######################] 100%     4`,
		`count-1  running  2/3  [#############.........]  62%     2`,
		`count-2  failed   3/3  [......................]   0%     0  memory limit exceed…`,
		`sum      blocked  0/3  [......................]   0%     0`,
	}, "\n")
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	for _, w := range []int{40, 60, 80, 100, 200} {
		for _, l := range renderStatus(exampleStatus(), w, 0, now) {
			if n := len([]rune(l)); n > w {
				t.Errorf("width %d: line of %d columns: %q", w, n, l)
			}
		}
	}
}

// A task that used up its attempts has an error that starts with "failed
// after N attempts; last: " (the server's words): the table leaves that out,
// as ATT says it, so that the reason shows in the room the table has at
// the default width of 100 columns.
func TestRenderStatusShowsTheReasonOfAFailedTask(t *testing.T) {
	st := exampleStatus()
	st.Tasks[2].Error = "failed after 3 attempts; last: limit_memory: memory limit exceeded: the module tried to grow its memory to 264 pages"
	var row string
	for _, l := range renderStatus(st, 100, 0, now) {
		if strings.HasPrefix(l, "count-2 ") {
			row = l
		}
	}
	if !strings.Contains(row, "limit_memory: memory") || strings.Contains(row, "failed after") {
		t.Errorf("row of the failed task %q, want its reason without \"failed after 3 attempts\"", row)
	}
	st.Tasks[2].Error = "failed after 1 attempt; last: exit: exit code 3: boom"
	if got := tableError(st.Tasks[2].Error); got != "exit: exit code 3: boom" {
		t.Errorf("tableError = %q", got)
	}
	if got := tableError("an upstream task failed"); got != "an upstream task failed" {
		t.Errorf("tableError = %q", got)
	}
}

// The server's notice (its database cannot store results) comes under the
// counts, cut to the width like every line.
func TestRenderStatusShowsTheServersNotice(t *testing.T) {
	st := exampleStatus()
	st.Notice = "the server cannot store results now (disk full): finished results wait at the workers"
	lines := renderStatus(st, 60, 0, now)
	if len(lines) < 3 || !strings.HasPrefix(lines[2], "note: the server cannot store results now") {
		t.Fatalf("third line %q, want the notice", lines[2])
	}
	for _, l := range lines {
		if n := len([]rune(l)); n > 60 {
			t.Errorf("line of %d columns: %q", n, l)
		}
	}
}

func TestRenderStatusFitsHeight(t *testing.T) {
	st := &client.Status{ID: "w", Name: "big", State: "running", CreatedAt: t0}
	for i := range 50 {
		state := "done"
		switch {
		case i == 7 || i == 30:
			state = "running"
		case i == 12:
			state = "failed"
		case i > 40:
			state = "blocked"
		}
		st.Tasks = append(st.Tasks, client.Task{Name: "t" + string(rune('A'+i%26)) + string(rune('a'+i/26)), State: state})
	}
	st.Counts = client.CountTasks(st.Tasks)
	lines := renderStatus(st, 80, 10, now)
	if len(lines) > 10 {
		t.Fatalf("%d lines for a height of 10:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	text := strings.Join(lines, "\n")
	for _, name := range []string{st.Tasks[7].Name, st.Tasks[30].Name, st.Tasks[12].Name} {
		if !strings.Contains(text, name+" ") {
			t.Errorf("running or failed task %s not shown:\n%s", name, text)
		}
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "… 45 more: 7 blocked, 38 done") {
		t.Errorf("summary line = %q", last)
	}
}

func TestChangeLines(t *testing.T) {
	a := exampleStatus()
	first := changeLines(nil, a, now)
	if want := `10:01:23 workflow 6b0c "primes": running (4 tasks: 1 blocked, 1 running, 1 done, 1 failed)`; first[0] != want {
		t.Errorf("first line = %q, want %q", first[0], want)
	}
	b := a.Clone()
	b.Tasks[1].Progress = 0.9 // progress alone prints nothing
	if got := changeLines(a, b, now); len(got) != 0 {
		t.Errorf("progress change printed %q", got)
	}
	c := b.Clone()
	c.Tasks[1].State = "done"
	c.Tasks[3].State = "running"
	c.Tasks[3].Attempts = 1
	got := changeLines(b, c, now)
	want := []string{
		"10:01:23 task count-1: running -> done",
		"10:01:23 task sum: blocked -> running (attempt 1/3)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q, want %q", got, want)
	}
	d := c.Clone()
	d.State = "failed"
	fin := t0.Add(90 * time.Second)
	d.FinishedAt = &fin
	got = changeLines(c, d, now)
	if len(got) != 1 || got[0] != `10:01:23 workflow 6b0c failed after 1m30s (4 tasks: 1 blocked, 1 running, 1 done, 1 failed); task "count-2" failed: memory limit exceeded: 512 pages …` {
		t.Errorf("final = %q", got)
	}
}

func TestDispatchHelpAndUnknown(t *testing.T) {
	var buf bytes.Buffer
	if code := dispatch(t.Context(), []string{"help"}, &buf); code != 0 {
		t.Errorf("help exit = %d", code)
	}
	for _, name := range []string{"serve", "worker", "token", "module push FILE.wasm", "submit", "status ID", "wait ID", "results ID -o DIR", "cancel ID", "list"} {
		if !strings.Contains(buf.String(), name) {
			t.Errorf("help does not list %q:\n%s", name, buf.String())
		}
	}
	buf.Reset()
	if code := dispatch(t.Context(), []string{"frobnicate"}, &buf); code != 1 || !strings.HasPrefix(buf.String(), "cyclepool: unknown command") {
		t.Errorf("unknown: exit %d, %q", code, buf.String())
	}
	buf.Reset()
	if code := dispatch(t.Context(), []string{"status"}, &buf); code != 1 || !strings.Contains(buf.String(), "cyclepool: status: expected one workflow ID") {
		t.Errorf("status without id: exit %d, %q", code, buf.String())
	}
}

// A mistake in a command's flags is an error of that command's, with
// "cyclepool: " in front and a hint for a duration without its unit, not
// the whole list of commands; a 401 says how to give the owner token.
func TestDispatchErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":"missing owner token: send Authorization: Bearer <token> (cyclepool token create NAME)"}`)
	}))
	defer srv.Close()
	t.Setenv("CYCLEPOOL_TOKEN", "")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"submit", "--wait", "30", "w.json"}, []string{`cyclepool: submit: invalid value "30" for flag -wait`, "a duration takes its unit", "cyclepool help submit"}},
		{[]string{"wait", "6b0c", "--timeout", "5"}, []string{"cyclepool: wait: ", "a duration takes its unit"}},
		{[]string{"status", "--bogus", "6b0c"}, []string{"cyclepool: status: flag provided but not defined: -bogus"}},
		{[]string{"token", "create", "--nope", "n"}, []string{"cyclepool: token create: ", "cyclepool help token)"}},
		{[]string{"list", "--server", srv.URL}, []string{"HTTP 401", "--token TOKEN or CYCLEPOOL_TOKEN"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var buf bytes.Buffer
			if code := dispatch(t.Context(), tc.args, &buf); code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			out := buf.String()
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output %q lacks %q", out, w)
				}
			}
			if strings.Contains(out, "commands:") || strings.Count(out, "\n") > 2 {
				t.Errorf("output %q holds more than the error", out)
			}
		})
	}
}

// wait's exit code says how the workflow ended. A workflow that ended is
// waited for with a timeout no busy machine reaches; one that runs on with
// a short one (exit 3).
func TestWaitExitCodes(t *testing.T) {
	for _, tt := range []struct {
		state   string
		code    int
		timeout string
	}{{"done", 0, "1m"}, {"failed", 1, "1m"}, {"cancelled", 2, "1m"}, {"running", 3, "300ms"}} {
		t.Run(tt.state, func(t *testing.T) {
			statusServer(t, tt.state, func(w http.ResponseWriter, r *http.Request, st *client.Status) bool {
				if r.URL.Path != "/api/v1/workflows" {
					return false
				}
				// The id's prefix resolved.
				if r.URL.Query().Get("id_prefix") != "6b0c" {
					t.Errorf("listed %s, want id_prefix=6b0c", r.URL.RawQuery)
				}
				json.NewEncoder(w).Encode(client.WorkflowList{Workflows: []client.Status{*st}, Total: 1})
				return true
			})
			var buf bytes.Buffer
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			if code := dispatch(ctx, []string{"wait", "6b0c", "--timeout", tt.timeout}, &buf); code != tt.code {
				t.Errorf("exit = %d, want %d (%s)", code, tt.code, buf.String())
			}
		})
	}
}

// submit --wait submits and waits in one request, then as wait does: the
// id on stdout, and wait's exit code. A workflow still running when the
// submission's request answers is waited for until --wait (exit 3).
func TestSubmitWaitExitCodes(t *testing.T) {
	wf := filepath.Join(t.TempDir(), "wf.json")
	if err := os.WriteFile(wf, []byte(`{"name":"w","tasks":[{"name":"a","module":"sha256:`+strings.Repeat("ab", 32)+`"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		state string
		code  int
		wait  string
	}{{"done", 0, "1m"}, {"failed", 1, "1m"}, {"cancelled", 2, "1m"}, {"running", 3, "300ms"}} {
		t.Run(tt.state, func(t *testing.T) {
			var submitted, waited string
			statusServer(t, tt.state, func(w http.ResponseWriter, r *http.Request, st *client.Status) bool {
				waited = r.URL.Path
				if r.Method != http.MethodPost {
					return false
				}
				submitted = r.URL.Query().Get("wait")
				w.WriteHeader(http.StatusCreated)
				json.NewEncoder(w).Encode(st)
				return true
			})
			var buf bytes.Buffer
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			if code := dispatch(ctx, []string{"submit", "--wait", tt.wait, wf}, &buf); code != tt.code {
				t.Errorf("exit = %d, want %d (%s)", code, tt.code, buf.String())
			}
			if want, _ := time.ParseDuration(tt.wait); submitted != want.String() {
				t.Errorf("submitted with wait=%q, want %q", submitted, want)
			}
			if tt.state == "running" && waited == "/api/v1/workflows" {
				t.Errorf("still running after the submission's request, and not waited for since")
			}
		})
	}
}

// statusServer serves, for the CLI this test runs (CYCLEPOOL_SERVER), the
// example workflow in state to every request that other does not answer
// (other reports whether it did); it has no event stream, so waits poll.
func statusServer(t *testing.T, state string, other func(http.ResponseWriter, *http.Request, *client.Status) bool) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/events") {
			http.Error(w, `{"error":"no stream here"}`, http.StatusServiceUnavailable)
			return
		}
		st := exampleStatus()
		st.State = state
		if !other(w, r, st) {
			json.NewEncoder(w).Encode(st)
		}
	}))
	t.Cleanup(srv.Close)
	t.Setenv("CYCLEPOOL_SERVER", srv.URL)
}

func TestRenderStatusWithoutErrorsWidensTheBar(t *testing.T) {
	st := exampleStatus()
	st.Tasks[2].Error = ""
	lines := renderStatus(st, 100, 0, now)
	if lines[3] != "TASK     STATE    ATT  PROGRESS                               CKPT" {
		t.Errorf("header = %q", lines[3])
	}
	if want := "count-1  running  2/3  [##################............]  62%     2"; lines[5] != want {
		t.Errorf("row = %q, want %q", lines[5], want)
	}
}

func TestSchedText(t *testing.T) {
	eff, par, one := 0.834, 12, 1
	tests := []struct {
		name string
		st   client.Status
		want string
	}{
		{"nothing known", client.Status{Replicas: 1, Quorum: 1}, ""},
		{"efficiency", client.Status{Replicas: 1, Quorum: 1, Efficiency: &eff, SuggestedParallelism: &par},
			"efficiency 83%, suggested parallelism 12 workers"},
		{"verified", client.Status{Replicas: 3, Quorum: 2, Efficiency: &eff, SuggestedParallelism: &one,
			Tasks: []client.Task{{Name: "a", Disputed: true}, {Name: "b"}}},
			"replicas 3, quorum 2; efficiency 83%, suggested parallelism 1 worker; 1 disputed result"},
	}
	for _, tc := range tests {
		if got := schedText(&tc.st); got != tc.want {
			t.Errorf("%s: schedText = %q, want %q", tc.name, got, tc.want)
		}
	}
	st := exampleStatus()
	st.Efficiency, st.SuggestedParallelism = &eff, &par
	if lines := renderStatus(st, 80, 0, now); lines[2] != "efficiency 83%, suggested parallelism 12 workers" {
		t.Errorf("status header = %q", lines[:3])
	}
}

func TestWriteWorkers(t *testing.T) {
	two, none := 2, 0
	l := client.WorkerList{Workers: []client.Worker{
		{ID: "w1", Kind: "browser", Slots: 2, Running: &two, TasksDone: &two, Attempts: 5, TasksLost: 1, Strikes: 6.5, Allowed: &none,
			Stability:  &client.WorkerStability{Class: "unstable", Reasons: []string{"on battery (62%)", "battery predicted empty in 21m0s"}},
			Reputation: client.WorkerReputation{Valid: 3, Invalid: 1, Score: 4.0 / 6}},
		{ID: "w2", Kind: "headless", Slots: 4, Operator: true, Reputation: client.WorkerReputation{Valid: 30, Score: 31.0 / 32, Trusted: true}},
	}, Fairness: client.Fairness{Strategy: "none", VarianceTasksDone: 0.5}}
	var b strings.Builder
	if err := writeWorkers(&b, l); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{"unstable", "on battery (62%); battery predicted empty in 21m0s", "0.67 (3 valid, 1 invalid), 6.5 strikes, held to 0",
		"0.97 (30 valid, 0 invalid) trusted, operator's", "1/5", "2 workers; fairness none, variance of tasks done 0.50"} {
		if !strings.Contains(got, want) {
			t.Errorf("workers table lacks %q:\n%s", want, got)
		}
	}
}

func TestWorkerProcs(t *testing.T) {
	for _, tc := range []struct {
		flag   int
		envSet bool
		cpus   int
		want   int
	}{
		{0, false, 2, 1}, {0, false, 1, 1}, {0, false, 8, 2}, {0, false, 64, 16}, {3, false, 2, 3}, {3, true, 64, 3},
	} {
		if got := workerProcs(tc.flag, tc.envSet, tc.cpus); got != tc.want {
			t.Errorf("workerProcs(%d, %v, %d) = %d, want %d", tc.flag, tc.envSet, tc.cpus, got, tc.want)
		}
	}
	if got := workerProcs(0, true, 64); got != runtime.GOMAXPROCS(0) {
		t.Errorf("with GOMAXPROCS set: %d, want the runtime's %d", got, runtime.GOMAXPROCS(0))
	}
}

func TestServeProcs(t *testing.T) {
	for _, tc := range []struct {
		flag     int
		embedded bool
		cpus     int
		want     int
	}{
		{0, true, 2, 1}, {0, true, 1, 1}, {0, true, 16, 8}, {0, false, 2, 2}, {0, false, 16, 16}, {3, true, 16, 3}, {3, false, 2, 3},
	} {
		if got := serveProcs(tc.flag, false, tc.embedded, tc.cpus); got != tc.want {
			t.Errorf("serveProcs(%d, false, %v, %d) = %d, want %d", tc.flag, tc.embedded, tc.cpus, got, tc.want)
		}
	}
	if got := serveProcs(0, true, true, 64); got != runtime.GOMAXPROCS(0) {
		t.Errorf("with GOMAXPROCS set: %d, want the runtime's %d", got, runtime.GOMAXPROCS(0))
	}
}

// A CPU share that is not a percentage from 10 to 100 refuses to start,
// naming the flag, before anything is started.
func TestCPUShareFlagsAreValidated(t *testing.T) {
	tests := []struct {
		name string
		run  func(context.Context, []string) error
		args []string
		want string
	}{
		{"worker, too small", runWorker, []string{"--server", "http://127.0.0.1:1", "--cpu-share", "5"}, "--cpu-share 5 is not a percentage"},
		{"worker, too large", runWorker, []string{"--server", "http://127.0.0.1:1", "--cpu-share", "101"}, "--cpu-share 101 is not a percentage"},
		{"serve's local worker", runServe, []string{"--data-dir", t.TempDir(), "--local-worker", "1", "--local-worker-cpu-share", "0"},
			"--local-worker-cpu-share 0 is not a percentage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run(context.Background(), tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// serve on an address in use says so at once: before it starts the
// embedded PostgreSQL (which took some ten seconds, and made a data
// directory, before the error).
func TestServeOnAnAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	var buf bytes.Buffer
	code := dispatch(t.Context(), []string{"serve", "--addr", l.Addr().String(), "--data-dir", dir}, &buf)
	if code != 1 || !strings.Contains(buf.String(), "cyclepool: listen on "+l.Addr().String()) {
		t.Fatalf("exit %d: %q", code, buf.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "postgres")); !os.IsNotExist(err) {
		t.Errorf("the embedded PostgreSQL was started (its directory: %v)", err)
	}
}
