package headless

import (
	"context"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasiref"
)

// Every file-system call of WASI preview 1 answers in the runner as in
// plain wazero (tasks/wasiconf: flags, errnos, contents, listings by
// cookie, links), in /out and in the tree of a task with a setup, in both
// modes.
func TestWASIConformance(t *testing.T) { eachMode(t, testWASIConformance) }

func testWASIConformance(t *testing.T, r *Runner) {
	wasm := taskbuild.Bytes(t, "wasiconf")
	for _, tc := range []struct {
		name  string
		guest string
		setup *protocol.Setup
	}{
		{"out", "/out", nil},
		{"root of a setup", "/", &protocol.Setup{Cwd: "/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := wasiref.Run(context.Background(), wasm, t.TempDir(), tc.guest, tc.guest)
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
