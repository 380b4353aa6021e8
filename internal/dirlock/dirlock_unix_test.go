//go:build unix

package dirlock

import "testing"

// One holder at a time: a second Take of the same directory is refused
// until the first is released; other directories are not held.
func TestTake(t *testing.T) {
	t.Parallel()
	dir, other := t.TempDir(), t.TempDir()
	release, ok := Take(dir)
	if !ok {
		t.Fatal("a free directory was not taken")
	}
	if _, ok := Take(dir); ok {
		t.Fatal("a directory held was taken again")
	}
	r2, ok := Take(other)
	if !ok {
		t.Fatal("another directory was not taken")
	}
	r2()
	release()
	r3, ok := Take(dir)
	if !ok {
		t.Fatal("a released directory was not taken")
	}
	r3()
}
