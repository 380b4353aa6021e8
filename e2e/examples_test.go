//go:build unix

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/cyclepool/cyclepool/internal/taskbuild"
)

// TestExamplesOnTheEmbeddedDatabase does what the README tells a new user
// to do, with the processes a user runs: `cyclepool serve` on its embedded
// PostgreSQL with a local worker (make run's command, no --database-url),
// then, through the CLI, submits every workflow of examples/ as it is (the
// CLI pushes the module paths it names, found from the current directory),
// follows one with `status --watch`, waits for each with `wait` and
// downloads the outputs with `results -o`. The outputs are checked against
// computations of their own: the prime counts against a sieve, the
// Mandelbrot montage against its tiles, the inspection report against the
// anomaly reports it combines. Stopping the server stops its PostgreSQL;
// started again on the same data dir, it still has the three workflows.
func TestExamplesOnTheEmbeddedDatabase(t *testing.T) {
	t.Parallel()
	root, err := taskbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	examples := []string{"primes", "mandelbrot", "inspection", "wordcount"}

	// The user's directory: the modules where `make build` puts them.
	work := t.TempDir()
	for _, ex := range examples {
		for _, m := range exampleModules(t, filepath.Join(root, "examples", ex+".json")) {
			dst := filepath.Join(work, m)
			if _, err := os.Stat(dst); err == nil {
				continue
			}
			name := strings.TrimSuffix(filepath.Base(m), ".wasm")
			data, err := os.ReadFile(taskbuild.Build(t, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	data := filepath.Join(t.TempDir(), "data")
	shareCompileCache(t, data)
	serve := func() *server {
		// A port of its own each time: while the first server stops,
		// another test may take its port.
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		p := start(t, "serve", "serve", "--addr", addr, "--data-dir", data, "--local-worker", "2")
		tok, ok := p.out.waitFor(tokenRE, 120*time.Second)
		if !ok {
			t.Fatalf("serve on the embedded PostgreSQL did not start:\n%s", p.out)
		}
		return &server{proc: p, url: "http://" + addr, token: tok}
	}
	srv := serve()
	if _, ok := srv.out.waitFor(regexp.MustCompile(`msg=connected component=local-worker`), 30*time.Second); !ok {
		t.Fatalf("the local worker did not connect:\n%s", srv.out)
	}
	env := []string{"CYCLEPOOL_SERVER=" + srv.url, "CYCLEPOOL_TOKEN=" + srv.token}
	cli := func(args ...string) string {
		t.Helper()
		out, err := runIn(work, env, 5*time.Minute, args...)
		if err != nil {
			t.Fatalf("cyclepool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	// The primes example goes last, so that its counting tasks wait behind
	// the others' while the watch below starts: the first of the four, it
	// could be done before.
	ids := map[string]string{}
	for _, ex := range append(slices.Clone(examples[1:]), examples[0]) {
		args := []string{"submit", filepath.Join(root, "examples", ex+".json")}
		if ex == examples[1] {
			// Submitted and waited for in one command (its exit status
			// says done), as a user of an interactive workflow would.
			args = append(args, "--wait", "4m")
		}
		ids[ex] = strings.TrimSpace(cli(args...))
	}
	// A pipe, not a terminal: --watch prints a line per change of state.
	watched := make(chan string, 1)
	go func() {
		out, err := runIn(work, env, 5*time.Minute, "status", ids["primes"], "--watch")
		if err != nil {
			out += "\n" + err.Error()
		}
		watched <- out
	}()
	for _, ex := range examples {
		cli("wait", ids[ex], "--timeout", "4m")
		cli("results", ids[ex], "-o", filepath.Join(work, "out", ex))
	}
	// Again into the same directory: every file there has its output's
	// bytes, so none is downloaded (If-None-Match with its hash) or
	// written again.
	again, long := filepath.Join(work, "out", examples[0]), time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	files := 0
	touch := func(check bool) {
		t.Helper()
		err := filepath.WalkDir(again, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			if !check {
				files++
				return os.Chtimes(p, long, long)
			}
			if fi, err := os.Stat(p); err != nil || !fi.ModTime().Equal(long) {
				t.Errorf("%s was written again by a second results (%v)", p, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	touch(false)
	cli("results", ids[examples[0]], "-o", again)
	touch(true)
	if files == 0 {
		t.Fatalf("no file in %s", again)
	}
	select {
	case out := <-watched:
		// A line per change of state; the counting tasks may be running
		// already when the watch starts, the sum not (it waits for them).
		// The sum takes milliseconds: its running state may fall between
		// two updates of the stream, and its line say blocked -> done.
		for _, want := range []string{`(?m)^\S+ task count-\d+: (ready -> )?running \(attempt 1/3\)$`,
			`(?m)^\S+ task sum: (blocked|ready|running) -> done$`,
			`(?m)^\S+ workflow ` + ids["primes"] + ` done after `} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("status --watch printed no line matching %s:\n%s", want, out)
			}
		}
	case <-time.After(30 * time.Second):
		t.Error("status --watch did not end with its workflow")
	}

	out := func(ex, task, name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(work, "out", ex, task, name))
		if err != nil {
			t.Fatalf("results of %s: %v", ex, err)
		}
		return b
	}
	checkPrimes(t, examplePrimeRanges(t, filepath.Join(root, "examples", "primes.json")), out)
	checkMandelbrot(t, out)
	checkInspection(t, out)
	checkWordcount(t, filepath.Join(root, "examples", "data"), out)

	// Stopped, the server stops its PostgreSQL; started again, it has kept
	// every workflow.
	srv.stop()
	if !strings.Contains(srv.out.String(), "PostgreSQL stopped") {
		t.Errorf("the server stopped without stopping its PostgreSQL:\n%s", srv.out)
	}
	pid := filepath.Join(data, "postgres", "data", "postmaster.pid")
	if _, err := os.Stat(pid); !os.IsNotExist(err) {
		t.Errorf("%s is still there after the server stopped (%v)", pid, err)
	}
	srv = serve()
	env = []string{"CYCLEPOOL_SERVER=" + srv.url, "CYCLEPOOL_TOKEN=" + srv.token}
	list := cli("list", "--state", "done")
	for ex, id := range ids {
		if !strings.Contains(list, id) {
			t.Errorf("workflow %s (%s) is not listed done after a restart:\n%s", ex, id, list)
		}
	}
}

// exampleTask is what these checks read of a task of an example.
type exampleTask struct {
	Name   string   `json:"name"`
	Module string   `json:"module"`
	Args   []string `json:"args"`
}

func exampleTasks(t *testing.T, file string) []exampleTask {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var wf struct {
		Tasks []exampleTask `json:"tasks"`
	}
	if err := json.Unmarshal(b, &wf); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return wf.Tasks
}

// exampleModules lists the module paths an example names.
func exampleModules(t *testing.T, file string) []string {
	t.Helper()
	var ms []string
	seen := map[string]bool{}
	for _, tk := range exampleTasks(t, file) {
		if !seen[tk.Module] && !strings.HasPrefix(tk.Module, "sha256:") {
			seen[tk.Module] = true
			ms = append(ms, tk.Module)
		}
	}
	return ms
}

// examplePrimeRanges maps each counting task of primes.json to its range.
func examplePrimeRanges(t *testing.T, file string) map[string][2]int {
	t.Helper()
	rs := map[string][2]int{}
	for _, tk := range exampleTasks(t, file) {
		if !strings.HasSuffix(tk.Module, "/primes.wasm") {
			continue
		}
		lo, err1 := strconv.Atoi(tk.Args[0])
		hi, err2 := strconv.Atoi(tk.Args[1])
		if err1 != nil || err2 != nil {
			t.Fatalf("task %s: args %v are not a range", tk.Name, tk.Args)
		}
		rs[tk.Name] = [2]int{lo, hi}
	}
	return rs
}

// checkPrimes compares every count, and their sum, with a sieve's.
func checkPrimes(t *testing.T, ranges map[string][2]int, out func(ex, task, name string) []byte) {
	t.Helper()
	top := 0
	for _, r := range ranges {
		top = max(top, r[1])
	}
	composite := make([]bool, top+1)
	composite[0], composite[1] = true, true
	for i := 2; i*i <= top; i++ {
		if !composite[i] {
			for j := i * i; j <= top; j += i {
				composite[j] = true
			}
		}
	}
	total := 0
	for task, r := range ranges {
		want := 0
		for n := r[0]; n < r[1]; n++ {
			if !composite[n] {
				want++
			}
		}
		total += want
		if got := strings.TrimSpace(string(out("primes", task, "stdout"))); got != strconv.Itoa(want) {
			t.Errorf("primes %s counted %q in [%d, %d), want %d", task, got, r[0], r[1], want)
		}
	}
	if got := strings.TrimSpace(string(out("primes", "sum", "stdout"))); got != strconv.Itoa(total) {
		t.Errorf("primes sum is %q, want %d", got, total)
	}
}

// checkMandelbrot decodes the 16 tiles and the montage, which must be the
// tiles laid out 4 by 4.
func checkMandelbrot(t *testing.T, out func(ex, task, name string) []byte) {
	t.Helper()
	decode := func(task, name string) image.Image {
		img, err := png.Decode(bytes.NewReader(out("mandelbrot", task, name)))
		if err != nil {
			t.Fatalf("mandelbrot %s/%s is not a PNG: %v", task, name, err)
		}
		return img
	}
	montage := decode("montage", "image.png")
	if b := montage.Bounds(); b.Dx() != 4*256 || b.Dy() != 4*256 {
		t.Fatalf("montage is %v, want 1024x1024", b)
	}
	for r := range 4 {
		for c := range 4 {
			tile := decode(fmt.Sprintf("tile-r%d-c%d", r, c), "tile.png")
			if b := tile.Bounds(); b.Dx() != 256 || b.Dy() != 256 {
				t.Fatalf("tile r%d-c%d is %v, want 256x256", r, c, b)
			}
			colours := map[[4]uint32]bool{}
			for y := 0; y < 256; y += 5 {
				for x := 0; x < 256; x += 5 {
					tr, tg, tb, ta := tile.At(tile.Bounds().Min.X+x, tile.Bounds().Min.Y+y).RGBA()
					mr, mg, mb, ma := montage.At(montage.Bounds().Min.X+256*c+x, montage.Bounds().Min.Y+256*r+y).RGBA()
					if [4]uint32{tr, tg, tb, ta} != [4]uint32{mr, mg, mb, ma} {
						t.Fatalf("montage differs from tile r%d-c%d at (%d, %d)", r, c, x, y)
					}
					colours[[4]uint32{tr, tg, tb, ta}] = true
				}
			}
			if len(colours) < 2 {
				t.Errorf("tile r%d-c%d is one colour", r, c)
			}
		}
	}
}

// checkInspection compares the report with the anomaly reports of the
// captures it combines.
func checkInspection(t *testing.T, out func(ex, task, name string) []byte) {
	t.Helper()
	var report struct {
		Reports        int            `json:"reports"`
		Captures       []string       `json:"captures"`
		AnomaliesTotal int            `json:"anomalies_total"`
		ByCapture      map[string]int `json:"by_capture"`
		Anomalies      []struct {
			CaptureID string `json:"capture_id"`
		} `json:"anomalies"`
	}
	if err := json.Unmarshal(out("inspection", "report", "stdout"), &report); err != nil {
		t.Fatalf("inspection report: %v", err)
	}
	if report.Reports != 4 || len(report.Captures) != 4 {
		t.Errorf("the report combines %d reports of captures %v, want 4", report.Reports, report.Captures)
	}
	total := 0
	for i := 11; i <= 14; i++ {
		var an struct {
			CaptureID string            `json:"capture_id"`
			Anomalies []json.RawMessage `json:"anomalies"`
		}
		if err := json.Unmarshal(out("inspection", fmt.Sprintf("anomaly-%d", i), "stdout"), &an); err != nil {
			t.Fatalf("anomaly-%d: %v", i, err)
		}
		if want := fmt.Sprintf("capture-%04d", i); an.CaptureID != want {
			t.Errorf("anomaly-%d reports capture %q, want %q", i, an.CaptureID, want)
		}
		if got := report.ByCapture[an.CaptureID]; got != len(an.Anomalies) {
			t.Errorf("the report counts %d anomalies for %s, its anomaly task found %d", got, an.CaptureID, len(an.Anomalies))
		}
		total += len(an.Anomalies)
	}
	if total == 0 {
		t.Error("the inspection found no anomaly at all")
	}
	if report.AnomaliesTotal != total || len(report.Anomalies) != total {
		t.Errorf("the report has %d anomalies (%d listed), its anomaly tasks found %d", report.AnomaliesTotal, len(report.Anomalies), total)
	}
}

// checkWordcount checks the word counts of wordcount.json (four parts of a
// corpus mounted from a data blob, stop words from a mounted directory,
// reduced) against a count of the whole corpus made here, and the top
// words the reduce wrote in its working directory.
func checkWordcount(t *testing.T, dataDir string, out func(ex, task, name string) []byte) {
	t.Helper()
	corpus, err := os.ReadFile(filepath.Join(dataDir, "corpus.txt"))
	if err != nil {
		t.Fatal(err)
	}
	stopList, err := os.ReadFile(filepath.Join(dataDir, "wordcount-conf", "stopwords.txt"))
	if err != nil {
		t.Fatal(err)
	}
	stop := map[string]bool{}
	for _, w := range strings.Fields(string(stopList)) {
		stop[w] = true
	}
	want := map[string]int{}
	for _, w := range strings.FieldsFunc(strings.ToLower(string(corpus)), func(r rune) bool { return !unicode.IsLetter(r) }) {
		if !stop[w] {
			want[w]++
		}
	}
	got := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out("wordcount", "reduce", "counts.tsv"))), "\n") {
		w, n, _ := strings.Cut(line, "\t")
		got[w], _ = strconv.Atoi(n)
	}
	if len(got) != len(want) {
		t.Errorf("wordcount: %d distinct words, want %d", len(got), len(want))
	}
	for w, n := range want {
		if got[w] != n {
			t.Errorf("wordcount: %q counted %d times, want %d", w, got[w], n)
			break
		}
	}
	top := strings.Split(strings.TrimSpace(string(out("wordcount", "reduce", "work/top.txt"))), "\n")
	if len(top) != 20 {
		t.Fatalf("wordcount: top.txt has %d lines, want 20 ($TOP)", len(top))
	}
	var first string
	var firstN int
	for w, n := range want {
		if n > firstN || n == firstN && w < first {
			first, firstN = w, n
		}
	}
	if top[0] != fmt.Sprintf("%d %s", firstN, first) {
		t.Errorf("wordcount: the top word is %q, want \"%d %s\"", top[0], firstN, first)
	}
}
