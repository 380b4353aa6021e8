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
