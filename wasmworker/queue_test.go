package wasmworker

import (
	"testing"
	"time"
)

func TestQueueFor(t *testing.T) {
	for _, c := range []struct {
		slots, most int
		run         time.Duration
		bytes       float64
		want        int
	}{
		{2, 64, 500 * time.Microsecond, 0, 64},       // no-ops: all the room
		{2, 64, 10 * time.Millisecond, 0, 20},        // 100 ms of work per slot
		{2, 64, time.Minute, 0, 2},                   // long: one per slot
		{2, 64, 0, 0, 64},                            // nothing known of the run time
		{2, 64, time.Millisecond, 4 << 20, 4},        // large payloads: 16 MiB at most
		{4, 128, time.Millisecond, 1 << 30, 4},       // huge payloads: still one per slot
		{1, 32, 5 * time.Millisecond, 1 << 10, 20},   // a phone's one thread
		{16, 512, 200 * time.Microsecond, 100, 512},  // a headless worker
		{2, 64, 3 * time.Millisecond, 512 << 10, 32}, // bounded by the payload
	} {
		if got := queueFor(c.slots, c.most, c.run, c.bytes); got != c.want {
			t.Errorf("queueFor(%d, %d, %v, %.0f) = %d, want %d", c.slots, c.most, c.run, c.bytes, got, c.want)
		}
	}
}

func TestAdaptQueue(t *testing.T) {
	w := New(Config{Slots: 2, Queue: 8, MaxQueue: 64})
	// Short attempts: the queue grows to its most, announced at once.
	announced := 0
	for range 40 {
		if w.adaptQueue(time.Millisecond, 0) {
			announced++
		}
	}
	if w.queue != 64 || announced != 1 {
		t.Fatalf("after short attempts: queue %d, announced %d times; want 64, once", w.queue, announced)
	}
	// Long ones: it shrinks to one per slot; the heartbeat carries it (no
	// second early heartbeat within a second).
	for range 40 {
		if w.adaptQueue(time.Second, 0) {
			t.Fatal("a second early heartbeat within a second")
		}
	}
	if w.queue != 2 {
		t.Fatalf("after long attempts: queue %d, want 2", w.queue)
	}
	// Without MaxQueue the queue stays put.
	w = New(Config{Slots: 2, Queue: 8})
	for range 40 {
		w.adaptQueue(time.Millisecond, 0)
	}
	if w.queue != 8 {
		t.Fatalf("fixed queue moved to %d", w.queue)
	}
}

// After short attempts grew the queue, attempts that have been running for
// long shrink it at the next heartbeat, before any of them ends; a lone
// straggler among short attempts does not, nor does the browser's runner,
// which queues attempts itself.
func TestShrinkQueueForRunning(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name         string
		runnerQueues bool
		ages         []time.Duration // of the running attempts
		ended        time.Duration   // since an attempt last ended
		want         int
	}{
		{"long attempts on every slot", false, []time.Duration{2 * time.Second, 2 * time.Second, 3 * time.Second, time.Second}, time.Second, 4},
		{"half the slots, 400 ms", false, []time.Duration{400 * time.Millisecond, 400 * time.Millisecond}, 400 * time.Millisecond, 4},
		{"half the slots, 20 ms", false, []time.Duration{20 * time.Millisecond, 20 * time.Millisecond}, 20 * time.Millisecond, 128},
		{"one straggler", false, []time.Duration{time.Minute}, time.Minute, 128},
		{"a straggler and short ones", false, []time.Duration{time.Minute, time.Millisecond, time.Millisecond, time.Millisecond}, time.Millisecond, 128},
		{"the browser's runner", true, []time.Duration{time.Minute, time.Minute, time.Minute, time.Minute}, time.Minute, 128},
		// Attempts that wait (for slot processes to start, for the
		// CPU) while others end are not long ones.
		{"old attempts, others ending", false, []time.Duration{130 * time.Millisecond, 130 * time.Millisecond, 140 * time.Millisecond, 150 * time.Millisecond}, time.Millisecond, 128},
		{"long attempts, the last end 60 ms ago", false, []time.Duration{2 * time.Second, 2 * time.Second, 3 * time.Second, time.Second}, 60 * time.Millisecond, 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := New(Config{Slots: 4, Queue: 4, MaxQueue: 128, RunnerQueues: tc.runnerQueues})
			for range 40 {
				w.adaptQueue(500*time.Microsecond, 0)
			}
			if w.queue != 128 {
				t.Fatalf("after short attempts: queue %d, want 128", w.queue)
			}
			for i, age := range tc.ages {
				w.running[int64(i)] = &attempt{started: now.Add(-age)}
			}
			w.lastEnd = now.Add(-tc.ended)
			w.shrinkQueueForRunning(now)
			if w.queue != tc.want {
				t.Errorf("queue %d, want %d", w.queue, tc.want)
			}
		})
	}
}
