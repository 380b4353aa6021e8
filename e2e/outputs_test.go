//go:build unix

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasiref"
)

// A headless task writes a 128 MiB output: the worker uploads it over
// HTTP (the result frame only names it), it arrives intact (its hash
// checked by the owner's download and by two downstream tasks, one
// reading it under /in and one at a path of its own), and the server's
// memory stays bounded throughout.
func TestLargeOutputOverHTTP(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	startWorker(t, "worker", 2, p.srv.url)
	fill, probe := push(t, p.client, "outfill"), push(t, p.client, "fsprobe")
	const size = 128 << 20
	h := crc32.NewIEEE()
	chunk := []byte(strings.Repeat("b", 64<<10))
	for range size / len(chunk) {
		h.Write(chunk)
	}
	want := fmt.Sprintf("%d %08x", size, h.Sum32())
	_, before := peakRSS(t, p.srv.cmd.Process.Pid)
	id := submit(t, p.client, workflow("big-output",
		task{"name": "make", "module": fill, "args": []string{"bytes", strconv.Itoa(size)}},
		task{"name": "in", "module": probe, "args": []string{"crc", "/in/big"},
			"inputs": map[string]any{"big": map[string]any{"from": "make", "output": "big"}}},
		task{"name": "path", "module": probe, "args": []string{"crc", "/data/big"},
			"files": map[string]any{"/data/big": map[string]any{"from": "make", "output": "big"}}},
	))
	st := wait(t, p.client, id, 5*time.Minute)
	if st.State != "done" {
		for _, tk := range st.Tasks {
			t.Logf("%s: %s %s", tk.Name, tk.State, tk.Error)
		}
		t.Fatalf("workflow ended %s", st.State)
	}
	for _, name := range []string{"in", "path"} {
		if got := strings.TrimSpace(output(t, p.client, id, name, "stdout")); got != want {
			t.Errorf("%s read %q, want %q", name, got, want)
		}
	}
	r, err := p.client.Output(context.Background(), id, "make", "big")
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	n, err := io.Copy(h, r)
	r.Close()
	if got := fmt.Sprintf("%d %x", n, h.Sum(nil)); err != nil || got != want {
		t.Errorf("downloaded %q (%v), want %q", got, err, want)
	}
	// The dashboard previews it from its first bytes, not the whole.
	cookie, _ := dashSession(t, p.srv.url, p.srv.token)
	resp, page := dashRequest(t, http.MethodGet, p.srv.url+"/app/workflows/"+id+"/tasks/make/preview/big", cookie, nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, strings.Repeat("b", 1000)) || !strings.Contains(page, "128.0 MiB") {
		t.Errorf("preview of the output: %d\n%.2000s", resp.StatusCode, page)
	}
	// It travelled over HTTP, not in a frame.
	if up := metricFloat(t, p.srv.url, "cyclepool_output_upload_bytes_total"); up < size {
		t.Errorf("the server stored %d bytes of uploaded outputs, want at least %d", int64(up), size)
	}
	// Held whole anywhere, the output would take the server's memory
	// 128 MiB up; it streams, so the peak stays far below (a rise, not
	// an absolute bound: the test runs beside others, whose load moves
	// the server's baseline).
	peak, _ := peakRSS(t, p.srv.cmd.Process.Pid)
	t.Logf("server resident memory: %d MiB before the workflow, %d MiB at its peak", before>>20, peak>>20)
	if peak-before > 96<<20 {
		t.Errorf("the server's resident memory rose by %d MiB during a %d MiB output, want under 96 MiB", (peak-before)>>20, size>>20)
	}
}

// metricFloat reads one unlabelled value from a server's /metrics.
func metricFloat(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// A browser task reads a 50 MB input from a blob and writes a 20 MiB
// output, which the page uploads over HTTP; a second task on the page
// reads that output back under /in.
func TestBrowserLargeInputAndOutput(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "10s")
	probe := push(t, p.client, "fsprobe")
	in := make([]byte, 50_000_000)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range in {
		in[i] = byte(r.Uint32())
	}
	blob := pushBytes(t, p.client, "in.bin", in)
	const outSize = 20 << 20
	sum := func(b []byte) string { return fmt.Sprintf("%d %08x", len(b), crc32.ChecksumIEEE(b)) }
	wantIn, wantOut := sum(in), sum(bytes.Repeat([]byte("x"), outSize))
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	id := submit(t, p.client, workflow("browser-big",
		task{"name": "big", "module": probe, "args": []string{"crc", "/data/in.bin", "fill", "/out/big", strconv.Itoa(outSize)},
			"files": map[string]any{"/data/in.bin": map[string]any{"blob": blob}}},
		task{"name": "check", "module": probe, "args": []string{"crc", "/in/big"},
			"inputs": map[string]any{"big": map[string]any{"from": "big", "output": "big"}}},
	))
	st := wait(t, p.client, id, 3*time.Minute)
	if st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	if got := strings.TrimSpace(output(t, p.client, id, "big", "stdout")); got != wantIn+"\nok" {
		t.Errorf("the browser task printed %q, want %q", got, wantIn+"\nok")
	}
	if got := strings.TrimSpace(output(t, p.client, id, "check", "stdout")); got != wantOut {
		t.Errorf("the downstream task read %q, want %q", got, wantOut)
	}
	if got := sum([]byte(output(t, p.client, id, "big", "big"))); got != wantOut {
		t.Errorf("downloaded %q, want %q", got, wantOut)
	}
	if up := metricFloat(t, p.srv.url, "cyclepool_output_upload_bytes_total"); up < outSize {
		t.Errorf("the server stored %d bytes of uploaded outputs, want at least %d: the page did not upload", int64(up), outSize)
	}
}

