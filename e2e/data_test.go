//go:build unix

package e2e

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/storage"
	"github.com/chromedp/chromedp"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasiref"
)

// A task's env, working directory and files (a data blob, an archive
// pushed from a directory, inline data, an upstream output at a path) read
// the same in a browser and on a headless worker, byte for byte; a blob
// several tasks mount reaches the page once; a browser task reads a 50 MB
// input and writes a 20 MB output.
func TestBrowserDataMatchesHeadless(t *testing.T) {
	t.Parallel()
	// A lease of 10 s: the page moves 50 MB on a machine busy with the other
	// tests, and a lost attempt never goes back to the same volunteer.
	p := newPlatform(t, "--lease", "10s")
	ctx := context.Background()
	probe := push(t, p.client, "fsprobe")

	// The owner's data: a 50 MB file and a directory with a link in it.
	work := t.TempDir()
	big := make([]byte, 50<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(big); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8 && i+k < len(big); k++ {
			big[i+k] = byte(v >> (8 * k))
		}
	}
	bigPath := filepath.Join(work, "big.bin")
	if err := os.WriteFile(bigPath, big, 0o644); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(work, "conf")
	os.MkdirAll(filepath.Join(tree, "sub"), 0o755)
	os.WriteFile(filepath.Join(tree, "a.txt"), []byte("alpha"), 0o644)
	os.WriteFile(filepath.Join(tree, "sub", "b.txt"), []byte("beta"), 0o644)
	os.Symlink("../a.txt", filepath.Join(tree, "sub", "link"))
	bigBlob, err := p.client.PushData(ctx, bigPath, false)
	if err != nil {
		t.Fatal(err)
	}
	treeBlob, err := p.client.PushData(ctx, tree, false)
	if err != nil {
		t.Fatal(err)
	}
	if !treeBlob.Archive {
		t.Fatalf("a directory was pushed as %+v, want an archive", treeBlob)
	}

	files := map[string]any{
		"/data/big.bin":  map[string]any{"blob": bigBlob.ID},
		"/etc/conf":      map[string]any{"blob": treeBlob.ID, "archive": true},
		"/work/own":      map[string]any{"blob": treeBlob.ID, "archive": true, "writable": true},
		"/work/p.json":   map[string]any{"data": `{"k": 3}`},
		"/work/part.txt": map[string]any{"from": "first"},
	}
	probeArgs := []string{"env", "pwd", "cat", "p.json", "cat", "part.txt", "ls", "/", "ls", "/etc/conf", "ls", "/etc/conf/sub",
		"cat", "/etc/conf/sub/link", "stat", "/data/big.bin", "sha", "/data/big.bin",
		"write", "/data/big.bin", "x", "rm", "/data/big.bin", "write", "/etc/conf/new", "x", "mv", "/etc", "/etc2",
		"append", "own/a.txt", "+more", "cat", "own/a.txt", "write", "out.txt", "mine", "fill", "/work/big-out", "20000000",
		"sha", "/work/big-out", "sock"}
	wf := workflow("data",
		task{"name": "first", "module": probe, "args": []string{"write", "/out/x", "y"}},
		task{"name": "probe", "module": probe, "args": probeArgs, "env": map[string]string{"LANG": "C", "MODE": "test"},
			"cwd": "/work", "files": files, "outputs": []string{"/work/out.txt", "/work/big-out"}},
		task{"name": "again", "module": probe, "args": []string{"stat", "/data/big.bin"}, "files": files},
	)

	proxy := newCountingProxy(t, p.srv.url)
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, proxy.url)
	id := submit(t, p.client, wf)
	st := wait(t, p.client, id, 3*time.Minute)
	if st.State != "done" {
		t.Fatalf("workflow in the browser ended %s: %+v", st.State, st.Tasks)
	}
	if n := proxy.count("/blobs/" + bigBlob.ID); n != 1 {
		t.Errorf("the page downloaded the 50 MB blob %d times for two tasks, want once", n)
	}
	browserOut := map[string]string{}
	for _, name := range []string{"stdout", "/work/out.txt", "/work/big-out"} {
		browserOut[name] = output(t, p.client, id, "probe", name)
	}
	lines := strings.Split(browserOut["stdout"], "\n")
	sum := sha256.Sum256(big)
	want := map[int]string{
		0:  "LANG=C MODE=test PWD=/work",
		1:  "/work",
		2:  `{"k": 3}`,
		3:  "ok", // first's stdout, "ok\n"
		4:  "",
		5:  "data etc in out work",
		6:  "a.txt sub",
		7:  "b.txt link",
		8:  "alpha",
		9:  fmt.Sprintf("%d 1700000000", len(big)),
		10: fmt.Sprintf("%d %x", len(big), sum),
		11: "error: open /data/big.bin: Read-only file system",
		12: "error: remove /data/big.bin: Operation not permitted",
		13: "error: open /etc/conf/new: Read-only file system",
		14: "error: rename /etc /etc2: Operation not permitted",
		16: "alpha+more",
	}
	for i, w := range want {
		if i >= len(lines) || lines[i] != w {
			t.Errorf("browser stdout line %d: %q, want %q\n%s", i, lines[min(i, len(lines)-1)], w, browserOut["stdout"])
		}
	}
	if got := browserOut["/work/out.txt"]; got != "mine" {
		t.Errorf("output /work/out.txt = %q", got)
	}
	if n := len(browserOut["/work/big-out"]); n != 20000000 {
		t.Errorf("output /work/big-out has %d bytes, want 20000000", n)
	}

	// The same on a headless worker.
	stopPage(t, b)
	startWorker(t, "headless", 2, p.srv.url)
	id2 := submit(t, p.client, wf)
	if st := wait(t, p.client, id2, 3*time.Minute); st.State != "done" {
		t.Fatalf("workflow on the headless worker ended %s: %+v", st.State, st.Tasks)
	}
	for name, w := range browserOut {
		if got := output(t, p.client, id2, "probe", name); got != w {
			if len(got) > 2000 {
				got, w = fmt.Sprintf("%d bytes", len(got)), fmt.Sprintf("%d bytes (equal: %v)", len(w), bytes.Equal([]byte(got), []byte(w)))
			}
			t.Errorf("%s differs:\nbrowser:  %q\nheadless: %q", name, w, got)
		}
	}
}

