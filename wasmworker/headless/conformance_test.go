package headless

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasiref"
)

// Every file-system call of WASI preview 1 answers in the runner as in
// plain wazero (tasks/wasiconf: flags, errnos, contents, listings by
// cookie, links), in /out and in the tree of a task with a setup, in both
// modes.
func TestWASIConformance(t *testing.T) {
	t.Parallel()
	eachMode(t, testWASIConformance)
}

// conformanceDirs are the trees tasks/wasiconf runs in: /out, and the root
// of a task with a setup.
var conformanceDirs = []struct {
	name  string
	guest string
	setup *protocol.Setup
}{
	{"out", "/out", nil},
	{"root of a setup", "/", &protocol.Setup{Cwd: "/"}},
}

func testWASIConformance(t *testing.T, r *Runner) {
	wasm := taskbuild.Bytes(t, "wasiconf")
	for _, tc := range conformanceDirs {
		t.Run(tc.name, func(t *testing.T) {
			want, err := wasiref.Run(context.Background(), wasm, cacheDir(), t.TempDir(), tc.guest, tc.guest)
			if err != nil {
				t.Fatal(err)
			}
			j, _ := job(t, "wasiconf", protocol.Assign{Args: []string{tc.guest}, Setup: tc.setup})
			o := r.Run(context.Background(), j)
			if o.Reason != "" {
				t.Fatalf("%s: %s\n%s", o.Reason, o.Message, o.Log)
			}
			for _, d := range wasiref.Diff("plain wazero", wasiref.Deviations(want), "runner", outputs(o)["stdout"]) {
				t.Error(d)
			}
		})
	}
}

// The inode numbers and times a task sees come from the task, not the
// host (tasks/wasiconf "values", fsView): two runs print the same values,
// in /out and in the tree of a task with a setup, in both modes, where
// plain wazero prints the host's.
func TestFileIdentityAndTimes(t *testing.T) { eachMode(t, testFileIdentityAndTimes) }

func testFileIdentityAndTimes(t *testing.T, r *Runner) {
	for _, tc := range conformanceDirs {
		t.Run(tc.name, func(t *testing.T) {
			var runs []string
			for range 2 {
				j, _ := job(t, "wasiconf", protocol.Assign{Args: []string{tc.guest, "values"}, Setup: tc.setup})
				o := r.Run(context.Background(), j)
				if o.Reason != "" {
					t.Fatalf("%s: %s\n%s", o.Reason, o.Message, o.Log)
				}
				runs = append(runs, outputs(o)["stdout"])
			}
			for _, d := range wasiref.Diff("first run", runs[0], "second run", runs[1]) {
				t.Error(d)
			}
			// The values are the task's: numbered from 1 as seen, at
			// inputTime until changed, a second name the same file, a
			// new file a new number.
			v := statValues(runs[0])
			epoch := fmt.Sprint(inputTime.UnixNano())
			for _, c := range []struct{ what, got, want string }{
				{"the directory's inode", v["dir"]["ino"], "1"},
				{"the directory's device", v["dir"]["dev"], "0"},
				{"the directory's time", v["dir"]["mtim"], epoch},
				{"the first file's inode", v["va made"]["ino"], "2"},
				{"a hard link's inode", v["vb"]["ino"], v["va made"]["ino"]},
				{"the time of a file made", v["va made"]["mtim"], v["dir after create"]["mtim"]},
				{"the access time set", v["va atim set"]["atim"], "1600000000000000000"},
			} {
				if c.got != c.want {
					t.Errorf("%s: %s, want %s\n%s", c.what, c.got, c.want, runs[0])
				}
			}
			if v["vc"]["ino"] == v["va made"]["ino"] || v["va written"]["mtim"] <= v["va made"]["mtim"] {
				t.Errorf("a new file reused an inode number, or a write left mtim as it was:\n%s", runs[0])
			}
		})
	}
}

// statValues reads the lines of wasiconf "values" that show a file
// ("NAME: ERRNO dev D ino I ..."): by name, each field's value.
func statValues(out string) map[string]map[string]string {
	m := map[string]map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		name, rest, ok := strings.Cut(l, ": ")
		f := strings.Fields(rest)
		if !ok || len(f) < 3 || f[1] != "dev" {
			continue
		}
		m[name] = map[string]string{}
		for i := 1; i+1 < len(f); i += 2 {
			m[name][f[i]] = f[i+1]
		}
	}
	return m
}
