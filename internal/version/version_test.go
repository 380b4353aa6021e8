package version

import (
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