// A browser whose storage quota is full still runs a task that mounts
// data: the page empties its data cache to make room and, when that is not
// enough, goes on without keeping the blob.
func TestBrowserDataFullQuota(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "10s")
	probe := push(t, p.client, "fsprobe")
	var ids []string
	var sums []string
	for i := range 2 {
		data := bytes.Repeat([]byte{byte('a' + i)}, 8<<20)
		ids = append(ids, pushBytes(t, p.client, "d.bin", data))
		sums = append(sums, fmt.Sprintf("%d %x", len(data), sha256.Sum256(data)))
	}
	b := newBrowser(t, 1280, 900, charging)
	quota := float64(6 << 20) // the module fits; neither blob does
	if _, err := chromedp.Call(b.ctx, storage.OverrideQuotaForOrigin, storage.OverrideQuotaForOriginParams{Origin: p.srv.url, QuotaSize: &quota}); err != nil {
		t.Fatalf("override the quota: %v", err)
	}
	openVolunteerPage(t, b, p.srv.url)
	for i, id := range ids {
		wid := submit(t, p.client, workflow(fmt.Sprintf("quota-%d", i),
			task{"name": "t", "module": probe, "args": []string{"sha", "/d"}, "files": map[string]any{"/d": map[string]any{"blob": id}}}))
		st := wait(t, p.client, wid, 2*time.Minute)
		if st.State != "done" {
			t.Fatalf("blob %d with a full quota: workflow ended %s: %+v", i, st.State, st.Tasks)
		}
		if got := strings.TrimSpace(output(t, p.client, wid, "t", "stdout")); got != sums[i] {
			t.Errorf("blob %d read %q, want %q", i, got, sums[i])
		}
	}
	// The quota was met, and the page went on. (The page hears of its
	// worker's counts a moment after the results went to the server.)
	eventually(t, 30*time.Second, "the page's data counts to show both blobs fetched", func() bool { return b.status().Data.Fetched >= 2 })
	if d := b.status().Data; d.Fetched != 2 || d.Evicted == 0 || d.Unkept == 0 {
		t.Errorf("the page's data counts %+v: want 2 fetched, and the full quota met (evicted, unkept)", d)
	}
}

