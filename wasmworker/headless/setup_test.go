package headless

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/archive"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// blobHost serves blobs by id as the server does, counting downloads and
// able to cut the first download of each short.
type blobHost struct {
	blobs     map[string][]byte
	gets      atomic.Int32
	cutFirst  atomic.Bool
	corrupted atomic.Bool
}

func (h *blobHost) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/blobs/")
	b, ok := h.blobs[id]
	if !ok || r.URL.Query().Get("k") != "cap" {
		http.NotFound(w, r)
		return
	}
	n := h.gets.Add(1)
	if n == 1 && h.cutFirst.Load() {
		// Half the bytes, then the connection dies.
		w.Header().Set("Content-Length", "100000000")
		w.Write(b[:len(b)/2])
		panic(http.ErrAbortHandler)
	}
	if h.corrupted.Swap(false) {
		bad := bytes.Clone(b)
		bad[len(bad)-1] ^= 1
		b = bad
	}
	http.ServeContent(w, r, "", inputTime, bytes.NewReader(b))
}

func (h *blobHost) add(b []byte) string {
	sum := sha256.Sum256(b)
	id := "sha256:" + hex.EncodeToString(sum[:])
	h.blobs[id] = b
	return id
}

func blobFile(path, id string, size int, archive, writable bool) protocol.File {
	return protocol.File{Path: path, Blob: id, Size: int64(size), URL: "/blobs/" + id + "?k=cap", Archive: archive, Writable: writable}
}

func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range []string{"lib/", "lib/a.txt", "lib/b.txt", "lib/link"} {
		switch {
		case strings.HasSuffix(name, "/"):
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755})
		case name == "lib/link":
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: "a.txt"})
		default:
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[name]))})
			tw.Write([]byte(files[name]))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// A task sees its env, starts in its cwd, reads the files it mounts (a
// blob, an archive, inline data, an upstream output at a path), cannot
// change a read-only blob, writes scratch files and declared outputs, and
// a blob is downloaded once for many attempts.
func TestSetup(t *testing.T) { eachMode(t, testSetup) }

