package server

import (
	"fmt"
	"hash/fnv"
	"testing"
	"time"
)

// Event streams of large workflows look for changes less often, never
// less than every 2 seconds.
func TestEventPollInterval(t *testing.T) {
	t.Parallel()
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

// A task's seed is FNV-1a of "workflow\x00index\x00task", halved: the
// deterministic clocks and random source of a task depend on it, so it must
// not change from one version of the server to the next.
func TestTaskSeed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		wf   string
		i    int
		task string
		want int64
	}{
		{"primes", 0, "count-0", 0},
		{"primes", 12, "sum", 0},
		{"é", 19999, "t19999", 0},
		{"", 0, "", 0},
	}
	for k := range tests {
		h := fnv.New64a()
		fmt.Fprintf(h, "%s\x00%d\x00%s", tests[k].wf, tests[k].i, tests[k].task)
		tests[k].want = int64(h.Sum64() >> 1)
	}
	tests[0].want, tests[1].want = 5075327773489540771, 6351864594064113319 // as computed with fmt before taskSeed
	buf := []byte("left over from an earlier task")
	for _, tc := range tests {
		var got int64
		if got, buf = taskSeed(buf, tc.wf, tc.i, tc.task); got != tc.want {
			t.Errorf("taskSeed(%q, %d, %q) = %d, want %d", tc.wf, tc.i, tc.task, got, tc.want)
		}
	}
}