// A 128 MiB blob mounted into 50 tasks on two headless workers reaches each
// worker once, and the server's memory rises by less than three quarters of
// the blob's size throughout, upload included (held whole anywhere, it
// would rise by all of it).
func TestLargeDataOncePerWorker(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	ctx := context.Background()
	probe := push(t, p.client, "fsprobe")
	_, before := peakRSS(t, p.srv.cmd.Process.Pid)
	const size = 128 << 20
	path := filepath.Join(t.TempDir(), "big.bin")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	h := crc32.NewIEEE()
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 1<<20)
	for range size / len(buf) {
		for i := 0; i < len(buf); i += 8 {
			v := r.Uint64()
			for k := range 8 {
				buf[i+k] = byte(v >> (8 * k))
			}
		}
		f.Write(buf)
		h.Write(buf)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	sum := fmt.Sprintf("%d %08x", size, h.Sum32())
	blob, err := p.client.PushData(ctx, path, false)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(path)

	proxy := newCountingProxy(t, p.srv.url)
	for i := range 2 {
		w := start(t, fmt.Sprintf("worker-%d", i), "worker", "--server", proxy.url, "--slots", "2",
			"--cache-dir", compileCache(), "--data-dir", t.TempDir())
		if _, ok := w.out.waitFor(regexp.MustCompile(`msg=connected`), 30*time.Second); !ok {
			t.Fatalf("worker %d did not connect:\n%s", i, w.out)
		}
	}
	files := map[string]any{"/data/big.bin": map[string]any{"blob": blob.ID}}
	var tasks []task
	for i := range 50 {
		args := []string{"stat", "/data/big.bin"}
		if i%25 == 0 {
			args = []string{"crc", "/data/big.bin"}
		}
		tasks = append(tasks, task{"name": fmt.Sprintf("t%02d", i), "module": probe, "args": args, "files": files})
	}
	id := submit(t, p.client, workflow("big", tasks...))
	st := wait(t, p.client, id, 5*time.Minute)
	if st.State != "done" {
		t.Fatalf("workflow ended %s", st.State)
	}
	for _, name := range []string{"t00", "t25"} {
		if got := strings.TrimSpace(output(t, p.client, id, name, "stdout")); got != sum {
			t.Errorf("%s read %q, want %q", name, got, sum)
		}
	}
	if got := strings.TrimSpace(output(t, p.client, id, "t01", "stdout")); got != fmt.Sprintf("%d 1700000000", size) {
		t.Errorf("t01: %q", got)
	}
	if n := proxy.blobBytes.Load(); n > 2*size {
		t.Errorf("the server sent %d MiB of data for 50 tasks on 2 workers, want at most 2 x %d MiB", n>>20, size>>20)
	}
	peak, _ := peakRSS(t, p.srv.cmd.Process.Pid)
	t.Logf("data sent %d MiB for 50 tasks on 2 workers; server resident memory %d MiB before, %d MiB at its peak", proxy.blobBytes.Load()>>20, before>>20, peak>>20)
	if peak-before > 96<<20 {
		t.Errorf("the server's resident memory rose by %d MiB for a %d MiB blob, want under 96 MiB", (peak-before)>>20, size>>20)
	}
}