func testSetup(t *testing.T, r *Runner) {
	host := &blobHost{blobs: map[string][]byte{}}
	srv := httptest.NewServer(host)
	defer srv.Close()
	genome := bytes.Repeat([]byte("ACGT"), 50000)
	gid := host.add(genome)
	tree := tarOf(t, map[string]string{"lib/a.txt": "alpha", "lib/b.txt": "beta"})
	tid := host.add(tree)
	params := `{"min": 3}`
	su := &protocol.Setup{
		Env: []string{"INDEX=/data/index", "LANG=C"},
		Cwd: "/work",
		Files: []protocol.File{
			blobFile("/data/genome.fa", gid, len(genome), false, false),
			blobFile("/data/index", tid, len(tree), true, false),
			{Path: "/work/params.json", Data: &params},
		},
		Outputs:      []string{"/work/counts.tsv"},
		ScratchBytes: 1 << 20,
	}
	args := []string{"env", "pwd", "cat", "params.json", "cat", "/work/part.txt", "stat", "/data/genome.fa",
		"ls", "/", "ls", "/data", "cat", "/data/index/lib/b.txt", "cat", "/data/index/lib/link",
		"write", "/data/genome.fa", "x", "rm", "/data/genome.fa", "mv", "/data", "/d2", "write", "/data/index/lib/new", "x",
		"write", "/work/counts.tsv", "A\t3", "write", "/tmp-file", "scratch", "cat", "/tmp-file"}
	j, _ := job(t, "fsprobe", protocol.Assign{Args: args, Setup: su,
		Inputs: []protocol.Blob{{Name: "/work/part.txt", Data: []byte("part three")}}})
	j.Server = srv.URL
	o := r.Run(context.Background(), j)
	if o.Reason != "" {
		t.Fatalf("%s: %s\n%s", o.Reason, o.Message, o.Log)
	}
	lines := strings.Split(strings.TrimSuffix(outputs(o)["stdout"], "\n"), "\n")
	want := []string{
		"INDEX=/data/index LANG=C PWD=/work",
		"/work",
		params,
		"part three",
		"200000 1700000000",
		"data in out work",
		"genome.fa index",
		"beta",
		"alpha",
		"error: open /data/genome.fa: read-only file system",
		"error: remove /data/genome.fa: operation not permitted",
		"error: rename /data /d2: operation not permitted",
		"error: open /data/index/lib/new: read-only file system",
		"ok",
		"ok",
		"scratch",
	}
	if len(lines) != len(want) {
		t.Fatalf("stdout:\n%s\nwant %d lines", strings.Join(lines, "\n"), len(want))
	}
	for i := range want {
		if lines[i] != want[i] && !(strings.HasPrefix(want[i], "error:") && strings.HasPrefix(lines[i], "error:")) {
			t.Errorf("line %d (%s): %q, want %q", i, args, lines[i], want[i])
		}
	}
	if got := outputs(o)["/work/counts.tsv"]; got != "A\t3" {
		t.Errorf("output /work/counts.tsv = %q, want the file the task wrote (outputs %v)", got, names(o))
	}
	// Again: the blobs come from the cache.
	before := host.gets.Load()
	for range 3 {
		j, _ := job(t, "fsprobe", protocol.Assign{Args: []string{"cat", "/data/index/lib/a.txt"}, Setup: su,
			Inputs: []protocol.Blob{{Name: "/work/part.txt", Data: nil}}})
		j.Server = srv.URL
		if o := r.Run(context.Background(), j); o.Reason != "" || outputs(o)["stdout"] != "alpha\n" {
			t.Fatalf("again: %s %s %q", o.Reason, o.Message, outputs(o)["stdout"])
		}
	}
	if n := host.gets.Load() - before; n != 0 {
		t.Errorf("%d more downloads for attempts of blobs in the cache, want none", n)
	}
}

// The scratch limit stops a task that writes too much outside /out.
func TestSetupScratchLimit(t *testing.T) {
	r := sharedRunner(t, true)
	j, _ := job(t, "fsprobe", protocol.Assign{Args: []string{"fill", "/big", "300000"},
		Setup: &protocol.Setup{ScratchBytes: 100000}})
	o := r.Run(context.Background(), j)
	if o.Reason != protocol.ReasonOutput || !strings.Contains(o.Message, "scratch limit of 100000 bytes") {
		t.Fatalf("%s: %s, want limit_output naming the scratch limit", o.Reason, o.Message)
	}
}

