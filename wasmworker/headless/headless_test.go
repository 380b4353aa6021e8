package headless

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
	"github.com/cyclepool/cyclepool/wasmworker"
)

var (
	sharedMu      sync.Mutex
	sharedRunners = map[bool]*Runner{} // by Config.InProcess
)

// sharedRunner returns the Runner shared by the tests of this package in
// one mode.
func sharedRunner(t testing.TB, inProcess bool) *Runner {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if r := sharedRunners[inProcess]; r != nil {
		return r
	}
	r, err := New(context.Background(), Config{CacheDir: cacheDir(), InProcess: inProcess})
	if err != nil {
		t.Fatal(err)
	}
	if (r.pool != nil) == inProcess {
		t.Fatalf("New(InProcess: %v) made the other kind of Runner", inProcess)
	}
	sharedRunners[inProcess] = r
	return r
}

// closeSharedRunners closes the shared Runners (from TestMain).
func closeSharedRunners() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for _, r := range sharedRunners {
		r.Close(context.Background())
	}
}

// eachMode runs f as a subtest in isolation mode and in in-process mode.
func eachMode(t *testing.T, f func(t *testing.T, r *Runner)) {
	for _, inProcess := range []bool{false, true} {
		name := "isolated"
		if inProcess {
			name = "inprocess"
		}
		t.Run(name, func(t *testing.T) { f(t, sharedRunner(t, inProcess)) })
	}
}

func cacheDir() string { return filepath.Join(os.TempDir(), "cyclepool-headless-test-cache") }

// fakeHost records progress and checkpoints.
type fakeHost struct {
	mu          sync.Mutex
	progress    []float64
	checkpoints [][]byte
	refuse      bool
	started     int
}

func (h *fakeHost) Started() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.started++
}

func (h *fakeHost) Progress(f float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.progress = append(h.progress, f)
}

func (h *fakeHost) Checkpoint(ctx context.Context, state []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refuse {
		return errors.New("refused")
	}
	h.checkpoints = append(h.checkpoints, state)
	return nil
}

// job makes a job for task module name.
func job(t testing.TB, name string, a protocol.Assign) (*wasmworker.Job, *fakeHost) {
	t.Helper()
	b := taskbuild.Bytes(t, name)
	sum := sha256.Sum256(b)
	h := &fakeHost{}
	a.Task = "wf/" + name
	return &wasmworker.Job{
		Assign:   &a,
		ModuleID: "sha256:" + hex.EncodeToString(sum[:]),
		Fetch:    func(context.Context) ([]byte, error) { return b, nil },
		Host:     h,
	}, h
}

func outputs(o *wasmworker.Outcome) map[string]string {
	m := map[string]string{}
	for _, b := range o.Outputs {
		m[b.Name] = string(b.Data)
	}
	return m
}

func names(o *wasmworker.Outcome) []string {
	var n []string
	for _, b := range o.Outputs {
		n = append(n, b.Name)
	}
	return n
}

func TestRun(t *testing.T) { eachMode(t, testRun) }