// The dashboard's Data page uploads a file (streamed into the database)
// and lists it by the name it had, refuses a hostile archive naming its
// entry; the Modules page shows the file name a module was uploaded with;
// and a done task names the worker that ran it.
func TestDashboardData(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	base := p.srv.url
	b := newBrowser(t, 1280, 900, "")
	b.signIn(base, p.srv.token)

	modPath := taskbuild.Build(t, "fsprobe")
	b.do(chromedp.Navigate(base+"/app/modules"), chromedp.SetUploadFiles(chromedp.ID("module"), []string{modPath}), chromedp.Click(chromedp.ID("upload")))
	b.waitJS(20*time.Second, "the module upload", `document.getElementById("upload-ok") || document.getElementById("upload-error")`)
	if e := b.text("#upload-error"); e != "" {
		t.Fatalf("module upload: %s", e)
	}
	if got := b.text("#modules"); !strings.Contains(got, "fsprobe.wasm") {
		t.Errorf("the modules page does not show the module's file name: %q", got)
	}

	dir := t.TempDir()
	data := bytes.Repeat([]byte("0123456789abcdef"), 300000) // 4.8 MB
	dataPath := filepath.Join(dir, "table.csv")
	if err := os.WriteFile(dataPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(base+"/app/data"), chromedp.SetUploadFiles(chromedp.ID("data"), []string{dataPath}), chromedp.Click(chromedp.ID("data-upload")))
	b.waitJS(20*time.Second, "the data upload", `document.getElementById("data-ok") || document.getElementById("data-error")`)
	if e := b.text("#data-error"); e != "" {
		t.Fatalf("data upload: %s", e)
	}
	id := fmt.Sprintf("sha256:%x", sha256.Sum256(data))
	if got := b.text("#blobs"); !strings.Contains(got, "table.csv") || !strings.Contains(got, id) {
		t.Errorf("the data page lists %q, want table.csv with its id %s", got, id)
	}

	// A tar with an entry that climbs out is refused, naming it.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "../evil.sh", Typeflag: tar.TypeReg, Mode: 0o755, Size: 2})
	tw.Write([]byte("hi"))
	tw.Close()
	evil := filepath.Join(dir, "evil.tar")
	os.WriteFile(evil, tb.Bytes(), 0o644)
	b.do(chromedp.Navigate(base+"/app/data"), chromedp.Click(`input[name="archive"]`), chromedp.SetUploadFiles(chromedp.ID("data"), []string{evil}),
		chromedp.Click(chromedp.ID("data-upload")))
	b.waitJS(20*time.Second, "the refusal", `document.getElementById("data-error") || document.getElementById("data-ok")`)
	if e := b.text("#data-error"); !strings.Contains(e, "../evil.sh") {
		t.Errorf("a hostile archive: %q, want a refusal naming ../evil.sh", e)
	}
	if got := b.text("#blobs"); strings.Contains(got, "evil.tar") {
		t.Errorf("the refused archive is listed: %q", got)
	}

	// A task that reads it, done, names its worker.
	binID := pushBytes(t, p.client, "b.bin", []byte("a\x00b"))
	startWorker(t, "headless", 1, base)
	mod := fmt.Sprintf("sha256:%x", sha256.Sum256(taskbuild.Bytes(t, "fsprobe")))
	wid := submit(t, p.client, workflow("dash-data", task{"name": "read", "module": mod,
		"args":    []string{"sha", "/d/table.csv", "write", "/out/pic.png", "not really a png"},
		"files":   map[string]any{"/d/table.csv": map[string]any{"blob": id}, "/work/b.bin": map[string]any{"blob": binID, "writable": true}},
		"outputs": []string{"/work/b.bin"}}))
	if st := wait(t, p.client, wid, time.Minute); st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	b.do(chromedp.Navigate(base + "/app/workflows/" + wid))
	b.waitJS(10*time.Second, "the workflow page", `document.querySelector("#tasks tbody tr")`)
	if w := b.text(`#tasks tbody tr .c-worker`); w == "" {
		t.Errorf("the done task's worker column is empty")
	}
	// Previews: text, an image (served as one), binary data.
	b.do(chromedp.Click(`a.preview[data-preview="stdout"]`))
	b.waitJS(10*time.Second, "the text preview", `document.getElementById("preview-text")`)
	if got, want := b.text("#preview-text"), fmt.Sprintf("%d %x", len(data), sha256.Sum256(data)); !strings.Contains(got, want) {
		t.Errorf("the stdout preview shows %q, want %q", got, want)
	}
	b.do(chromedp.Navigate(base + "/app/workflows/" + wid + "/tasks/read/preview/pic.png"))
	b.waitJS(10*time.Second, "the image preview", `document.getElementById("preview-image")`)
	var ct string
	b.eval(`fetch(document.getElementById("preview-image").src).then(r => r.headers.get("content-type"))`, &ct)
	if ct != "image/png" {
		t.Errorf("the image preview is served as %q, want image/png", ct)
	}
	b.do(chromedp.Navigate(base + "/app/workflows/" + wid + "/tasks/read/preview/work/b.bin"))
	b.waitJS(10*time.Second, "the binary preview", `document.getElementById("preview-binary")`)
	var downloaded string
	b.eval(`fetch(document.getElementById("download").href).then(r => r.text())`, &downloaded)
	if downloaded != "a\x00b" {
		t.Errorf("the download of output /work/b.bin gave %q", downloaded)
	}
}

