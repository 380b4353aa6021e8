package server

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// identityLimiter bounds the new worker identities this replica makes per
// source address, and keeps out for a while the addresses whose workers
// sent many reports for attempts they did not hold (penalize): a token bucket per address (burst, then one every
// every). A worker's record (its strikes, the tasks that avoid it) is only
// worth something if a fresh one is not free; an honest worker keeps its
// identity across reconnections and never meets the limit.
type identityLimiter struct {
	every time.Duration // 0: no limit
	burst int

	mu     sync.Mutex
	byAddr map[string]*rate.Limiter
	// kept out: addresses that may not connect before a time (penalize)
	keptOut map[string]time.Time
}

// maxLimitedAddrs bounds the addresses an identityLimiter remembers; past
// it, those whose bucket is full again are forgotten.
const maxLimitedAddrs = 10000

func newIdentityLimiter(every time.Duration, burst int) *identityLimiter {
	return &identityLimiter{every: every, burst: max(burst, 1), byAddr: map[string]*rate.Limiter{}, keptOut: map[string]time.Time{}}
}

// penalize keeps addr out for fencedPenalty from now.
func (l *identityLimiter) penalize(addr string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.keptOut) >= maxLimitedAddrs {
		for a, until := range l.keptOut {
			if !until.After(now) {
				delete(l.keptOut, a)
			}
		}
	}
	if len(l.keptOut) < maxLimitedAddrs {
		l.keptOut[addr] = now.Add(fencedPenalty)
	}
}

// penalized returns how long addr is still kept out (0: not).
func (l *identityLimiter) penalized(addr string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.keptOut[addr]
	if !ok {
		return 0
	}
	if !until.After(now) {
		delete(l.keptOut, addr)
		return 0
	}
	return until.Sub(now)
}

// allow reports whether addr may have one more new identity now, and
// takes it.
func (l *identityLimiter) allow(addr string, now time.Time) bool {
	if l.every <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.byAddr[addr]
	if lim == nil {
		if len(l.byAddr) >= maxLimitedAddrs {
			for a, x := range l.byAddr {
				if x.TokensAt(now) >= float64(l.burst) {
					delete(l.byAddr, a)
				}
			}
			if len(l.byAddr) >= maxLimitedAddrs {
				clear(l.byAddr) // every one is in use: start again rather than grow
			}
		}
		lim = rate.NewLimiter(rate.Every(l.every), l.burst)
		l.byAddr[addr] = lim
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
