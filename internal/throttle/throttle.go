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
	return &Failures{cfg: c, byAddr: map[string]*list.Element{}, order: list.New()}
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
	el, ok := f.byAddr[Key(addr)]
	if !ok {
		return 0
	}
	e := el.Value.(*entry)
	e.times = f.recent(e.times, now)
	if len(e.times) < f.cfg.Failures {
		return 0
	}
	// The oldest failure that keeps addr refused leaves the window then.
	return e.times[len(e.times)-f.cfg.Failures].Add(f.cfg.Window).Sub(now)
}

// RetryAfter is a Retry-After header's value for a Wait: whole seconds,
// rounded up.
func RetryAfter(wait time.Duration) string {
	return strconv.Itoa(int((wait + time.Second - 1) / time.Second))
}

// Fail counts a failed attempt from addr now.
func (f *Failures) Fail(addr string) {
	now := f.cfg.Now()
	key := Key(addr)
	f.mu.Lock()
	defer f.mu.Unlock()
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
