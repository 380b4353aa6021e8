package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The replica says writes fail at the first server fault, ignores the
// items' own errors, says they work again once none failed for the wait,
// and waits longer after writes that flap (a nearly full disk).
func TestWriteHealth(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_000_000, 0)
	recovered := 0
	h := newWriteHealth(slog.New(slog.DiscardHandler), 2*time.Second, func() { recovered++ })
	h.now = func() time.Time { return clock }
	full := &pgconn.PgError{Code: "53100", Message: "could not extend file: No space left on device"}
	item := &pgconn.PgError{Code: "22021", Message: "invalid byte sequence"}
	type step struct {
		after   time.Duration
		err     error
		failing bool
		wait    time.Duration
	}
	for i, s := range []step{
		{0, item, false, 2 * time.Second},                                                // the item's fault: nothing to say
		{0, context.Canceled, false, 2 * time.Second},                                    // the caller gave up
		{time.Second, full, true, 2 * time.Second},                                       // the disk is full
		{time.Second, nil, true, 2 * time.Second},                                        // a success too soon after the fault
		{1500 * time.Millisecond, nil, false, 2 * time.Second},                           // none failed for 2 s: back
		{10 * time.Second, full, true, 4 * time.Second},                                  // fails again soon after: a flap
		{3 * time.Second, nil, true, 4 * time.Second},                                    // 2 s are no longer enough
		{2 * time.Second, nil, false, 4 * time.Second},                                   // 4 s are
		{2 * time.Minute, nil, false, 2 * time.Second},                                   // a while without faults: the wait is short again
		{time.Second, errors.New("dial tcp: connection refused"), true, 2 * time.Second}, // no answer at all
	} {
		clock = clock.Add(s.after)
		h.observe("test", s.err)
		failing, cause := h.state()
		if failing != s.failing || h.wait != s.wait {
			t.Fatalf("step %d (%v): failing %v (%s), wait %v; want %v, %v", i, s.err, failing, cause, h.wait, s.failing, s.wait)
		}
	}
	if recovered != 2 {
		t.Errorf("recovered called %d times, want 2", recovered)
	}
	if got := h.level(full); got != slog.LevelDebug {
		t.Errorf("a server fault while failing is logged at %v, want debug", got)
	}
	if got := h.level(item); got != slog.LevelError {
		t.Errorf("an item's error is logged at %v, want error", got)
	}
}

// A write that timed out while others succeed is slowness, not a fault;
// writes that keep timing out with none succeeding for slowGrace are one.
func TestWriteHealthTimeouts(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_000_000, 0)
	h := newWriteHealth(slog.New(slog.DiscardHandler), 2*time.Second, nil)
	h.now = func() time.Time { return clock }
	timeout := fmt.Errorf("elect maintenance leader: %w", context.DeadlineExceeded)
	for i, s := range []struct {
		after   time.Duration
		err     error
		failing bool
	}{
		{0, timeout, true},                                              // no write has succeeded yet: nothing says it is slowness
		{3 * time.Second, nil, false},                                   // a success after the wait: back
		{time.Second, timeout, false},                                   // a second after a success: slow
		{time.Second, nil, false},                                       // others succeed
		{5 * time.Second, timeout, false},                               // still within slowGrace of the last success
		{6 * time.Second, timeout, true},                                // 11 s without a success: failing
		{3 * time.Second, nil, true},                                    // a success: back only once none failed for the wait
		{3 * time.Second, nil, false},                                   // the wait, doubled by the flap, is over
		{time.Second, errors.New("dial tcp: connection refused"), true}, // no answer at all: at once
	} {
		clock = clock.Add(s.after)
		h.observe("test", s.err)
		if failing, cause := h.state(); failing != s.failing {
			t.Fatalf("step %d (%v): failing %v (%s), want %v", i, s.err, failing, cause, s.failing)
		}
	}
}
