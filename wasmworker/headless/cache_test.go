package headless

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// cacheFiles lists the files under dir with their size and time of change.
func cacheFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files[p] = fmt.Sprintf("%d bytes, changed %s", info.Size(), info.ModTime().Format(time.RFC3339Nano))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A module is compiled once per machine: the first runner on a cache
// directory writes the compiled code there (only wazero's compiler engine
// does), and a later runner, a new runtime in a new process for the
// isolated runner's slot processes, reads it and writes nothing.
func TestCompilationCacheOnDisk(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
	}{
		{"isolated", Config{}},
		{"in-process", Config{InProcess: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			run := func() {
				t.Helper()
				cfg := tc.cfg
				cfg.CacheDir = dir
				r, err := New(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close(context.Background())
				j, _ := job(t, "counter", protocol.Assign{Args: []string{"3", "1"}})
				if o := r.Run(context.Background(), j); o.Reason != "" {
					t.Fatalf("%s: %s", o.Reason, o.Message)
				}
			}
			run()
			first := cacheFiles(t, dir)
			if len(first) == 0 {
				t.Fatal("the first runner left nothing in its compilation cache")
			}
			run()
			if again := cacheFiles(t, dir); !maps.Equal(first, again) {
				t.Errorf("the second runner changed the cache:\nbefore %v\nafter  %v", first, again)
			}
		})
	}
}
