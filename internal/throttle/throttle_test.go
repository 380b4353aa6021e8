package throttle

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// clock is a clock a test moves by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTest(c Config) (*Failures, *clock) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c.Now = clk.now
	return New(c), clk
}

func TestKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ addr, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2::ffff", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"@", "@"},
		{"", ""},
	}
	for _, tc := range tests {
		if got := Key(tc.addr); got != tc.want {
			t.Errorf("Key(%q) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// Each step moves the clock, counts a failure from an address, then checks
// what Wait says for an address.
func TestFailures(t *testing.T) {
	t.Parallel()
	type step struct {
		advance time.Duration // before the step
		fail    string        // address that fails once, if any
		check   string
		wait    time.Duration
	}
	many := func(n int, addr string) []step {
		s := make([]step, n)
		for i := range s {
			s[i] = step{fail: addr}
		}
		return s
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"under the bound", append(many(2, "192.0.2.1"), step{check: "192.0.2.1", wait: 0})},
		{"at the bound, refused for the window",
			append(many(2, "192.0.2.1"), step{fail: "192.0.2.1", check: "192.0.2.1", wait: time.Minute})},
		{"another address is not held", append(many(3, "192.0.2.1"), step{check: "192.0.2.2", wait: 0})},
		{"the window passes", append(many(3, "192.0.2.1"),
			step{advance: 59 * time.Second, check: "192.0.2.1", wait: time.Second},
			step{advance: time.Second, check: "192.0.2.1", wait: 0})},
		{"a sliding window: the oldest failure leaves first", []step{
			{fail: "192.0.2.1"},
			{advance: 30 * time.Second, fail: "192.0.2.1"},
			{advance: 10 * time.Second, fail: "192.0.2.1", check: "192.0.2.1", wait: 20 * time.Second},
			{advance: 20 * time.Second, check: "192.0.2.1", wait: 0},
			{fail: "192.0.2.1", check: "192.0.2.1", wait: 30 * time.Second},
		}},
		{"one IPv6 /64 is one address", []step{
			{fail: "2001:db8:0:1::1"},
			{fail: "2001:db8:0:1::2"},
			{fail: "2001:db8:0:1:ffff:ffff:ffff:ffff", check: "2001:db8:0:1::abcd", wait: time.Minute},
			{check: "2001:db8:0:2::1", wait: 0},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, clk := newTest(Config{Failures: 3, Window: time.Minute})
			for i, s := range tc.steps {
				clk.t = clk.t.Add(s.advance)
				if s.fail != "" {
					f.Fail(s.fail)
				}
				if s.check == "" {
					continue
				}
				if got := f.Wait(s.check); got != s.wait {
					t.Fatalf("step %d: Wait(%q) = %v, want %v", i, s.check, got, s.wait)
				}
			}
		})
	}
}

// A flood of distinct addresses does not grow what is remembered past the
// bound; the address forgotten is the one whose last failure is the
// oldest, and the addresses whose failures left the window are forgotten
// as soon as the throttle is used again.
func TestFailuresBound(t *testing.T) {
	t.Parallel()
	const bound = 100
	f, clk := newTest(Config{Failures: 2, Window: time.Minute, Addresses: bound})
	f.Fail("198.51.100.1")
	f.Fail("198.51.100.1") // refused from now on
	f.Fail("198.51.100.2")
	f.Fail("198.51.100.2")
	f.Fail("198.51.100.1") // its last failure is now the newest
	for i := range 10 * bound {
		f.Fail(fmt.Sprintf("2001:db8:%x:%x::1", i>>16, i&0xffff))
		if n := f.Len(); n > bound {
			t.Fatalf("after %d addresses: %d remembered, bound %d", i+1, n, bound)
		}
	}
	if f.Len() != bound {
		t.Fatalf("%d remembered, want %d", f.Len(), bound)
	}
	if w := f.Wait("198.51.100.2"); w != 0 {
		t.Errorf("the address of the oldest last failure is still held (%v)", w)
	}
	clk.t = clk.t.Add(time.Minute)
	if w := f.Wait("2001:db8::1"); w != 0 || f.Len() != 0 {
		t.Errorf("after the window: Wait %v, %d remembered, want 0 and none", w, f.Len())
	}
}

// Failures in a burst beyond the bound (requests checked at once, then
// failing) keep no more than the bound of times per address.
func TestFailuresKeepsOnlyWhatDecides(t *testing.T) {
	t.Parallel()
	f, _ := newTest(Config{Failures: 3})
	for range 1000 {
		f.Fail("192.0.2.1")
	}
	el := f.byAddr[Key("192.0.2.1")]
	if n := len(el.Value.(*entry).times); n != 3 {
		t.Fatalf("%d failure times kept, want 3", n)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		wait time.Duration
		want string
	}{
		{time.Nanosecond, "1"},
		{time.Second, "1"},
		{time.Second + time.Millisecond, "2"},
		{time.Minute, "60"},
	}
	for _, tc := range tests {
		if got := RetryAfter(tc.wait); got != tc.want {
			t.Errorf("RetryAfter(%v) = %q, want %q", tc.wait, got, tc.want)
		}
	}
}

// Attempts being checked count against the address's failures: past them,
// Begin waits for one to end; one that succeeds lets the next through, one
// that fails counts as Fail does; other addresses are not held.
func TestBeginCountsAttemptsInFlight(t *testing.T) {
	t.Parallel()
	f, _ := newTest(Config{Failures: 3})
	ctx := context.Background()
	var dones []func(bool)
	for i := range 3 {
		wait, done, err := f.Begin(ctx, "192.0.2.1")
		if wait != 0 || err != nil {
			t.Fatalf("attempt %d: wait %v, err %v", i+1, wait, err)
		}
		dones = append(dones, done)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if wait, _, err := f.Begin(short, "192.0.2.1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fourth attempt while three are checked: wait %v, err %v; want it to wait", wait, err)
	}
	if wait, done, err := f.Begin(ctx, "192.0.2.2"); wait != 0 || err != nil {
		t.Fatalf("another address: wait %v, err %v", wait, err)
	} else {
		done(true)
	}
	got := make(chan func(bool))
	go func() {
		_, done, _ := f.Begin(ctx, "192.0.2.1")
		got <- done
	}()
	dones[0](false)
	dones[0](true) // a second call does nothing
	select {
	case done := <-got:
		dones[0] = done
	case <-time.After(5 * time.Second):
		t.Fatal("an attempt that succeeded let no waiting one through")
	}
	for _, done := range dones {
		done(true)
	}
	if wait, _, err := f.Begin(ctx, "192.0.2.1"); wait == 0 || err != nil {
		t.Fatalf("after three failed: wait %v, err %v, want a wait", wait, err)
	}
	if len(f.checking) != 0 {
		t.Fatalf("%d addresses still checking", len(f.checking))
	}
}
