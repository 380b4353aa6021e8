// Package throttle slows down guessing secrets (owner tokens, operator
// keys) over the network: Failures counts the wrong guesses each client
// address made in a sliding window, and says when an address must wait
// before its next guess is even checked.
//
// It remembers a bounded number of addresses: when full, it forgets the
// address whose last failure is the oldest. IPv6 addresses are counted by
// their /64, which one subscriber usually holds whole (docs/RATIONALE.md,
// "Why does the failures throttle forget addresses when full, and count
// IPv6 by /64?").
package throttle

import (
	"container/list"
	"context"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Defaults of Config's zero fields.
const (
	DefaultFailures  = 10
	DefaultWindow    = time.Minute
	DefaultAddresses = 65536
)

// Config configures a Failures; a zero field takes its default.
type Config struct {
	// Failures is how many failures an address may have in Window before
	// its attempts are refused (DefaultFailures).
	Failures int
	// Window is how long a failure counts (DefaultWindow).
	Window time.Duration
	// Addresses bounds the addresses remembered (DefaultAddresses).
	Addresses int
	// Now is the clock (time.Now); tests set their own. It must not go
	// back: addresses are kept in the order of their last failure.
	Now func() time.Time
}

// Failures counts failed attempts per client address. It is safe for
// concurrent use, and per process: replicas each count their own.
type Failures struct {
	cfg Config

	mu sync.Mutex
	// byAddr holds the addresses with failures in the window; order holds
	// the same entries from the oldest last failure to the newest, so that
	// the stale and, when full, the oldest are forgotten in constant time.
	byAddr map[string]*list.Element
	order  *list.List // of *entry
	// checking holds the addresses with attempts being checked (Begin):
	// they count against the address's failures until they end, so that
	// attempts sent at once are not all checked before the first fails.
	// An address is here only while it has attempts in flight.
	checking map[string]*flight
}

// flight is an address's attempts being checked.
type flight struct {
	n     int
	ended chan struct{} // closed (and cleared) when one ends; nil: nobody waits
}

// entry is one address's failures in the window, oldest first (at most
// Config.Failures of them: older ones no longer decide anything).
type entry struct {
	key   string
	times []time.Time
}

// New returns a Failures configured by c.
func New(c Config) *Failures {
	if c.Failures <= 0 {
		c.Failures = DefaultFailures
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Addresses <= 0 {
		c.Addresses = DefaultAddresses
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Failures{cfg: c, byAddr: map[string]*list.Element{}, order: list.New(), checking: map[string]*flight{}}
}

// Key is what addr is counted as: an IPv4 address itself, an IPv6 address
// its /64 prefix, anything that is not an IP address (a Unix socket's
// name) as it is.
func Key(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	ip = ip.WithZone("").Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.Prefix(64)
	return p.String()
}

// Wait returns how long addr must wait before its next attempt is checked
// (0: it may try now). An address past its failures should be answered
// without checking anything, with this as its Retry-After.
func (f *Failures) Wait(addr string) time.Duration {
	now := f.cfg.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgetStaleLocked(now)
	wait, _ := f.waitLocked(Key(addr), now)
	return wait
}

// waitLocked is Wait for key, with the failures key has in the window;
// f.mu held, the stale forgotten.
func (f *Failures) waitLocked(key string, now time.Time) (time.Duration, int) {
	el, ok := f.byAddr[key]
	if !ok {
		return 0, 0
	}
	e := el.Value.(*entry)
	e.times = f.recent(e.times, now)
	if len(e.times) < f.cfg.Failures {
		return 0, len(e.times)
	}
	// The oldest failure that keeps addr refused leaves the window then.
	return e.times[len(e.times)-f.cfg.Failures].Add(f.cfg.Window).Sub(now), len(e.times)
}

// Begin is Wait for an attempt about to be checked: when it returns 0, the
// attempt counts as a failure of addr's until done is called with its
// outcome (failed: as Fail). Attempts sent at once are so checked no more
// than addr's failures allow: while those being checked would fill them,
// Begin waits for one of them to end (or ctx, whose error it returns).
// done must be called once the attempt was checked (later calls do
// nothing), not when the request ends.
func (f *Failures) Begin(ctx context.Context, addr string) (wait time.Duration, done func(failed bool), err error) {
	key := Key(addr)
	for {
		now := f.cfg.Now()
		f.mu.Lock()
		f.forgetStaleLocked(now)
		wait, failed := f.waitLocked(key, now)
		if wait > 0 {
			f.mu.Unlock()
			return wait, nil, nil
		}
		fl := f.checking[key]
		if fl == nil || failed+fl.n < f.cfg.Failures {
			if fl == nil {
				fl = &flight{}
				f.checking[key] = fl
			}
			fl.n++
			f.mu.Unlock()
			var once sync.Once
			return 0, func(failed bool) { once.Do(func() { f.end(key, fl, failed) }) }, nil
		}
		if fl.ended == nil {
			fl.ended = make(chan struct{})
		}
		ended := fl.ended
		f.mu.Unlock()
		select {
		case <-ended:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
}

// end ends an attempt of key's that Begin let through.
func (f *Failures) end(key string, fl *flight, failed bool) {
	now := f.cfg.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if failed {
		f.failLocked(key, now)
	}
	if fl.n--; fl.n == 0 {
		delete(f.checking, key)
	}
	if fl.ended != nil {
		close(fl.ended)
		fl.ended = nil
	}
}

// RetryAfter is a Retry-After header's value for a Wait: whole seconds,
// rounded up.
func RetryAfter(wait time.Duration) string {
	return strconv.Itoa(int((wait + time.Second - 1) / time.Second))
}

// Fail counts a failed attempt from addr now.
func (f *Failures) Fail(addr string) {
	now := f.cfg.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failLocked(Key(addr), now)
}

// failLocked is Fail for key; f.mu held.
func (f *Failures) failLocked(key string, now time.Time) {
	f.forgetStaleLocked(now)
	el, ok := f.byAddr[key]
	if !ok {
		if f.order.Len() >= f.cfg.Addresses {
			f.forgetLocked(f.order.Front())
		}
		el = f.order.PushBack(&entry{key: key, times: make([]time.Time, 0, 1)})
		f.byAddr[key] = el
	}
	e := el.Value.(*entry)
	e.times = append(f.recent(e.times, now), now)
	if n := len(e.times) - f.cfg.Failures; n > 0 {
		e.times = append(e.times[:0], e.times[n:]...)
	}
	f.order.MoveToBack(el)
}

// Len returns how many addresses f remembers.
func (f *Failures) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.order.Len()
}

// recent returns the failures of times still in the window at now.
func (f *Failures) recent(times []time.Time, now time.Time) []time.Time {
	i := 0
	for i < len(times) && now.Sub(times[i]) >= f.cfg.Window {
		i++
	}
	return times[i:]
}

// forgetStaleLocked forgets the addresses whose last failure has left the
// window; f.mu held.
func (f *Failures) forgetStaleLocked(now time.Time) {
	for el := f.order.Front(); el != nil; el = f.order.Front() {
		ts := el.Value.(*entry).times
		if len(ts) > 0 && now.Sub(ts[len(ts)-1]) < f.cfg.Window {
			return
		}
		f.forgetLocked(el)
	}
}

func (f *Failures) forgetLocked(el *list.Element) {
	delete(f.byAddr, el.Value.(*entry).key)
	f.order.Remove(el)
}