// A worker of an older build (its hello does not say it lays out setups)
// gets no task with files, which it would run without them: a later plain
// task goes to it, the task with files waits for a worker that can.
func TestOldWorkerGetsNoTaskWithFiles(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	probe := push(t, p.client, "fsprobe")
	old := dialFakeHello(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1})
	withFiles := submit(t, p.client, workflow("with-files", task{"name": "f", "module": probe, "args": []string{"cat", "/etc/x"},
		"files": map[string]any{"/etc/x": map[string]any{"data": "from the workflow"}}}))
	plain := submit(t, p.client, workflow("plain", task{"name": "p", "module": probe, "args": []string{"pwd"}}))
	select {
	case fr := <-old.frames:
		if fr.Type != protocol.TypeAssign || len(fr.Assign) != 1 || !strings.HasPrefix(fr.Assign[0].Task, plain+"/") || fr.Assign[0].Setup != nil {
			t.Fatalf("the old worker got %+v, want the plain task alone", fr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the old worker got nothing")
	}
	st, err := p.client.Status(context.Background(), withFiles)
	if err != nil {
		t.Fatal(err)
	}
	if tk := st.Tasks[0]; tk.State != "ready" || tk.Attempts != 0 {
		t.Fatalf("the task with files is %s after %d attempts, want ready and untouched", tk.State, tk.Attempts)
	}
	startWorker(t, "headless", 1, p.srv.url)
	if st := wait(t, p.client, withFiles, time.Minute); st.State != "done" {
		t.Fatalf("the task with files ended %s", st.State)
	}
	if got := output(t, p.client, withFiles, "f", "stdout"); got != "from the workflow\n" {
		t.Errorf("the task read %q", got)
	}
}

// A task that reads an output uploaded over HTTP can only run where the
// worker lays out setups: an older worker finds it so once (its attempt
// goes back unstarted), and the plan keeps it from that worker from then
// on, rather than claiming it for it again and again.
func TestOldWorkerGetsNoTaskReadingUploads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	probe := push(t, p.client, "fsprobe")
	// A worker of today's build uploads the upstream task's output.
	up := dialFakeHello(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1,
		Features: []string{protocol.FeatureSetup, protocol.FeatureUpload}})
	id := submit(t, p.client, workflow("uploads",
		task{"name": "up", "module": probe, "args": []string{"pwd"}, "limits": map[string]any{"output_mib": 16}},
		task{"name": "down", "module": probe, "args": []string{"sha", "/in/big"}, "inputs": map[string]any{"big": map[string]any{"from": "up", "output": "big"}}}))
	a := up.next(t, protocol.TypeAssign, 30*time.Second).Assign[0]
	// Paused from now on, so that down is for the older worker alone.
	up.send(t, &protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{
		Running: []protocol.Progress{{Attempt: a.Attempt}}, Device: &protocol.Device{Paused: true}}})
	data := bytes.Repeat([]byte("uploaded "), 256<<10)
	u := fmt.Sprintf("%s/outputs/%d?name=big&w=%s&k=%s", p.srv.url, a.Attempt, up.welcome.WorkerID, up.welcome.UploadKey)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got protocol.Uploaded
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %s, %v", resp.Status, err)
	}
	up.send(t, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{Attempt: a.Attempt,
		Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("/\n")}}, Uploaded: []protocol.Uploaded{{Name: "big", Blob: got.Blob, Size: got.Size}}}}})
	if ack := up.ack(t, a.Attempt, protocol.AckResult, 30*time.Second); !ack.OK {
		t.Fatalf("the upstream result: %+v", ack)
	}

	old := dialFakeHello(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 4})
	onOld := func() (n int) {
		for _, at := range attempts(t, p.client, id, "down") {
			if at.Worker == old.welcome.WorkerID {
				n++
			}
		}
		return n
	}
	eventually(t, 30*time.Second, "the older worker to be tried once", func() bool { return onOld() >= 1 })
	// Rounds go on (a round a second at least, and one per wake-up), and
	// none claims down for it again.
	time.Sleep(3 * time.Second)
	if n := onOld(); n != 1 {
		t.Fatalf("down was claimed %d times for the older worker, want once", n)
	}
	select {
	case fr := <-old.frames:
		if fr.Type == protocol.TypeAssign {
			t.Fatalf("the older worker was sent %+v", fr.Assign)
		}
	default:
	}
	startWorker(t, "headless", 1, p.srv.url)
	if st := wait(t, p.client, id, time.Minute); st.State != "done" {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	sum := sha256.Sum256(data)
	if out, want := output(t, p.client, id, "down", "stdout"), fmt.Sprintf("%d %x\n", len(data), sum); out != want {
		t.Errorf("down read %q, want %q", out, want)
	}
}

