//go:build unix

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
)

// An owner deletes, with the CLI, a workflow that has ended: its status
// and outputs are gone, and data it read that the owner removed no longer
// counts against the quota. A running workflow is refused until
// cancelled.
func TestDeleteWorkflows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Modules count in the quota: room for them, and 2 to 3 MiB of data.
	modules := len(taskbuild.Bytes(t, "echo")) + len(taskbuild.Bytes(t, "spin"))
	p := newPlatform(t, "--data-quota", strconv.Itoa((modules+1<<20-1)>>20+2)) // MiB
	startWorker(t, "worker", 1, p.srv.url)
	echo := push(t, p.client, "echo")
	spin := push(t, p.client, "spin")
	dir := t.TempDir()
	data := filepath.Join(dir, "data.txt")
	if err := os.WriteFile(data, []byte(strings.Repeat("d", 1600<<10)), 0o644); err != nil {
		t.Fatal(err)
	}
	blob, err := p.client.PushData(ctx, data, false)
	if err != nil {
		t.Fatal(err)
	}
	done := submit(t, p.client, workflow("done", task{"name": "e", "module": echo, "stdin": map[string]any{"data": "x\n"},
		"files": map[string]any{"/data.txt": map[string]any{"blob": blob.ID}}}))
	if st := wait(t, p.client, done, time.Minute); st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s", st.State)
	}
	running := submit(t, p.client, workflow("running", task{"name": "s", "module": spin}))
	if err := p.client.RemoveData(ctx, blob.ID); err != nil {
		t.Fatal(err)
	}
	// The workflow still reads the data: 1.6 MiB more do not fit in 3.
	if _, err := p.client.PushData(ctx, writeFile(t, dir, "more.txt", strings.Repeat("m", 1600<<10)), false); err == nil {
		t.Fatal("data over the quota was accepted while a workflow holds the removed data")
	}
	env := []string{"CYCLEPOOL_SERVER=" + p.srv.url, "CYCLEPOOL_TOKEN=" + p.srv.token}
	out, err := runIn("", env, time.Minute, "delete", running)
	if err == nil || !strings.Contains(out, "still running: cancel it first") {
		t.Fatalf("delete of a running workflow: %v\n%s", err, out)
	}
	if out, err := runIn("", env, time.Minute, "delete", done[:8]); err != nil || !strings.Contains(out, "workflow "+done+" deleted") {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	var ae *client.APIError
	if _, err := p.client.Status(ctx, done); !errors.As(err, &ae) || ae.Status != 404 {
		t.Errorf("status of a deleted workflow: %v, want 404", err)
	}
	if _, err := p.client.PushData(ctx, writeFile(t, dir, "more.txt", strings.Repeat("m", 1600<<10)), false); err != nil {
		t.Errorf("data under the quota after the delete: %v", err)
	}
	if _, err := p.client.Cancel(ctx, running); err != nil {
		t.Fatal(err)
	}
	if out, err := runIn("", env, time.Minute, "delete", running); err != nil {
		t.Fatalf("delete once cancelled: %v\n%s", err, out)
	}
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// An owner removes modules with the CLI: its list no longer shows them, a
// workflow naming one is refused as unknown, and one nothing else holds is
// no longer served to workers; one the owner's workflow uses still is,
// and counts in the owner's quota until the workflow is deleted. Another
// owner cannot remove them.
func TestRemoveModules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	echo := push(t, p.client, "echo")
	spin := push(t, p.client, "spin")
	running := submit(t, p.client, workflow("running", task{"name": "s", "module": spin}))
	env := []string{"CYCLEPOOL_SERVER=" + p.srv.url, "CYCLEPOOL_TOKEN=" + p.srv.token}

	out, err := runCLI(t, p.db, "token", "create", "other")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	otherEnv := []string{"CYCLEPOOL_SERVER=" + p.srv.url, "CYCLEPOOL_TOKEN=" + strings.TrimSpace(out)}
	if out, err := runIn("", otherEnv, time.Minute, "module", "rm", echo); err == nil || !strings.Contains(out, "HTTP 404") {
		t.Fatalf("another owner's module rm: %v\n%s", err, out)
	}
	if out, err := runIn("", env, time.Minute, "module", "rm"); err == nil || !strings.Contains(out, "rm needs at least one module id") {
		t.Errorf("module rm without ids: %v\n%s", err, out)
	}
	if out, err := runIn("", env, time.Minute, "module", "rm", echo, spin); err != nil {
		t.Fatalf("module rm: %v\n%s", err, out)
	}
	if out, err := runIn("", env, time.Minute, "module", "list"); err != nil || strings.Contains(out, echo) || strings.Contains(out, spin) {
		t.Errorf("module list after rm: %v\n%s", err, out)
	}
	if out, err := runIn("", env, time.Minute, "module", "rm", echo); err == nil || !strings.Contains(out, "HTTP 404") {
		t.Errorf("module rm twice: %v\n%s", err, out)
	}
	b, _ := json.Marshal(workflow("again", task{"name": "e", "module": echo}))
	if _, err := p.client.Submit(ctx, b); err == nil || !strings.Contains(err.Error(), "unknown module "+echo) {
		t.Errorf("submit naming a removed module: %v, want unknown module", err)
	}
	served := func(id string) int {
		t.Helper()
		resp, err := http.Get(p.srv.url + "/modules/" + id)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := served(echo); st != http.StatusNotFound {
		t.Errorf("a removed module nothing holds: %d, want 404", st)
	}
	if st := served(spin); st != http.StatusOK {
		t.Errorf("a removed module a workflow uses: %d, want 200", st)
	}
	if _, err := p.client.Cancel(ctx, running); err != nil {
		t.Fatal(err)
	}
	if out, err := runIn("", env, time.Minute, "delete", running); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	if st := served(spin); st != http.StatusNotFound {
		t.Errorf("the module of a deleted workflow, removed before: %d, want 404", st)
	}
}
