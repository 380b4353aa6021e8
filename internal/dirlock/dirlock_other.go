//go:build !unix

package dirlock

// Take cannot lock on this system: it reports false, and every process
// keeps a directory of its own.
func Take(dir string) (release func(), ok bool) { return nil, false }