// Locality: each worker says in its hello which data it keeps, and the
// dispatcher gives it the tasks that read that data: of tasks alternating
// between two blobs, each kept by one of two workers, nearly all run where
// their data is (in the order alone, half would; a worker left without
// tasks of its own data near the end takes the others', which is right).
func TestLocalityTasksGoToTheirData(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	probe := push(t, p.client, "fsprobe")
	holder := map[string]string{} // blob id -> the worker keeping it
	var ids []string
	for _, name := range []string{"a", "b"} {
		data := bytes.Repeat([]byte(name), 1<<20)
		id := pushBytes(t, p.client, name, data)
		ids = append(ids, id)
		holder[id] = startWorkerKeeping(t, "worker-"+name, p.srv.url, id, data)
	}
	const n = 32
	var tasks []task
	blobOf := map[string]string{}
	for i := range n {
		blob := ids[(i/2)%2] // a a b b a a b b ...
		name := fmt.Sprintf("t%02d", i)
		blobOf[name] = blob
		tasks = append(tasks, task{"name": name, "module": probe, "args": []string{"stat", "/d"},
			"files": map[string]any{"/d": map[string]any{"blob": blob}}})
	}
	submitted := time.Now()
	id := submit(t, p.client, workflow("locality", tasks...))
	if st := wait(t, p.client, id, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow ended %s", st.State)
	}
	checkLocality(t, p.client, id, submitted, blobOf, holder)
}

// checkLocality checks the locality rule on the tasks of workflow id
// (task name -> the blob it reads) and the workers keeping each blob
// (blob -> worker id): while a task reading a worker's data waited, that
// worker was given no other task. Not a share of tasks run where their
// data is: that depends on how fast each worker runs, which a busy machine
// changes; the rule does not. Only claims made while locality applied
// count: within sched.LocalityMaxWait of the submission (the queue's head
// became ready after submitted), and first attempts (a retried task is
// queued again). The dispatcher looks at the first 2 x slots + 16 ready
// tasks (candidateWindow in server/dispatcher.go): with more tasks of other
// data than that ahead of a worker's own, it would not see its own, so
// the tests keep each blob's tasks fewer.
func checkLocality(t *testing.T, c *client.Client, id string, submitted time.Time, blobOf, holder map[string]string) {
	t.Helper()
	type claim struct {
		task, worker string
		attempt      int64
		at           time.Time
	}
	var claims []claim
	for name := range blobOf {
		as, err := c.Attempts(context.Background(), id, name)
		if err != nil || len(as) == 0 || as[0].StartedAt == nil {
			t.Fatalf("attempts of %s: %+v %v", name, as, err)
		}
		claims = append(claims, claim{name, as[0].Worker, as[0].ID, *as[0].StartedAt})
	}
	slices.SortFunc(claims, func(a, b claim) int { return cmp.Compare(a.attempt, b.attempt) })
	waiting := map[string]int{} // blob -> its tasks not claimed yet
	for _, b := range blobOf {
		waiting[b]++
	}
	local, judged := 0, 0
	var broken []string
	for _, cl := range claims {
		blob := blobOf[cl.task]
		waiting[blob]--
		if !cl.at.Before(submitted.Add(sched.LocalityMaxWait)) {
			continue
		}
		judged++
		if holder[blob] == cl.worker {
			local++
			continue
		}
		for other, w := range holder {
			if w == cl.worker && waiting[other] > 0 {
				broken = append(broken, fmt.Sprintf("task %s (attempt %d) went to worker %s while %d tasks reading the data it keeps waited",
					cl.task, cl.attempt, cl.worker, waiting[other]))
			}
		}
	}
	if len(broken) > 0 {
		t.Errorf("%d of %d tasks went elsewhere while a task of their worker's data waited, the first: %s",
			len(broken), judged, strings.Join(broken[:min(3, len(broken))], "; "))
	}
	t.Logf("%d of %d tasks ran on the worker keeping their data (%d claimed while locality applied)", local, len(claims), judged)
	if judged == 0 {
		// The commit of the submission wakes the dispatcher, which claims
		// for the idle workers at once (tasks with files are not claimed
		// in the submission's own transaction: their setup is made
		// first), so only a stalled machine gets here: nothing to judge.
		t.Skipf("every claim came after locality stopped applying (%v after the submission): the machine stalled", sched.LocalityMaxWait)
	}
}

