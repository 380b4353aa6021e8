package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
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

// A write that timed out while others succeed is slowness, not a fault
// (though the lease reaper still waits after it); the next timeout of the
// same kind of write, or any with no write succeeding for slowGrace, is a
// fault.
func TestWriteHealthTimeouts(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_000_000, 0)
	h := newWriteHealth(slog.New(slog.DiscardHandler), 2*time.Second, nil)
	h.now = func() time.Time { return clock }
	timeout := fmt.Errorf("elect maintenance leader: %w", context.DeadlineExceeded)
	netTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for i, s := range []struct {
		after   time.Duration
		what    string
		err     error
		failing bool
		within  bool // faultWithin a lease of 5 s, by the test's clock
	}{
		{0, "a", timeout, true, true},                                              // no write has succeeded yet: nothing says it is slowness
		{3 * time.Second, "a", nil, false, true},                                   // back after the wait
		{time.Second, "a", timeout, false, true},                                   // a second after a success: slow, but the reaper waits
		{time.Second, "b", nil, false, true},                                       // other writes succeed
		{time.Second, "a", netTimeout, true, true},                                 // the same kind times out again: a fault
		{3 * time.Second, "a", nil, true, true},                                    // the wait, doubled by the flap, is not over
		{2 * time.Second, "b", nil, false, false},                                  // it is
		{time.Second, "a", timeout, false, true},                                   // "a" succeeded since: slow again
		{time.Second, "b", netTimeout, false, true},                                // and "b"
		{11 * time.Second, "c", timeout, true, true},                               // 13 s without a success: a fault
		{time.Second, "d", errors.New("dial tcp: connection refused"), true, true}, // no answer at all
	} {
		clock = clock.Add(s.after)
		h.observe(s.what, s.err)
		failing, cause := h.state()
		if failing != s.failing || h.faultWithin(5*time.Second) != s.within {
			t.Fatalf("step %d (%s: %v): failing %v (%s), faultWithin %v; want %v, %v", i, s.what, s.err, failing, cause,
				h.faultWithin(5*time.Second), s.failing, s.within)
		}
	}
	if got := h.level(timeout); got != slog.LevelDebug {
		t.Errorf("a timeout is logged by its caller at %v, want debug (observe says it)", got)
	}
}
