//go:build unix

package server

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// Two servers given one directory for their module files (two replicas
// with one --data-dir) do not clear or evict each other's: the first holds
// it, and the second spools in a directory of its own, which its close
// removes. Before, the second cleared the first's files as it started and
// wrote files of the same names.
func TestModuleSpoolDirectoryOfAnotherProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	spool := func(m *moduleSpool, id string, fill byte) string {
		t.Helper()
		f, release, err := m.acquire(ctx, id, func(context.Context) (int64, error) { return 10, nil },
			func(context.Context) ([]byte, error) { return bytes.Repeat([]byte{fill}, 10), nil })
		if err != nil {
			t.Fatal(err)
		}
		release()
		return f.Name()
	}
	first, second := newModuleSpool(dir, 1000, 100), newModuleSpool(dir, 1000, 100)
	own := spool(first, "a", 'a')
	if filepath.Dir(own) != dir {
		t.Fatalf("the first spool wrote %s, not in the directory it was given (%s)", own, dir)
	}
	other := spool(second, "a", 'b')
	if filepath.Dir(other) == dir {
		t.Fatalf("the second spool wrote %s in the directory the first holds", other)
	}
	if b, err := os.ReadFile(own); err != nil || !bytes.Equal(b, bytes.Repeat([]byte{'a'}, 10)) {
		t.Errorf("the first spool's file after the second started: %q, %v", b, err)
	}
	if err := second.close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(other)); !os.IsNotExist(err) {
		t.Errorf("the second spool's own directory is left after its close: %v", err)
	}
	if err := first.close(); err != nil {
		t.Fatal(err)
	}
	// Given back: a spool that comes next takes the directory.
	third := newModuleSpool(dir, 1000, 100)
	if got := spool(third, "b", 'c'); filepath.Dir(got) != dir {
		t.Errorf("a spool after the first closed wrote %s, not in %s", got, dir)
	}
	third.close()
}