// The file system calls a task makes (directories, sparse writes, reads at
// an offset, truncation, seeking, times, links, renames, removal, read-only
// places) answer the same in a browser and on a headless worker, in a
// task's own tree and in /in and /out.
func TestBrowserFileSystemMatchesHeadless(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "10s")
	probe := push(t, p.client, "fsprobe")
	ops := []string{
		"mkdir", "d", "writeat", "d/f", "0", "hello", "writeat", "d/f", "10", "X", "readat", "d/f", "3", "10", "lsl", "d",
		"trunc", "d/f", "3", "seek", "d/f", "utime", "d/f", "1234567", "stat", "d/f",
		"link", "d/f", "d/g", "symlink", "f", "d/s", "mv", "d/f", "d/h", "lsl", "d", "rmdir", "d", "rm", "d/h", "rm", "d/g", "rmdir", "d",
		"ls", "/w", "append", "p.txt", "+x", "cat", "p.txt", "mkdir", "/in/x", "writeat", "/in/x", "0", "y", "lsl", "/",
		"writeat", "/out/a", "0", "hi", "mkdir", "/out/sub", "writeat", "/out/sub/b", "0", "yo", "lsl", "/out", "link", "/out/a", "/out/c",
		"mv", "/out/a", "/out/sub/a", "lsl", "/out/sub", "trunc", "/out/sub/b", "0", "lsl", "/out/sub", "rm", "/nothing", "rmdir", "/w/p.txt",
	}
	wf := workflow("fs",
		task{"name": "tree", "module": probe, "args": ops, "cwd": "/w", "files": map[string]any{"/w/p.txt": map[string]any{"data": "p"}}},
		task{"name": "plain", "module": probe, "args": []string{"writeat", "/out/a", "0", "hi", "mkdir", "/out/sub", "lsl", "/out",
			"link", "/out/a", "/out/c", "symlink", "a", "/out/s", "mv", "/out/a", "/out/sub/a", "lsl", "/out/sub", "writeat", "/in/x", "0", "y",
			"ls", "/", "pwd", "env"}},
	)
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	id := submit(t, p.client, wf)
	if st := wait(t, p.client, id, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow in the browser ended %s: %+v", st.State, st.Tasks)
	}
	browser := map[string]string{}
	for _, tk := range []string{"tree", "plain"} {
		browser[tk] = output(t, p.client, id, tk, "stdout")
	}
	stopPage(t, b)
	startWorker(t, "headless", 2, p.srv.url)
	id2 := submit(t, p.client, wf)
	if st := wait(t, p.client, id2, 2*time.Minute); st.State != "done" {
		t.Fatalf("workflow on the headless worker ended %s: %+v", st.State, st.Tasks)
	}
	for tk, want := range browser {
		for _, d := range wasiref.Diff("browser", want, "headless", output(t, p.client, id2, tk, "stdout")) {
			t.Errorf("task %s, %s", tk, d)
		}
	}
}

// A volunteer's page keeps data across visits (the Cache API) and says so
// in its hello: after a visit that read blob A, the next visit gets the
// tasks that read A, and a headless worker keeping blob B the others.
func TestBrowserLocalityAcrossVisits(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "10s")
	probe := push(t, p.client, "fsprobe")
	var ids []string
	var datas [][]byte
	for _, name := range []string{"a", "b"} {
		data := bytes.Repeat([]byte(name), 1<<20)
		ids, datas = append(ids, pushBytes(t, p.client, name, data)), append(datas, data)
	}
	readTask := func(name, blob string) task {
		return task{"name": name, "module": probe, "args": []string{"stat", "/d"}, "files": map[string]any{"/d": map[string]any{"blob": blob}}}
	}
	// First visit: the page reads A.
	b := newBrowser(t, 1280, 900, charging)
	openVolunteerPage(t, b, p.srv.url)
	if st := wait(t, p.client, submit(t, p.client, workflow("first", readTask("a", ids[0]))), time.Minute); st.State != "done" {
		t.Fatalf("first visit: %s", st.State)
	}
	var browserID string
	eventually(t, 10*time.Second, "the page's worker id", func() bool { browserID = b.status().Identity.ID; return browserID != "" })
	// The next visit, and a headless worker that kept B.
	b.do(chromedp.Navigate("about:blank"))
	openVolunteerPage(t, b, p.srv.url)
	headless := startWorkerKeeping(t, "headless", p.srv.url, ids[1], datas[1])
	const n = 16
	var tasks []task
	blobOf := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("t%02d", i)
		blobOf[name] = ids[(i/2)%2] // a a b b ...
		tasks = append(tasks, readTask(name, blobOf[name]))
	}
	submitted := time.Now()
	id := submit(t, p.client, workflow("second", tasks...))
	if st := wait(t, p.client, id, 2*time.Minute); st.State != "done" {
		t.Fatalf("second visit: %s", st.State)
	}
	t.Logf("the page's data counts: %+v", b.status().Data)
	checkLocality(t, p.client, id, submitted, blobOf, map[string]string{ids[0]: browserID, ids[1]: headless})
}

