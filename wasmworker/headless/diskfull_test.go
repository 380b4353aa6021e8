package headless

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// A worker whose compilation cache cannot be written (its disk is full;
// here the cache's directory is replaced by a file once the cache is open)
// still runs the task, compiled in memory: that is the worker's trouble,
// not the module's, and must not fail the attempt with ReasonModule, which
// the task would be charged for. (In-process: a slot process runs the same
// engine code.)
func TestUnwritableCacheStillRuns(t *testing.T) {
	dir := t.TempDir()
	r, err := New(context.Background(), Config{CacheDir: dir, InProcess: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 || !entries[0].IsDir() {
		t.Fatalf("cache directory holds %v (%v), want wazero's one directory", entries, err)
	}
	sub := filepath.Join(dir, entries[0].Name())
	if err := os.RemoveAll(sub); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sub, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	j, _ := job(t, "echo", protocol.Assign{Stdin: protocol.Blob{Data: []byte("hello")}})
	o := r.Run(context.Background(), j)
	if o.Reason != "" {
		t.Fatalf("attempt failed: %s: %s", o.Reason, o.Message)
	}
	if got := outputs(o)["stdout"]; got != "hello" {
		t.Errorf("stdout %q", got)
	}
}
