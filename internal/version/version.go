// Package version says which build of cyclepool is running, from what the
// Go toolchain records in the binary (the module's version, or the VCS
// revision and time of a build from a checkout).
package version

import (
	"runtime/debug"
	"strings"
)

// String is the build's version: the module version when built as a
// module (go install …@v1.2.3), else "devel" followed by the short VCS
// revision, its commit time and "+dirty" when the tree had changes, as
// far as the binary records them.
func String() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, at string
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	parts := []string{"devel"}
	if rev != "" {
		parts = append(parts, rev[:min(12, len(rev))])
	}
	if at != "" {
		parts = append(parts, at)
	}
	v := strings.Join(parts, " ")
	if dirty {
		v += " +dirty"
	}
	return v
}