func testRun(t *testing.T, r *Runner) {
	tests := []struct {
		name   string
		task   string
		assign protocol.Assign
		reason string
		msg    string // substring of Message
		check  func(t *testing.T, o *wasmworker.Outcome)
	}{
		{name: "noop", task: "noop", check: func(t *testing.T, o *wasmworker.Outcome) {
			if len(o.Outputs) != 1 || o.Outputs[0].Name != "stdout" || len(o.Outputs[0].Data) != 0 {
				t.Errorf("outputs = %v, want one empty stdout", names(o))
			}
		}},
		{name: "echo inputs and args", task: "echo", assign: protocol.Assign{
			Args:   []string{"a", "b c", "d"},
			Stdin:  protocol.Blob{Data: []byte("stdin;")},
			Inputs: []protocol.Blob{{Name: "z", Data: []byte("Z;")}, {Name: "a.txt", Data: []byte("A;")}},
		}, check: func(t *testing.T, o *wasmworker.Outcome) {
			if got, want := strings.Join(names(o), ","), "stdout,args.txt,det.txt"; got != want {
				t.Errorf("output names %s, want %s", got, want)
			}
			m := outputs(o)
			if m["stdout"] != "stdin;A;Z;" {
				t.Errorf("stdout %q", m["stdout"])
			}
			if m["args.txt"] != "a b c d" {
				t.Errorf("args.txt %q", m["args.txt"])
			}
			for _, b := range o.Outputs {
				if b.Size != len(b.Data) {
					t.Errorf("%s: Size %d, len %d", b.Name, b.Size, len(b.Data))
				}
			}
		}},
		{name: "chatty within limits", task: "chatty", assign: protocol.Assign{Args: []string{"1000"}},
			check: func(t *testing.T, o *wasmworker.Outcome) {
				m := outputs(o)
				if m["stdout"] != strings.Repeat("o", 1000) || m["big"] != strings.Repeat("b", 1000) {
					t.Errorf("outputs %v", names(o))
				}
				if string(o.Log) != strings.Repeat("e", 1000) {
					t.Errorf("log has %d bytes", len(o.Log))
				}
			}},
		{name: "exit code", task: "fail", reason: protocol.ReasonExit, msg: "exit code 3",
			check: func(t *testing.T, o *wasmworker.Outcome) {
				if !strings.Contains(string(o.Log), "always fails") {
					t.Errorf("log %q", o.Log)
				}
			}},
		{name: "memory limit", task: "memhog", reason: protocol.ReasonMemory, msg: "limit is 512 pages",
			assign: protocol.Assign{Limits: protocol.Limits{MemoryPages: 512}}},
		{name: "declared memory over limit", task: "noop", reason: protocol.ReasonMemory, msg: "declares",
			assign: protocol.Assign{Limits: protocol.Limits{MemoryPages: 2}}},
		{name: "wall time limit", task: "spin", reason: protocol.ReasonWallTime, msg: "wall time",
			assign: protocol.Assign{Limits: protocol.Limits{WallMS: 200}}},
		{name: "stdout over output limit", task: "chatty", reason: protocol.ReasonOutput, msg: "stdout",
			assign: protocol.Assign{Args: []string{"5000"}, Limits: protocol.Limits{OutputBytes: 4000}}},
		{name: "files over output limit", task: "chatty", reason: protocol.ReasonOutput, msg: "/out/big",
			assign: protocol.Assign{Args: []string{"3000"}, Limits: protocol.Limits{OutputBytes: 5000}}},
		{name: "log limit", task: "chatty", reason: protocol.ReasonLog, msg: "log limit of 100 bytes",
			assign: protocol.Assign{Args: []string{"1000"}, Limits: protocol.Limits{LogBytes: 100}},
			check: func(t *testing.T, o *wasmworker.Outcome) {
				if string(o.Log) != strings.Repeat("e", 100) {
					t.Errorf("log %q, want the first 100 bytes", o.Log)
				}
			}},
		{name: "bad input name", task: "echo", reason: protocol.ReasonWorker, msg: "plain file name",
			assign: protocol.Assign{Inputs: []protocol.Blob{{Name: "../x"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j, _ := job(t, tc.task, tc.assign)
			o := r.Run(context.Background(), j)
			if o.Reason != tc.reason {
				t.Fatalf("Reason %q (%s), want %q; log:\n%s", o.Reason, o.Message, tc.reason, o.Log)
			}
			if !strings.Contains(o.Message, tc.msg) {
				t.Errorf("Message %q does not contain %q", o.Message, tc.msg)
			}
			if tc.reason == "" && o.Message != "" {
				t.Errorf("Message %q on success", o.Message)
			}
			if o.Duration <= 0 {
				t.Errorf("Duration %v", o.Duration)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

func TestTrap(t *testing.T) { eachMode(t, testTrap) }

// A Run tells its Host once that the attempt started, and not at all when
// it never could (its module did not load).
func TestRunsSayWhenTheyStart(t *testing.T) { eachMode(t, testRunsSayWhenTheyStart) }

func testRunsSayWhenTheyStart(t *testing.T, r *Runner) {
	good, h := job(t, "echo", protocol.Assign{Args: []string{"x"}})
	if o := r.Run(context.Background(), good); o.Reason != "" {
		t.Fatalf("%s: %s", o.Reason, o.Message)
	}
	bad, hb := job(t, "noop", protocol.Assign{})
	bad.Fetch = func(context.Context) ([]byte, error) { return []byte("\x00asm\x01\x00\x00\x00garbage"), nil }
	bad.ModuleID = "sha256:" + strings.Repeat("1", 64)
	if o := r.Run(context.Background(), bad); o.Reason == "" {
		t.Fatal("a broken module ran")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if h.started != 1 || hb.started != 0 {
		t.Errorf("Started called %d times for a run, %d for a module that did not load; want 1 and 0", h.started, hb.started)
	}
}

func testTrap(t *testing.T, r *Runner) {
	// A module whose _start executes unreachable.
	mod := wasmtest.Module(
		wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0})),                    // type: () -> ()
		wasmtest.Section(3, wasmtest.Vec([]byte{0})),                             // one function of type 0
		wasmtest.Section(5, wasmtest.Vec([]byte{0, 1})),                          // memory, min 1 page
		wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("_start"), 0, 0))), // export func 0
		wasmtest.Section(10, wasmtest.Vec(wasmtest.Body([]byte{0x00}))),          // unreachable
	)
	o := r.Run(context.Background(), rawJob(mod))
	if o.Reason != protocol.ReasonTrap {
		t.Fatalf("Reason %q (%s), want trap", o.Reason, o.Message)
	}
	if !strings.Contains(o.Message, "unreachable") {
		t.Errorf("Message %q", o.Message)
	}
}

func TestModuleErrors(t *testing.T) { eachMode(t, testModuleErrors) }

func testModuleErrors(t *testing.T, r *Runner) {
	good, _ := job(t, "noop", protocol.Assign{})

	mismatch := *good
	mismatch.ModuleID = "sha256:" + strings.Repeat("0", 64)
	invalid := rawJob([]byte("\x00asm\x01\x00\x00\x00garbage"))
	noStart := rawJob(wasmtest.Module())
	noModule := rawJob(nil)
	noModule.Fetch = func(context.Context) ([]byte, error) {
		return nil, fmt.Errorf("fetch module: %w", wasmworker.ErrNoSuchModule)
	}
	// The network's or the server's trouble is the worker's: handed back,
	// charging the task nothing.
	unavailable := rawJob(nil)
	unavailable.Fetch = func(context.Context) ([]byte, error) { return nil, errors.New("503 Service Unavailable") }
	badID := *good
	badID.ModuleID = "md5:abc"

	for _, tc := range []struct {
		name   string
		job    *wasmworker.Job
		reason string
		msg    string
	}{
		{"hash mismatch", &mismatch, protocol.ReasonModule, "hash to sha256:"},
		{"invalid bytes", invalid, protocol.ReasonModule, "compiling"},
		{"no _start", noStart, protocol.ReasonModule, "_start"},
		{"no such module", noModule, protocol.ReasonModule, "no such module"},
		{"module unavailable", unavailable, protocol.ReasonWorker, "503"},
		{"bad module id", &badID, protocol.ReasonModule, "module id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := r.Run(context.Background(), tc.job)
			if o.Reason != tc.reason || !strings.Contains(o.Message, tc.msg) {
				t.Fatalf("Reason %q Message %q, want %s and %q", o.Reason, o.Message, tc.reason, tc.msg)
			}
		})
	}
}

func TestCancelSpin(t *testing.T) { eachMode(t, testCancelSpin) }

func testCancelSpin(t *testing.T, r *Runner) {
	j, _ := job(t, "spin", protocol.Assign{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *wasmworker.Outcome)
	go func() { done <- r.Run(ctx, j) }()
	time.Sleep(200 * time.Millisecond)
	cancelled := time.Now()
	cancel()
	select {
	case o := <-done:
		if o.Reason != protocol.ReasonCancelled {
			t.Fatalf("Reason %q (%s), want cancelled", o.Reason, o.Message)
		}
		// A spinning module never returns by itself: that Run returned
		// cancelled is the mechanism; how soon is a figure.
		t.Logf("Run returned %v after cancel", time.Since(cancelled))
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestCheckpointRestore(t *testing.T) {
	t.Parallel()
	eachMode(t, testCheckpointRestore)
}

func testCheckpointRestore(t *testing.T, r *Runner) {
	// 40 steps of 5 "ms" with a checkpoint due every millisecond. (tasks/counter
	// calibrates its ms for in-process mode: a step takes ~0.4 ms in a slot
	// process.)
	j, h := job(t, "counter", protocol.Assign{Args: []string{"40", "5"}, CkptMS: 1})
	o := r.Run(context.Background(), j)
	if o.Reason != "" {
		t.Fatalf("first run: %s: %s\n%s", o.Reason, o.Message, o.Log)
	}
	if got := outputs(o)["stdout"]; got != "counted 40 from 0\n" {
		t.Errorf("first run stdout %q", got)
	}
	if !strings.Contains(string(o.Log), "resumed from step 0") {
		t.Errorf("first run log %q", o.Log)
	}
	if len(h.checkpoints) == 0 {
		t.Fatalf("no checkpoints recorded; progress %v; log %s", h.progress, o.Log)
	}
	if len(h.progress) != 40 || h.progress[39] != 1 {
		t.Errorf("progress: %d reports, last %v", len(h.progress), h.progress[len(h.progress)-1])
	}
	last := h.checkpoints[len(h.checkpoints)-1]
	k := binary.LittleEndian.Uint64(last)
	if k == 0 || k > 40 {
		t.Fatalf("last checkpoint step %d", k)
	}

	// A second attempt restores the last checkpoint.
	j2, _ := job(t, "counter", protocol.Assign{Args: []string{"40", "5"}, Restore: protocol.Blob{Data: last}})
	o2 := r.Run(context.Background(), j2)
	if o2.Reason != "" {
		t.Fatalf("second run: %s: %s", o2.Reason, o2.Message)
	}
	if got, want := outputs(o2)["stdout"], fmt.Sprintf("counted 40 from %d\n", k); got != want {
		t.Errorf("second run stdout %q, want %q", got, want)
	}
	if want := fmt.Sprintf("resumed from step %d", k); !strings.Contains(string(o2.Log), want) {
		t.Errorf("second run log %q, want %q", o2.Log, want)
	}

	// Without CkptMS a checkpoint is never due; a refused checkpoint is
	// reported to the task.
	j3, h3 := job(t, "counter", protocol.Assign{Args: []string{"3", "0"}})
	if o3 := r.Run(context.Background(), j3); o3.Reason != "" || len(h3.checkpoints) != 0 {
		t.Errorf("CkptMS 0: reason %q, %d checkpoints", o3.Reason, len(h3.checkpoints))
	}
	j4, h4 := job(t, "counter", protocol.Assign{Args: []string{"6", "2"}, CkptMS: 1})
	h4.refuse = true
	o4 := r.Run(context.Background(), j4)
	if o4.Reason != "" || !strings.Contains(string(o4.Log), "checkpoint refused") {
		t.Errorf("refused checkpoints: reason %q, log %q", o4.Reason, o4.Log)
	}
}

func TestDeterminism(t *testing.T) { eachMode(t, testDeterminism) }

func testDeterminism(t *testing.T, r *Runner) {
	run := func(seed uint64) map[string]string {
		j, _ := job(t, "echo", protocol.Assign{Seed: seed, Args: []string{"x"}})
		o := r.Run(context.Background(), j)
		if o.Reason != "" {
			t.Fatalf("%s: %s", o.Reason, o.Message)
		}
		return outputs(o)
	}
	a, b, c := run(42), run(42), run(43)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("same seed, different outputs:\n%v\n%v", a, b)
	}
	if a["det.txt"] == c["det.txt"] {
		t.Errorf("different seeds, same det.txt %q", a["det.txt"])
	}
	t.Logf("det.txt (seed 42):\n%s", a["det.txt"])
}

func TestDeterministicSources(t *testing.T) {
	var c deterministicClock
	if got := c.nanotime(); got != 1_000_000 {
		t.Errorf("first nanotime %d", got)
	}
	if s, ns := c.walltime(); s != 1_700_000_000 || ns != 2_000_000 {
		t.Errorf("walltime %d.%09d", s, ns)
	}
	c.nanosleep(1_500_000_000)
	if got := c.nanotime(); got != 1_503_000_000 {
		t.Errorf("nanotime after sleep %d", got)
	}
	// SplitMix64 with seed 0: the first outputs are known values.
	s := splitMix64{state: 0}
	var b [16]byte
	s.Read(b[:3])
	s.Read(b[3:16])
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4}
	for i, w := range want {
		if got := binary.LittleEndian.Uint64(b[8*i:]); got != w {
			t.Errorf("output %d = %#x, want %#x", i, got, w)
		}
	}
}

func TestConcurrentCompileOnce(t *testing.T) {
	r, err := New(context.Background(), Config{CacheDir: cacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	var fetches atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		j, _ := job(t, "noop", protocol.Assign{})
		fetch := j.Fetch
		j.Fetch = func(ctx context.Context) ([]byte, error) {
			fetches.Add(1)
			return fetch(ctx)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o := r.Run(context.Background(), j); o.Reason != "" {
				t.Errorf("%s: %s", o.Reason, o.Message)
			}
		}()
	}
	wg.Wait()
	if n := fetches.Load(); n != 1 {
		t.Errorf("module fetched %d times, want 1", n)
	}
}

// rawJob is a job for module bytes b.
func rawJob(b []byte) *wasmworker.Job {
	sum := sha256.Sum256(b)
	return &wasmworker.Job{
		Assign:   &protocol.Assign{},
		ModuleID: "sha256:" + hex.EncodeToString(sum[:]),
		Fetch:    func(context.Context) ([]byte, error) { return b, nil },
	}
}

func TestCloseStopsRuns(t *testing.T) {
	r, err := New(context.Background(), Config{CacheDir: cacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	j, _ := job(t, "spin", protocol.Assign{})
	done := make(chan *wasmworker.Outcome)
	go func() { done <- r.Run(context.Background(), j) }()
	time.Sleep(200 * time.Millisecond)
	if err := r.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.Reason != protocol.ReasonWorker {
		t.Errorf("Reason %q (%s), want worker", o.Reason, o.Message)
	}
	j2, _ := job(t, "noop", protocol.Assign{})
	if o := r.Run(context.Background(), j2); o.Reason != protocol.ReasonWorker {
		t.Errorf("Run after Close: Reason %q, want worker", o.Reason)
	}
}

// An attempt records whether its task used /in and /out (touchFS): one
// that did not needs no look at either directory afterwards.
func TestTouchedDirs(t *testing.T) {
	r := sharedRunner(t, true)
	var mu sync.Mutex
	touched := map[string][2]bool{}
	testAttemptEnded = func(a *attempt) {
		mu.Lock()
		defer mu.Unlock()
		touched[a.job.ModuleID] = [2]bool{a.touched.in, a.touched.out}
	}
	defer func() { testAttemptEnded = nil }()
	noop := rawJob(wasmtest.Noop())
	echo, _ := job(t, "echo", protocol.Assign{Args: []string{"x"}})
	for _, j := range []*wasmworker.Job{noop, echo} {
		if o := r.Run(context.Background(), j); o.Reason != "" {
			t.Fatalf("%s: %s", o.Reason, o.Message)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := touched[noop.ModuleID]; got != [2]bool{} {
		t.Errorf("the empty module: /in, /out touched %v, want neither", got)
	}
	if got := touched[echo.ModuleID]; got != [2]bool{true, true} {
		t.Errorf("echo: /in, /out touched %v, want both", got)
	}
}