// Every file-system call of WASI preview 1 answers in the browser's shim
// as in plain wazero (tasks/wasiconf), in /out and in the tree of a task
// with a setup, apart from the documented deviations (wasiref.Deviations);
// the headless runner is held to the same in TestWASIConformance.
func TestBrowserWASIConformance(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "10s")
	conf, probe := push(t, p.client, "wasiconf"), push(t, p.client, "fsprobe")
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	spec := workflow("conformance",
		task{"name": "out", "module": conf, "args": []string{"/out"}},
		task{"name": "root", "module": conf, "args": []string{"/"}, "env": map[string]any{"X": "1"}},
		task{"name": "times", "module": probe, "args": []string{"write", "/out/x", "hi", "stat", "/out/x"}},
		task{"name": "values-out", "module": conf, "args": []string{"/out", "values"}},
		task{"name": "values-root", "module": conf, "args": []string{"/", "values"}, "env": map[string]any{"X": "1"}},
	)
	id := submit(t, p.client, spec)
	if st := wait(t, p.client, id, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	// A file the task makes has the task's own time on a page (its clock
	// starts at 1 700 000 000 s), not the page's.
	if got := strings.TrimSpace(output(t, p.client, id, "times", "stdout")); got != "ok\n2 1700000000" {
		t.Errorf("a file written on the page: %q, want ok and size 2 at 1700000000", got)
	}
	for name, guest := range map[string]string{"out": "/out", "root": "/"} {
		want, err := wasiref.Run(context.Background(), taskbuild.Bytes(t, "wasiconf"), compileCache(), t.TempDir(), guest, guest)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range wasiref.Diff("plain wazero", wasiref.Deviations(want), "browser", output(t, p.client, id, name, "stdout")) {
			t.Errorf("%s, %s", name, d)
		}
	}

	// The same workflow (so the same seeds, which decide how often the Go
	// runtime reads the clock) on a headless worker prints the same, value
	// for value: neither runner takes inode numbers or times from its host.
	ph := newPlatform(t, "--lease", "10s")
	push(t, ph.client, "wasiconf")
	push(t, ph.client, "fsprobe")
	startWorker(t, "worker", 1, ph.srv.url)
	hid := submit(t, ph.client, spec)
	if st := wait(t, ph.client, hid, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow on the headless worker ended %s: %+v", st.State, st.Tasks)
	}
	for _, name := range []string{"out", "root", "times", "values-out", "values-root"} {
		headless, browser := output(t, ph.client, hid, name, "stdout"), output(t, p.client, id, name, "stdout")
		if strings.HasPrefix(name, "values") && !strings.Contains(headless, "dir: 0 dev 0 ino 1 ") {
			t.Errorf("%s on the headless worker: the directory is not the first file seen:\n%s", name, headless)
		}
		for _, d := range wasiref.Diff("headless", headless, "browser", browser) {
			t.Errorf("%s, %s", name, d)
		}
	}
}

// A checkpoint of 20 MiB is uploaded over HTTP (the checkpoint frame
// names it), and the next attempt downloads it and resumes from it,
// intact; on a worker and on a page alike.
func TestLargeCheckpointOverHTTP(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "10s")
	fill := push(t, p.client, "outfill")
	const size = 20 << 20
	st := make([]byte, size)
	for i := range st {
		st[i] = byte(i * 31 % 251)
	}
	want := fmt.Sprintf("restored %d %x", size, sha256.Sum256(st))
	task := task{"name": "resume", "module": fill, "args": []string{"resume", strconv.Itoa(size)}, "max_attempts": 2,
		"limits": map[string]any{"memory_mib": 256}}
	startWorker(t, "worker", 1, p.srv.url)
	id := submit(t, p.client, workflow("checkpoint", task))
	if st := wait(t, p.client, id, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	if got := strings.TrimSpace(output(t, p.client, id, "resume", "stdout")); got != want {
		t.Errorf("the second attempt printed %q, want %q", got, want)
	}
	if up := metricFloat(t, p.srv.url, "cyclepool_output_upload_bytes_total"); up < size {
		t.Errorf("the server stored %d bytes uploaded over HTTP, want the %d of the checkpoint", int64(up), size)
	}

	// The same on volunteers' pages: the first fails after its checkpoint
	// (and is kept from the task since), the second resumes from it.
	pb := newPlatform(t, "--lease", "10s")
	task["module"] = push(t, pb.client, "outfill")
	first := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, first, pb.srv.url)
	id = submit(t, pb.client, workflow("checkpoint", task))
	eventually(t, time.Minute, "the first page's checkpoint and failure", func() bool {
		st, err := pb.client.Status(context.Background(), id)
		return err == nil && len(st.Tasks) == 1 && st.Tasks[0].Checkpoints > 0 && st.Tasks[0].Attempts == 1 && st.Tasks[0].State == "ready"
	})
	second := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, second, pb.srv.url)
	if st := wait(t, pb.client, id, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow in the browser ended %s: %+v", st.State, st.Tasks)
	}
	if got := strings.TrimSpace(output(t, pb.client, id, "resume", "stdout")); got != want {
		t.Errorf("the page's second attempt printed %q, want %q", got, want)
	}
	if up := metricFloat(t, pb.srv.url, "cyclepool_output_upload_bytes_total"); up < size {
		t.Errorf("the server stored %d bytes the page uploaded, want the %d of the checkpoint", int64(up), size)
	}
}