// A download cut off is resumed; one whose hash does not match is made
// again; a blob the server does not have fails the attempt, not the task,
// in words.
func TestSetupDownloadFaults(t *testing.T) {
	r, err := New(context.Background(), Config{CacheDir: cacheDir(), InProcess: true, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	host := &blobHost{blobs: map[string][]byte{}}
	srv := httptest.NewServer(host)
	defer srv.Close()
	data := bytes.Repeat([]byte("0123456789"), 30000)
	id := host.add(data)
	host.cutFirst.Store(true)
	run := func(f protocol.File) *protocol.Blob {
		t.Helper()
		j, _ := job(t, "fsprobe", protocol.Assign{Args: []string{"stat", "/d"}, Setup: &protocol.Setup{Files: []protocol.File{f}}})
		j.Server = srv.URL
		o := r.Run(context.Background(), j)
		if o.Reason != "" {
			return &protocol.Blob{Name: o.Reason + ": " + o.Message}
		}
		return &protocol.Blob{Name: "ok", Data: o.Outputs[0].Data}
	}
	if got := run(blobFile("/d", id, len(data), false, false)); got.Name != "ok" || string(got.Data) != "300000 1700000000\n" {
		t.Fatalf("after a cut download: %s %q", got.Name, got.Data)
	}
	if n := host.gets.Load(); n != 2 {
		t.Errorf("%d requests, want 2: the cut one and the rest", n)
	}
	other := host.add(bytes.Repeat([]byte("z"), 5000))
	host.corrupted.Store(true)
	if got := run(blobFile("/d", other, 5000, false, false)); got.Name != "ok" {
		t.Fatalf("after a corrupted download: %s", got.Name)
	}
	missing := "sha256:" + strings.Repeat("0", 64)
	if got := run(blobFile("/d", missing, 10, false, false)); !strings.HasPrefix(got.Name, protocol.ReasonWorker+": fetching data for /d") {
		t.Fatalf("a missing blob: %s", got.Name)
	}
}

// Two workers on one data directory do not share a cache: the second gets
// a private one inside, removed when it closes (and by the first worker to
// start after, had it died).
func TestDataCacheOneWorkerPerDirectory(t *testing.T) {
	dir := t.TempDir()
	a, err := newDataCache(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newDataCache(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.dir != dir || b.dir == dir || filepath.Dir(b.dir) != dir {
		t.Fatalf("caches at %s and %s, want %s and a directory inside it", a.dir, b.dir, dir)
	}
	b.close()
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Errorf("the private cache %s is still there after close (%v)", b.dir, err)
	}
	a.close()
	c, err := newDataCache(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if c.dir != dir {
		t.Errorf("after the first closed, a new cache is at %s, want %s", c.dir, dir)
	}
}

// A partial download (HEX.part) that no fetch is writing counts against
// the data cache's bound and goes first when the cache passes it, whether
// an earlier run left it or a download that gave up: otherwise each blob
// whose download was cut off or cancelled for good (a worker stopped, an
// attempt cancelled mid-way) kept its part on disk for ever, outside the
// bound.
func TestDataCacheEvictsPartialDownloads(t *testing.T) {
	host := &blobHost{blobs: map[string][]byte{}}
	good := host.add(bytes.Repeat([]byte("g"), 1000))
	cut := host.add(bytes.Repeat([]byte("c"), 2000))
	mux := http.NewServeMux()
	mux.Handle("/", host)
	mux.HandleFunc("/cut/", func(w http.ResponseWriter, r *http.Request) {
		// Every download of it dies half-way.
		w.Header().Set("Content-Length", "2000")
		w.Write(bytes.Repeat([]byte("c"), 1000))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tests := []struct {
		name    string
		setup   func(t *testing.T, c *dataCache) // leaves a part of 1000 bytes
		earlier bool                             // setup runs before the cache opens
	}{
		{"left by an earlier run", func(t *testing.T, c *dataCache) {
			if err := os.WriteFile(filepath.Join(c.dir, strings.TrimPrefix(cut, "sha256:")+".part"), bytes.Repeat([]byte("c"), 1000), 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"left by a download that gave up", func(t *testing.T, c *dataCache) {
			f := blobFile("/d", cut, 2000, false, false)
			f.URL = "/cut/" + cut
			if _, o := c.prepare(context.Background(), srv.URL, &protocol.Setup{Files: []protocol.File{f}}); o == nil {
				t.Fatal("a download cut off every time succeeded")
			}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.earlier {
				tc.setup(t, &dataCache{dir: dir})
			}
			c, err := newDataCache(dir, 1500, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			if !tc.earlier {
				tc.setup(t, c)
			}
			parts, _ := filepath.Glob(filepath.Join(dir, "*.part"))
			if len(parts) != 1 {
				t.Fatalf("partial downloads %v, want the one the setup left", parts)
			}
			if info, err := os.Stat(parts[0]); err != nil || info.Size() != 1000 {
				t.Fatalf("the partial download: %v %v, want 1000 bytes", info, err)
			}
			release, o := c.prepare(context.Background(), srv.URL, &protocol.Setup{Files: []protocol.File{blobFile("/g", good, 1000, false, false)}})
			if o != nil {
				t.Fatalf("prepare: %s: %s", o.Reason, o.Message)
			}
			release()
			var total int64
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
					total += info.Size()
				}
			}
			if total > c.max {
				t.Errorf("the cache holds %d bytes (%v), more than its bound of %d", total, entries, c.max)
			}
		})
	}
}

// An archive of as many links as it may hold, each to the next and the
// last to a file, unpacks as the kernel would follow them: the link to the
// file and the 40 before it (a chain of up to 40 more links) are second
// names of it, the others lead nowhere and are left out. Each link costs a lookup
// per link it follows, not a walk of all the links: that walk made this
// archive take some 13 minutes to unpack (0.3 s here), the data cache
// locked meanwhile, so that no attempt with a setup could start on the
// worker, whoever its owner.
func TestUnpackLongLinkChains(t *testing.T) {
	const n = archive.MaxEntries - 1
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("f"))
	name := func(i int) string { return fmt.Sprintf("l%05d", i) }
	for i := range n {
		target := name(i + 1)
		if i == n-1 {
			target = "f"
		}
		tw.WriteHeader(&tar.Header{Name: name(i), Typeflag: tar.TypeSymlink, Linkname: target})
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := unpackTree(bytes.NewReader(buf.Bytes()), dir); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	want := []string{"f"} // (in name order, as ReadDir lists)
	for i := n - 41; i < n; i++ {
		want = append(want, name(i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("unpacked %d entries (%v...), want the file and the %d links nearest it (%v...)",
			len(got), got[:min(len(got), 3)], len(want)-1, want[:3])
	}
	f, err1 := os.Stat(filepath.Join(dir, "f"))
	l, err2 := os.Stat(filepath.Join(dir, name(n-41)))
	if err1 != nil || err2 != nil || !os.SameFile(f, l) {
		t.Errorf("%s is not a second name of f (%v, %v)", name(n-41), err1, err2)
	}
}

// An archive being unpacked holds back only the attempts that need it:
// another attempt's archive is unpacked and its setup ready meanwhile.
// Unpacking held the whole data cache, so that one owner's large archive
// kept every attempt with a setup on the worker waiting, whoever its owner.
func TestUnpackHoldsOnlyItsOwnArchive(t *testing.T) {
	host := &blobHost{blobs: map[string][]byte{}}
	slow := host.add(tarOf(t, map[string]string{"lib/a.txt": "slow", "lib/b.txt": "s"}))
	other := host.add(tarOf(t, map[string]string{"lib/a.txt": "other", "lib/b.txt": "o"}))
	srv := httptest.NewServer(host)
	defer srv.Close()
	c, err := newDataCache(t.TempDir(), 1<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	started, unblock := make(chan struct{}), make(chan struct{})
	c.unpackHook = func(hexID string) {
		if "sha256:"+hexID == slow {
			close(started)
			<-unblock
		}
	}
	ctx := context.Background()
	slowDone := make(chan *wasmworker.Outcome, 1)
	go func() {
		release, o := c.prepare(ctx, srv.URL, &protocol.Setup{Files: []protocol.File{blobFile("/d", slow, len(host.blobs[slow]), true, false)}})
		if release != nil {
			release()
		}
		slowDone <- o
	}()
	<-started
	otherDone := make(chan *wasmworker.Outcome, 1)
	go func() {
		release, o := c.prepare(ctx, srv.URL, &protocol.Setup{Files: []protocol.File{blobFile("/d", other, len(host.blobs[other]), true, false)}})
		if release != nil {
			release()
		}
		otherDone <- o
	}()
	select {
	case o := <-otherDone:
		if o != nil {
			t.Fatalf("the other archive: %+v", o)
		}
	case <-time.After(time.Minute):
		t.Fatal("the other archive waited for the first one's unpacking")
	}
	close(unblock)
	if o := <-slowDone; o != nil {
		t.Fatalf("the slow archive: %+v", o)
	}
}
