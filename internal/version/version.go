// Package version says which build of cyclepool is running, from what the
// Go toolchain records in the binary (the module's version, or the VCS
// revision and time of a build from a checkout).
package version

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// String is the build's version: the module version when built as a
// module (go install …@v1.2.3) or from a checkout at a release tag, else
// "devel" followed by the short VCS revision, its commit time and "+dirty"
// when the tree had changes, as far as the binary records them.
func String() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return of(info)
}

// localVersion matches the versions Go (1.24 and later) derives for a
// build from a checkout that is not at a release tag: a pseudo-version,
// "+dirty" when the tree had changes.
var localVersion = regexp.MustCompile(`\d{14}-[0-9a-f]{12}(\+dirty)?$|\+dirty$`)

// of is String for the given build information.
func of(info *debug.BuildInfo) string {
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
	if v := info.Main.Version; v != "" && v != "(devel)" && (rev == "" || !localVersion.MatchString(v)) {
		return v
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