// pushBytes pushes data as a data blob, from a file named name as an owner
// would, and returns its id.
func pushBytes(t *testing.T, c *client.Client, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := c.PushData(context.Background(), path, false)
	if err != nil {
		t.Fatalf("push %s: %v", name, err)
	}
	return b.ID
}

// startWorkerKeeping starts a headless worker whose data cache kept blob id
// (data) from an earlier run, and returns its worker id. It takes one
// attempt at a time, without a queue: a worker that queued tasks ahead
// would take the other data's tasks while another worker runs one.
func startWorkerKeeping(t *testing.T, name, server, id string, data []byte) string {
	t.Helper()
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, strings.TrimPrefix(id, "sha256:")), data, 0o644); err != nil {
		t.Fatal(err)
	}
	w := start(t, name, "worker", "--server", server, "--slots", "1", "--queue", "0", "--max-queue", "0",
		"--cache-dir", compileCache(), "--data-dir", dataDir)
	line, ok := w.out.waitFor(regexp.MustCompile(`msg=connected .*worker=(\S+)`), 30*time.Second)
	if !ok {
		t.Fatalf("%s did not connect:\n%s", name, w.out)
	}
	return line
}

// The Data page uploads a whole directory as an archive, written as
// `cyclepool data push DIR` writes it: the same tree gets the same id.
func TestDashboardDirectoryUpload(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	base := p.srv.url
	b := newBrowser(t, 1280, 900, "")
	b.signIn(base, p.srv.token)
	dir := filepath.Join(t.TempDir(), "tree")
	blob := make([]byte, 3000)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	files := map[string][]byte{"a.txt": []byte("hello"), "sub/b": []byte("x"), "sub/deeper/c.bin": blob, "z.csv": []byte("1,2\n")}
	for name, data := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var want bytes.Buffer
	if err := client.WriteArchive(&want, dir); err != nil {
		t.Fatal(err)
	}
	wantID := fmt.Sprintf("sha256:%x", sha256.Sum256(want.Bytes()))

	b.do(chromedp.Navigate(base + "/app/data"))
	// The page's archive, byte for byte.
	var got string
	b.eval(`(async () => {
		const files = [["z.csv", "1,2\n"], ["sub/b", "x"], ["a.txt", "hello"]].map(([path, s]) => ({path, bytes: new TextEncoder().encode(s)}));
		const c = new Uint8Array(3000); for (let i = 0; i < c.length; i++) c[i] = (i * 7) & 255;
		files.push({path: "sub/deeper/c.bin", bytes: c});
		const buf = new Uint8Array(await cyclepoolData.tarOf(files).arrayBuffer());
		let s = ""; for (const x of buf) s += String.fromCharCode(x);
		return btoa(s);
	})()`, &got)
	if got != base64.StdEncoding.EncodeToString(want.Bytes()) {
		raw, _ := base64.StdEncoding.DecodeString(got)
		t.Fatalf("the page's archive (%d bytes) differs from the CLI's (%d bytes)", len(raw), want.Len())
	}
	// Chosen in the page, uploaded, listed.
	b.do(chromedp.SetUploadFiles(chromedp.ID("data-dir"), []string{dir}))
	b.waitJS(30*time.Second, "the directory upload", `document.getElementById("data-dir-status").className !== ""`)
	if st := b.text("#data-dir-status"); !strings.Contains(st, wantID) {
		t.Fatalf("the directory upload says %q, want the id %s", st, wantID)
	}
	bs, err := p.client.DataList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, bl := range bs {
		found = found || bl.ID == wantID && bl.Name == "tree" && bl.Archive
	}
	if !found {
		t.Errorf("blobs %+v, want the archive %s named tree", bs, wantID)
	}
}
