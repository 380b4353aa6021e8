//go:build !unix

package headless

// lockDataDir cannot lock on this system: every worker keeps a data cache
// of its own.
func lockDataDir(dir string) (release func(), ok bool) { return nil, false }
