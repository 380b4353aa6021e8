package server

import (
	"log/slog"
	"sync"
	"time"

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
type writeHealth struct {
	log    *slog.Logger
	settle time.Duration

	mu        sync.Mutex
	failing   bool
	since     time.Time // when the writes began to fail
	lastFault time.Time
	cause     string

	writable prometheus.Gauge
	faults   *prometheus.CounterVec
	// recovered is called (outside the lock) when writes work again.
	recovered func()
}

func newWriteHealth(log *slog.Logger, settle time.Duration, recovered func()) *writeHealth {
	h := &writeHealth{
		log: log, settle: settle, recovered: recovered,
		writable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cyclepool_database_writable",
			Help: "1 while this replica's writes to PostgreSQL succeed; 0 while they fail for the database's own reason (disk full, read-only, down): dispatch and the lease reaper pause, results wait at the workers."}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cyclepool_database_write_faults_total",
			Help: "Writes to PostgreSQL that failed for the database's own reason, by SQLSTATE (\"connection\" when it did not answer)."}, []string{"code"}),
	}
	h.writable.Set(1)
	return h
}

// observe records the outcome of a write: nil for a success. Errors that
// are not the database's fault (a refused item, a cancelled context) say
// nothing of its health.
func (h *writeHealth) observe(what string, err error) {
	now := time.Now()
	if err != nil {
		if !store.ServerFault(err) {
			return
		}
		h.faults.WithLabelValues(store.FaultCode(err)).Inc()
		h.mu.Lock()
		h.lastFault, h.cause = now, store.FaultCause(err)
		was := h.failing
		if !was {
			h.failing, h.since = true, now
		}
		h.mu.Unlock()
		if !was {
			h.writable.Set(0)
			h.log.Error("the database cannot write: dispatch and the lease reaper pause, results wait at the workers",
				"cause", store.FaultCause(err), "during", what)
		}
		return
	}
	h.mu.Lock()
	back := h.failing && now.Sub(h.lastFault) >= h.settle
	var outage time.Duration
	if back {
		h.failing, outage = false, now.Sub(h.since)
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
// already), error otherwise.
func (h *writeHealth) level(err error) slog.Level {
	if failing, _ := h.state(); failing && store.ServerFault(err) {
		return slog.LevelDebug
	}
	return slog.LevelError
}

// notice is what owners are told while writes fail ("" while they work):
// why their workflows do not move, and that it costs them nothing.
func (s *Server) notice() string {
	if failing, cause := s.health.state(); failing {
		return "the server cannot store results now (" + cause + "): finished results wait at the workers " +
			"and are stored once it can, and nothing is charged to your tasks"
	}
	return ""
}

// state reports whether writes fail now, and why.
func (h *writeHealth) state() (failing bool, cause string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failing, h.cause
}

// faultWithin reports whether a write failed within d before now: the
// lease reaper leaves leases alone then, as a renewal may have been among
// the writes that failed.
func (h *writeHealth) faultWithin(d time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.lastFault.IsZero() && time.Since(h.lastFault) < d
}
