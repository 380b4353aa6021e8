package server

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// gatekeeper decides, per source address, who may connect as a worker. A
// worker's record (its strikes, the tasks that avoid it) is only worth
// something if a fresh one is not free, and a connection costs the server
// an upgrade and a greeting, so an address gets:
//   - a bounded number of new worker identities (a token bucket: burst, then
//     one every every); an honest worker keeps its identity across
//     reconnections and never meets the bound;
//   - a bounded number of connections refused for breaking the protocol
//     (refusalBurst, then one a second), after which it is kept out;
//   - kept out for fencedPenalty after its worker sent many reports for
//     attempts it did not hold (keepOut), answered 429 before the upgrade.
//
// It is per replica.
type gatekeeper struct {
	identities *addrBuckets
	refusals   *addrBuckets

	mu      sync.Mutex
	keptOut map[string]time.Time // addresses that may not connect before a time
}

// refusalBurst and refusalEvery bound the connections an address may have
// refused for breaking the protocol (a bad hello, garbage) before it is
// kept out for fencedPenalty. Honest workers are never refused so.
const (
	refusalBurst = 20
	refusalEvery = time.Second
)

// maxLimitedAddrs bounds the addresses each table of a gatekeeper
// remembers; past it, those with nothing to remember are forgotten.
const maxLimitedAddrs = 10000

// newGatekeeper bounds new identities to burst, then one every every (every
// <= 0: no bound).
func newGatekeeper(every time.Duration, burst int) *gatekeeper {
	return &gatekeeper{identities: newAddrBuckets(every, burst), refusals: newAddrBuckets(refusalEvery, refusalBurst),
		keptOut: map[string]time.Time{}}
}

// newIdentity reports whether addr may have one more new identity now,
// and takes it.
func (g *gatekeeper) newIdentity(addr string, now time.Time) bool {
	return g.identities.take(addr, now)
}

// refused counts a connection from addr refused for breaking the
// protocol; past the bound, addr is kept out.
func (g *gatekeeper) refused(addr string, now time.Time) {
	if !g.refusals.take(addr, now) {
		g.keepOut(addr, now)
	}
}

// keepOut keeps addr out for fencedPenalty from now.
func (g *gatekeeper) keepOut(addr string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.keptOut) >= maxLimitedAddrs {
		for a, until := range g.keptOut {
			if !until.After(now) {
				delete(g.keptOut, a)
			}
		}
	}
	if len(g.keptOut) < maxLimitedAddrs {
		g.keptOut[addr] = now.Add(fencedPenalty)
	}
}

// keptOutFor returns how long addr is still kept out (0: not).
func (g *gatekeeper) keptOutFor(addr string, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.keptOut[addr]
	if !ok {
		return 0
	}
	if !until.After(now) {
		delete(g.keptOut, addr)
		return 0
	}
	return until.Sub(now)
}

// addrBuckets is a token bucket per address (golang.org/x/time/rate).
type addrBuckets struct {
	every time.Duration // <= 0: no bound
	burst int

	mu     sync.Mutex
	byAddr map[string]*rate.Limiter
}

func newAddrBuckets(every time.Duration, burst int) *addrBuckets {
	return &addrBuckets{every: every, burst: max(burst, 1), byAddr: map[string]*rate.Limiter{}}
}

// take reports whether addr's bucket has a token now, and takes it.
func (b *addrBuckets) take(addr string, now time.Time) bool {
	if b.every <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	lim := b.byAddr[addr]
	if lim == nil {
		if len(b.byAddr) >= maxLimitedAddrs {
			for a, x := range b.byAddr {
				if x.TokensAt(now) >= float64(b.burst) {
					delete(b.byAddr, a)
				}
			}
			if len(b.byAddr) >= maxLimitedAddrs {
				clear(b.byAddr) // every one is in use: start again rather than grow
			}
		}
		lim = rate.NewLimiter(rate.Every(b.every), b.burst)
		b.byAddr[addr] = lim
	}
	return lim.AllowN(now, 1)
}

// remoteHost is the address a request came from (the connection's: a
// header a client sets is not trusted).
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// bearer returns the token of an Authorization: Bearer header, or "".
func bearer(r *http.Request) string {
	if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}
