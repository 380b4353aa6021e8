package headless

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// lastCount is the number at the end of the last line of an outfill log
// ("wrote 65536", "created 12"): how far the task got.
func lastCount(t *testing.T, o *wasmworker.Outcome) int64 {
	t.Helper()
	line := lastLine(o.Log)
	n, err := strconv.ParseInt(line[strings.LastIndexByte(line, ' ')+1:], 10, 64)
	if err != nil {
		t.Fatalf("last log line %q: %v", line, err)
	}
	return n
}

// dirSize adds up the sizes of the regular files under dir and counts its
// entries.
func dirSize(dir string) (bytes int64, entries int) {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		entries++
		if info, err := d.Info(); err == nil && d.Type().IsRegular() {
			bytes += info.Size()
		}
		return nil
	})
	return bytes, entries
}

// watchOut records, for in-process attempts of module id, what their /out
// held when they ended.
func watchOut(t *testing.T, id string) (get func() (bytes int64, entries int, seen bool)) {
	var mu sync.Mutex
	var b int64
	var n int
	var seen bool
	testAttemptEnded = func(a *attempt) {
		if a.job.ModuleID != id {
			return
		}
		bb, nn := dirSize(filepath.Join(a.dir, "out"))
		mu.Lock()
		defer mu.Unlock()
		b, n, seen = bb, nn, true
	}
	t.Cleanup(func() { testAttemptEnded = nil })
	return func() (int64, int, bool) {
		mu.Lock()
		defer mu.Unlock()
		return b, n, seen
	}
}

// A task that writes far more to /out than its output limit is stopped
// when it crosses the limit, with limit_output: its write that would cross
// it is never done, so /out never holds more than the limit. (It used to
// write all it wanted, 3,000 MiB into /dev/shm against a limit of 1 MiB,
// and fail only once it had exited.)
func TestOutWritesStopAtTheLimit(t *testing.T) {
	eachMode(t, func(t *testing.T, r *Runner) {
		const limit = 1 << 20
		j, _ := job(t, "outfill", protocol.Assign{Args: []string{"bytes", strconv.Itoa(256 << 20)},
			Limits: protocol.Limits{OutputBytes: limit}})
		get := watchOut(t, j.ModuleID)
		o := r.Run(context.Background(), j)
		if o.Reason != protocol.ReasonOutput {
			t.Fatalf("Reason %q (%s), want %s", o.Reason, o.Message, protocol.ReasonOutput)
		}
		if want := "output limit of 1048576 bytes"; !strings.Contains(o.Message, want) || !strings.Contains(o.Message, "/out/big") {
			t.Errorf("Message %q does not name the limit (%q) and the file", o.Message, want)
		}
		if n := lastCount(t, o); n > limit {
			t.Errorf("the task wrote %d bytes to /out before it was stopped, over the limit of %d", n, limit)
		}
		if b, _, seen := get(); seen && b > limit {
			t.Errorf("/out held %d bytes when the attempt ended, over the limit of %d", b, limit)
		}
	})
}

// A task that writes the same file again and again holds only its last
// version: bytes it no longer holds do not count against its limit.
func TestOutRewritesAreNotCountedTwice(t *testing.T) {
	eachMode(t, func(t *testing.T, r *Runner) {
		j, _ := job(t, "outfill", protocol.Assign{Args: []string{"rewrite", "100"},
			Limits: protocol.Limits{OutputBytes: 1 << 20}})
		o := r.Run(context.Background(), j)
		if o.Reason != "" {
			t.Fatalf("Reason %q (%s), want success", o.Reason, o.Message)
		}
		if m := outputs(o); len(m["again"]) != 64<<10 {
			t.Errorf("/out/again has %d bytes, want %d", len(m["again"]), 64<<10)
		}
	})
}

// A task that makes 60,000 files under /out is stopped at MaxOutEntries,
// with limit_output naming that limit. (Their names once made a result
// header of 5.4 MB, over the 1 MiB a frame's header may take: the server
// closed the socket, the worker reconnected and sent it again, and the task
// stayed running until cancelled.)
func TestOutFilesStopAtTheLimit(t *testing.T) {
	eachMode(t, func(t *testing.T, r *Runner) {
		j, _ := job(t, "outfill", protocol.Assign{Args: []string{"files", "60000"}})
		get := watchOut(t, j.ModuleID)
		o := r.Run(context.Background(), j)
		if o.Reason != protocol.ReasonOutput {
			t.Fatalf("Reason %q (%s), want %s", o.Reason, o.Message, protocol.ReasonOutput)
		}
		if want := "output limit of 1000 files and directories"; !strings.Contains(o.Message, want) {
			t.Errorf("Message %q does not name the limit (%q)", o.Message, want)
		}
		if n := lastCount(t, o); n > MaxOutEntries {
			t.Errorf("the task made %d files under /out, over the limit of %d", n, MaxOutEntries)
		}
		if _, n, seen := get(); seen && n > MaxOutEntries {
			t.Errorf("/out held %d entries when the attempt ended, over the limit of %d", n, MaxOutEntries)
		}
	})
}

// An uploading attempt leaves its large outputs in files for the worker,
// and small ones too once those kept for the result frame would pass
// protocol.InlineOutputBudget; the files hold what the task wrote.
func TestOutputsSpill(t *testing.T) { eachMode(t, testOutputsSpill) }

