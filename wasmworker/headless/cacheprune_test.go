package headless

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// The compilation cache is kept within its bound, the modules read least
// recently going first, and a module unread for a month goes whatever the
// room; what stays is untouched.
func TestPruneCompileCacheKeepsItsBound(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	type file struct {
		name string // under dir
		size int
		read time.Duration // ago
	}
	for _, tc := range []struct {
		name  string
		files []file
		bound int64
		want  []string // left, sorted
	}{
		{"within the bound, all recent", []file{{"v1/a", 100, day}, {"v1/b", 100, 2 * day}}, 1000,
			[]string{"v1/a", "v1/b"}},
		{"over the bound: least recently read first", []file{{"v1/a", 400, day}, {"v1/b", 400, 3 * day}, {"v1/c", 400, 2 * day}}, 1000,
			[]string{"v1/a", "v1/c"}},
		{"unread for a month, whatever the room", []file{{"v1/a", 10, 31 * day}, {"v1/b", 10, 29 * day}}, 1000,
			[]string{"v1/b"}},
		{"an older wazero's directory goes first", []file{{"old/x", 600, 20 * day}, {"v2/y", 600, time.Hour}}, 1000,
			[]string{"v2/y"}},
		{"a file outside a version directory is left alone", []file{{"README", 5000, 40 * day}, {"v1/a", 10, day}}, 1000,
			[]string{"README", "v1/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				p := filepath.Join(dir, f.name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, make([]byte, f.size), 0o644); err != nil {
					t.Fatal(err)
				}
				at := now.Add(-f.read)
				if err := os.Chtimes(p, at, at); err != nil {
					t.Fatal(err)
				}
			}
			pruneCompileCache(dir, tc.bound, now, slog.New(slog.DiscardHandler))
			var left []string
			filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					rel, _ := filepath.Rel(dir, p)
					left = append(left, rel)
				}
				return nil
			})
			slices.Sort(left)
			if !slices.Equal(left, tc.want) {
				t.Errorf("left %v, want %v", left, tc.want)
			}
		})
	}
}
