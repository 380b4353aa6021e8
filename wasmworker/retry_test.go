package wasmworker

import (
	"testing"
	"time"
)

// An outcome the server could not store goes again after 1 s, then less
// and less often, never less often than every 10 s.
func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{0, time.Second}, {1, 2 * time.Second}, {2, 4 * time.Second}, {3, 8 * time.Second},
		{4, 10 * time.Second}, {10, 10 * time.Second}, {1000, 10 * time.Second},
	} {
		if got := retryDelay(tc.n); got != tc.want {
			t.Errorf("retryDelay(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}
