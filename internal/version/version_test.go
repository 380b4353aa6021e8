package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

// A test binary is a devel build: its version says so, and is never
// empty.
func TestString(t *testing.T) {
	if v := String(); !strings.HasPrefix(v, "devel") && v != "unknown" {
		t.Errorf("version %q: want a devel build", v)
	}
}

// What each kind of build says, whether the toolchain stamped the VCS
// information (Go 1.24 and later also derive a version from it) or not
// (-buildvcs=false, or a module downloaded by go install).
func TestOf(t *testing.T) {
	vcs := func(dirty string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "a8b746d7cf5280648ae043c04cc9a2f8361f4077"},
			{Key: "vcs.time", Value: "2026-11-27T15:24:13Z"}, {Key: "vcs.modified", Value: dirty}}
	}
	for _, tc := range []struct {
		name     string
		version  string
		settings []debug.BuildSetting
		want     string
	}{
		{"no VCS information", "(devel)", nil, "devel"},
		{"a checkout, stamped without a version", "(devel)", vcs("false"), "devel a8b746d7cf52 2026-11-27T15:24:13Z"},
		{"a checkout, with the pseudo-version Go derives", "v0.0.0-20261127152413-a8b746d7cf52", vcs("false"),
			"devel a8b746d7cf52 2026-11-27T15:24:13Z"},
		{"a checkout with changes", "v0.0.0-20261127152413-a8b746d7cf52+dirty", vcs("true"),
			"devel a8b746d7cf52 2026-11-27T15:24:13Z +dirty"},
		{"a checkout after a tag, with changes", "v1.2.1-0.20261127152413-a8b746d7cf52+dirty", vcs("true"),
			"devel a8b746d7cf52 2026-11-27T15:24:13Z +dirty"},
		{"a checkout at a release tag", "v1.2.0", vcs("false"), "v1.2.0"},
		{"go install …@v1.2.3", "v1.2.3", nil, "v1.2.3"},
		{"go install …@commit", "v0.0.0-20261127152413-a8b746d7cf52", nil, "v0.0.0-20261127152413-a8b746d7cf52"},
	} {
		info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/cyclepool/cyclepool", Version: tc.version}, Settings: tc.settings}
		if got := of(info); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
