package server

import (
	"testing"
	"time"
)

// Event streams of large workflows look for changes less often, never
// less than every 2 seconds.
func TestEventPollInterval(t *testing.T) {
	tests := []struct {
		tasks int
		want  time.Duration
	}{
		{0, 250 * time.Millisecond},
		{1, 250 * time.Millisecond},
		{2500, 250 * time.Millisecond},
		{2501, 500 * time.Millisecond},
		{10000, time.Second},
		{20000, 2 * time.Second},
		{1000000, 2 * time.Second},
	}
	for _, tc := range tests {
		if got := eventPollInterval(tc.tasks); got != tc.want {
			t.Errorf("eventPollInterval(%d) = %v, want %v", tc.tasks, got, tc.want)
		}
	}
}