func testOutputsSpill(t *testing.T, r *Runner) {
	const small, n = protocol.UploadMinBytes - 1, 40 // 40 MiB in all
	args := []string{"fill", "/out/big", strconv.Itoa(3 * protocol.UploadMinBytes)}
	for i := range n {
		args = append(args, "fill", fmt.Sprintf("/out/s%02d", i), strconv.Itoa(small))
	}
	j, _ := job(t, "fsprobe", protocol.Assign{Args: args, Limits: protocol.Limits{OutputBytes: 1 << 30}})
	j.Upload = true
	o := r.Run(context.Background(), j)
	if o.Reason != "" {
		t.Fatalf("%s: %s\n%s", o.Reason, o.Message, o.Log)
	}
	inline := 0
	for _, b := range o.Outputs {
		inline += len(b.Data)
	}
	spilled := map[string]int64{}
	for _, f := range o.Files {
		st, err := os.Stat(f.Path)
		if err != nil || st.Size() != f.Size {
			t.Errorf("spilled %s: %v (size %d, want %d)", f.Name, err, st.Size(), f.Size)
		}
		os.Remove(f.Path)
		spilled[f.Name] = f.Size
	}
	if spilled["big"] != 3*protocol.UploadMinBytes {
		t.Errorf("the large output was not left in a file: %v", spilled)
	}
	if inline > protocol.InlineOutputBudget || len(o.Outputs)+len(o.Files) != n+2 {
		t.Errorf("%d bytes kept for the frame (budget %d), %d outputs and %d files, want %d in all",
			inline, protocol.InlineOutputBudget, len(o.Outputs), len(o.Files), n+2)
	}
}

// A task that writes one byte every 4 KiB (leaving holes, which take no
// room, between bytes that each take a page of the host's file system) is
// stopped at the write that takes its file past the limit, in /out as in
// its own tree: it counts for the size it gives the file, not for the
// byte it writes. (Counted for its bytes, each write took 4,096 times
// what it counted: a task with a scratch limit of 1 GiB could fill 4 TiB
// of the worker's /dev/shm or disk, and one with an output limit of 1 MiB
// 4 GiB before it exited.)
func TestSparseWritesStopAtTheLimit(t *testing.T) {
	const limit, stride, writes = 64 << 10, 4096, 64 // the 17th write passes the limit
	for _, tc := range []struct {
		name, path string
		assign     protocol.Assign
		want       string // in the message
	}{
		{"out", "/out/s", protocol.Assign{Limits: protocol.Limits{OutputBytes: limit}},
			"output limit of 65536 bytes exceeded: stdout and files under /out would add up to more (writing /out/s)"},
		{"scratch", "/s", protocol.Assign{Setup: &protocol.Setup{ScratchBytes: limit}},
			"scratch limit of 65536 bytes exceeded: the task's files outside /out would add up to more (writing /s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachMode(t, func(t *testing.T, r *Runner) {
				a := tc.assign
				for i := range writes {
					a.Args = append(a.Args, "writeat", tc.path, strconv.Itoa(i*stride), "x")
				}
				j, _ := job(t, "fsprobe", a)
				var held int64 = -1
				testAttemptEnded = func(a *attempt) {
					if a.job == j {
						held, _ = dirSize(a.dir)
					}
				}
				t.Cleanup(func() { testAttemptEnded = nil })
				o := r.Run(context.Background(), j)
				if o.Reason != protocol.ReasonOutput || !strings.Contains(o.Message, tc.want) {
					t.Fatalf("%s: %s, want %s: %q", o.Reason, o.Message, protocol.ReasonOutput, tc.want)
				}
				if held > limit { // (-1: in a slot process, not seen)
					t.Errorf("the attempt's files held %d bytes when it ended, over the limit of %d", held, limit)
				}
			})
		})
	}
}

// A task that leaves an output deeper than a host path can reach (it
// makes two chains of directories close to the bound, then moves one to
// the end of the other) fails with limit_output, its fault, not with reason
// worker: that charged no one and put the task back in the queue, to do
// the same on every worker, for ever.
func TestOutputPathsTooDeepForTheHost(t *testing.T) {
	long := strings.Repeat("d", 250)
	for _, tc := range []struct {
		name, dir string
		setup     *protocol.Setup
	}{
		{"out", "/out", nil},
		{"setup output", "/work", &protocol.Setup{Outputs: []string{"/work"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachMode(t, func(t *testing.T, r *Runner) {
				var args []string
				if tc.dir != "/out" {
					args = append(args, "mkdir", tc.dir)
				}
				// Two chains of 3,765 bytes each, one then moved to the
				// end of the other.
				chain := func(top string) string {
					args = append(args, "mkdir", top)
					for range 15 {
						top += "/" + long
						args = append(args, "mkdir", top)
					}
					return top
				}
				x, y := chain(tc.dir+"/x"), chain(tc.dir+"/y")
				args = append(args, "write", y+"/f", "deep", "mv", tc.dir+"/y", x+"/y")
				j, _ := job(t, "fsprobe", protocol.Assign{Args: args, Setup: tc.setup})
				o := r.Run(context.Background(), j)
				if o.Reason != protocol.ReasonOutput || !strings.Contains(o.Message, "too long") {
					t.Fatalf("%s: %s, want %s for a path too long", o.Reason, o.Message, protocol.ReasonOutput)
				}
			})
		})
	}
}
