package server

import (
	"strings"
	"testing"
)

// A session key is hex of at least 32 bytes, or none; anything else is an
// error that names what is wrong (serve then refuses to start).
func TestParseSessionKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		n    int
		errs string
	}{
		{"", 0, ""},
		{strings.Repeat("ab", 32), 32, ""},
		{strings.Repeat("ab", 31), 0, "has 31 bytes, want at least 32"},
		{"not hex at all, not hex at all, not hex at all, not hex at all!!", 0, "not hex"},
	} {
		key, err := ParseSessionKey(tc.in)
		if len(key) != tc.n || (err == nil) != (tc.errs == "") || (err != nil && !strings.Contains(err.Error(), tc.errs)) {
			t.Errorf("ParseSessionKey(%q) = %d bytes, %v; want %d, %q", tc.in, len(key), err, tc.n, tc.errs)
		}
	}
}
