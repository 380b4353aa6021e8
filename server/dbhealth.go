package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cyclepool/cyclepool/internal/store"
)

// writeHealth tracks whether this replica can write to PostgreSQL. Every
// path that writes (completions, lease renewals, claims, the leader's
// election and sweeps) reports its outcome; a write that fails for the
// database's own reason (store.ServerFault: a full disk, a read-only or
// unreachable server) makes the replica not ready (/readyz), pauses its
// dispatch and the lease reaper, and logs once, with the cause. Results
// that could not be committed meanwhile wait at their workers, which send
// them again (ack.Retry). The replica counts as writing again once no
// write has failed for settle while others succeeded.
//
// A write that ran out of time (its context's deadline, or pgconn's
// timeout) says the database is slow or gone, not which. It is taken for
// slowness while the previous write of the same kind did not time out and
// some write succeeded within slowGrace; the next timeout of that kind,
// or any after slowGrace without a success, is a fault. A machine so busy
// that the leader's election missed its deadline once had paused dispatch
// as if the disk were full. A slow write still pauses the lease reaper
// (faultWithin): a renewal may have been the write that timed out.
//
// A disk that is nearly full lets some writes through (those that fit in
// pages PostgreSQL has already) and not others, and workers send refused
// results again less and less often: writes that fail again soon after the
// replica said they work make it wait twice as long before it says so
// again, up to maxSettle, so that its log and /readyz do not flap.
type writeHealth struct {
	log    *slog.Logger
	settle time.Duration // the shortest wait

	mu        sync.Mutex
	failing   bool
	since     time.Time // when the writes began to fail
	lastFault time.Time
	cause     string          // the database's own words, for the log
	code      string          // the SQLSTATE of cause (store.FaultCode)
	summary   string          // plain words, for owners and /readyz
	wait      time.Duration   // the wait now: settle, longer after flaps
	back      time.Time       // when writes last came back
	lastOK    time.Time       // when a write last succeeded
	lastSlow  time.Time       // when a write last timed out without counting as a fault
	slowLog   time.Time       // when that was last logged
	slowKinds map[string]bool // kinds of write whose latest attempt timed out

	writable prometheus.Gauge
	faults   *prometheus.CounterVec
	// recovered is called (outside the lock) when writes work again.
	recovered func()
	now       func() time.Time // time.Now; tests set their own clock
}

// flapWindow is how soon after writes came back a failure counts as a flap
// (and lengthens the wait), and how long writes must work for the wait to
// go back to settle; maxSettle bounds the wait.
// slowGrace is how long after a write last succeeded a write that timed
// out may be taken for slowness rather than a fault; slowLogEvery bounds
// how often that is logged.
const (
	flapWindow   = time.Minute
	maxSettle    = 30 * time.Second
	slowGrace    = 10 * time.Second
	slowLogEvery = time.Minute
)

func newWriteHealth(log *slog.Logger, settle time.Duration, recovered func()) *writeHealth {
	h := &writeHealth{
		log: log, settle: settle, wait: settle, recovered: recovered, now: time.Now, slowKinds: map[string]bool{},
		writable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cyclepool_database_writable",
			Help: "1 while this replica's writes to PostgreSQL succeed; 0 while they fail for the database's own reason (disk full, read-only, down): dispatch and the lease reaper pause, results wait at the workers."}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cyclepool_database_write_faults_total",
			Help: "Writes to PostgreSQL that failed for the database's own reason, by SQLSTATE (\"connection\" when it did not answer, \"timeout\" for one that ran out of time while others succeeded: slowness, not counted as failing)."}, []string{"code"}),
	}
	h.writable.Set(1)
	return h
}

// observe records the outcome of a write: nil for a success. Errors that
// are not the database's fault (a refused item, a cancelled context) say
// nothing of its health.
func (h *writeHealth) observe(what string, err error) {
	now := h.now()
	if err != nil {
		if !store.ServerFault(err) {
			return
		}
		if timedOut(err) {
			h.mu.Lock()
			slow := !h.failing && !h.slowKinds[what] && !h.lastOK.IsZero() && now.Sub(h.lastOK) < slowGrace
			h.slowKinds[what] = true
			logIt := slow && now.Sub(h.slowLog) >= slowLogEvery
			if slow {
				h.lastSlow = now
			}
			if logIt {
				h.slowLog = now
			}
			h.mu.Unlock()
			if slow {
				h.faults.WithLabelValues("timeout").Inc()
				if logIt {
					h.log.Warn("a write to the database timed out while others succeed: slow, not failing (said at most once a minute)",
						"during", what, "err", err)
				}
				return
			}
		}
		code := store.FaultCode(err)
		h.faults.WithLabelValues(code).Inc()
		h.mu.Lock()
		changed := h.failing && code != h.code
		h.lastFault, h.cause, h.code, h.summary = now, store.FaultCause(err), code, store.FaultSummary(err)
		was := h.failing
		if !was {
			h.failing, h.since = true, now
			if !h.back.IsZero() && now.Sub(h.back) < flapWindow {
				h.wait = min(2*h.wait, maxSettle)
			}
		}
		h.mu.Unlock()
		switch {
		case !was:
			h.writable.Set(0)
			h.log.Error("the database cannot write: dispatch and the lease reaper pause, results wait at the workers",
				"cause", store.FaultCause(err), "during", what)
		case changed:
			h.log.Warn("the database still cannot write, for another reason", "cause", store.FaultCause(err), "during", what)
		}
		return
	}
	h.mu.Lock()
	h.lastOK = now
	delete(h.slowKinds, what)
	back := h.failing && now.Sub(h.lastFault) >= h.wait
	var outage time.Duration
	if back {
		h.failing, outage, h.back = false, now.Sub(h.since), now
	}
	if !h.failing && now.Sub(h.lastFault) > flapWindow {
		h.wait = h.settle
	}
	h.mu.Unlock()
	if back {
		h.writable.Set(1)
		h.log.Info("the database writes again: dispatch and the lease reaper resume", "outage", outage.Round(time.Millisecond))
		if h.recovered != nil {
			h.recovered()
		}
	}
}

// level is the level to log a failed write at: debug for a server fault
// while writes are known to fail (the outage's one error line said it
// already) and for a timeout taken for slowness (observe logs those), error
// otherwise.
func (h *writeHealth) level(err error) slog.Level {
	failing, _ := h.state()
	switch {
	case failing && store.ServerFault(err):
		return slog.LevelDebug
	case timedOut(err) && store.ServerFault(err):
		return slog.LevelDebug // taken for slowness, which observe said
	}
	return slog.LevelError
}

// notice is what owners are told while writes fail ("" while they work):
// why their workflows do not move, and that it costs them nothing.
func (s *Server) notice() string {
	if failing, why := s.health.state(); failing {
		return "the server cannot store results now (" + why + "): finished results wait at the workers " +
			"and are stored once it can, and nothing is charged to your tasks"
	}
	return ""
}

// state reports whether writes fail now, and why in plain words
// (store.FaultSummary).
func (h *writeHealth) state() (failing bool, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failing, h.summary
}

// faultWithin reports whether a write failed (or timed out, taken for
// slowness) within d before now: the
// lease reaper leaves leases alone then, as a renewal may have been among
// the writes that failed.
func (h *writeHealth) faultWithin(d time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	return (!h.lastFault.IsZero() && now.Sub(h.lastFault) < d) || (!h.lastSlow.IsZero() && now.Sub(h.lastSlow) < d)
}

// timedOut reports whether err is a write that ran out of time: its
// context's deadline, pgconn's timeout, or the network's.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || (errors.As(err, &ne) && ne.Timeout())
}
