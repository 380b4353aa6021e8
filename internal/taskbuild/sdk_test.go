package taskbuild

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A task of an owner's own, in a module of its own, depends on the SDK
// module alone (through a replace, as docs/TASK_ABI.md tells, before the
// SDK is published) and builds for WASI without fetching anything.
func TestSDKIsAModuleOfItsOwn(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/sumsq\n\ngo 1.21\n\nrequire github.com/cyclepool/cyclepool/tasks/sdk v0.0.0\n\n" +
		"replace github.com/cyclepool/cyclepool/tasks/sdk => " + filepath.Join(root, "tasks", "sdk") + "\n"
	main := `package main

import (
	"fmt"

	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	sdk.Progress(1)
	_, ok := sdk.Restore()
	fmt.Println(ok, sdk.CheckpointDue())
}
`
	for name, text := range map[string]string{"go.mod": gomod, "main.go": main} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append([]string{"GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off"}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run([]string{"GOOS=wasip1", "GOARCH=wasm"}, "build", "-o", filepath.Join(dir, "sumsq.wasm"), ".")
	mods := strings.Fields(run(nil, "list", "-m", "all"))
	if strings.Join(mods, " ") != "example.com/sumsq github.com/cyclepool/cyclepool/tasks/sdk v0.0.0 => "+filepath.Join(root, "tasks", "sdk") {
		t.Errorf("the task's modules: %q, want itself and the SDK only", mods)
	}
}
