package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/cyclepool/cyclepool/internal/store"
)

// listen keeps a LISTEN connection open (store.Listen) and turns
// notifications into dispatcher wake-ups (ChannelReady), finished
// workflows' waiters, and cancel frames (ChannelCancel). When the connection
// breaks it listens again; the dispatcher's polling covers the gap.
func (s *Server) listen(ctx context.Context) {
	l := store.Listener{
		// Tasks may have become ready, and workflows finished, while no
		// connection listened.
		Listening: func() { s.wake(); s.ends.all() },
		Ready:     s.wake,
		Finished:  s.ends.heard,
		// The owner cancelled the workflow, or the attempt's result is no
		// longer needed (a quorum of other replicas agreed, its task
		// failed, or an upstream result was overturned).
		Cancel: func(ids []int64) {
			s.hub.cancel(ids, "cancelled: the owner cancelled it or its result is no longer needed", false)
		},
	}
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.store.Listen(ctx, l)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("listen for notifications", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// maintain runs the leader-only maintenance: one replica at a time (a
// leader row with a TTL in PostgreSQL) expires lapsed leases, queueing their
// tasks again, marks workers of vanished replicas as disconnected and, once
// an hour, deletes the records of workers gone for longer than
// Config.WorkerRetention and the data blobs nothing holds.
func (s *Server) maintain(ctx context.Context) {
	const name = "maintenance"
	ttl := 3 * s.cfg.Heartbeat
	if ttl < 3*time.Second {
		ttl = 3 * time.Second
	}
	tick := s.cfg.Heartbeat / 2
	if tick > time.Second {
		tick = time.Second
	}
	leading := false
	lastElect := time.Time{}
	lastForget, lastPrune, lastUploads, lastKnown := time.Time{}, time.Time{}, time.Time{}, time.Time{}
	defer func() {
		if leading {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			_ = s.store.Resign(rctx, name, s.cfg.Replica)
		}
	}()
	every(ctx, tick, func(ctx context.Context) {
		if time.Since(lastElect) >= ttl/3 {
			// Bounded: a connection that hangs must not keep a replica
			// leading (and saying so) past its TTL.
			ectx, cancel := context.WithTimeout(ctx, ttl/3)
			lead, err := s.store.TryLead(ectx, name, s.cfg.Replica, ttl)
			cancel()
			// Every replica writes here every few seconds, leader or
			// not: it is how a replica whose writes failed notices they
			// work again, when nothing else writes.
			s.health.observe("leader election", err)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Log(ctx, min(s.health.level(err), slog.LevelWarn), "leader election", "err", err)
				}
				// Unsure of the lead, this replica stops leading, and says so.
				if leading {
					s.log.Info("maintenance leadership changed", "leading", false)
				}
				leading = false
				s.metrics.leader.Set(0)
				return
			}
			if lead != leading {
				s.log.Info("maintenance leadership changed", "leading", lead)
			}
			leading, lastElect = lead, time.Now()
			s.metrics.leader.Set(b2f(leading))
		}
		if time.Since(lastKnown) > knownModuleFor { // every replica's own
			lastKnown = time.Now()
			s.forgetKnownModules(lastKnown)
		}
		if !leading {
			return
		}
		s.sweepLeases(ctx)
		if time.Since(lastForget) > 30*time.Second {
			lastForget = time.Now()
			if err := s.store.ForgetReplicaWorkers(ctx, time.Minute); err != nil && ctx.Err() == nil {
				s.log.Warn("forget stale workers", "err", err)
			}
		}
		if time.Since(lastUploads) > time.Minute {
			lastUploads = time.Now()
			if _, err := s.store.CollectOutputUploads(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("collect uploaded outputs", "err", err)
			}
		}
		if time.Since(lastPrune) > time.Hour {
			lastPrune = time.Now()
			s.pruneWorkers(ctx)
			if err := s.store.PruneActivity(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("prune activity", "err", err)
			}
			if n, err := s.store.CollectBlobGarbage(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("collect data garbage", "err", err)
			} else if n > 0 {
				s.log.Info("collected data garbage", "blobs_and_uploads", n)
			}
		}
	})
}

// sweepLeases runs the lease reaper until it has no more lapsed leases to
// end. It leaves leases alone while this replica's writes fail, or failed
// within a lease: a heartbeat's renewal may have been among the writes
// that failed, and the worker is not at fault. The first sweep after such
// a pause (or after any gap in the sweeps, whichever replica made them)
// renews every running attempt's lease instead (store.Sweep.Gap).
func (s *Server) sweepLeases(ctx context.Context) {
	if s.health.faultWithin(s.cfg.Lease) {
		return
	}
	// After a gap every running attempt gets two leases, not one: its
	// worker's renewals then compete with the outage's backlog (results
	// sent again, claims resumed), and one was not always enough for them
	// to land on a busy machine. A replica silent for a little over its
	// touch interval died: its workers get four leases to come back
	// elsewhere before their attempts are lost (store.Sweep.ReplicaGrace).
	sw := store.Sweep{Limit: 1000, Gap: max(s.cfg.Lease/3, 2*time.Second), Lease: 2 * s.cfg.Lease,
		ReplicaSilence: replicaTouchEvery + replicaTouchEvery/5, ReplicaGrace: 4 * s.cfg.Lease}
	for {
		res, err := s.store.SweepLeases(ctx, sw)
		s.health.observe("expire leases", err)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Log(ctx, s.health.level(err), "expire leases", "err", err)
			}
			return
		}
		if res.Renewed > 0 {
			s.log.Info("leases renewed after a gap in the lease reaper's sweeps: no worker is charged for it",
				"attempts", res.Renewed, "gap", res.Since.Round(time.Millisecond))
			s.metrics.leaseGraces.Inc()
		}
		if res.Expired > 0 {
			s.log.Info("leases expired", "attempts", res.Expired)
			s.metrics.leaseExpiries.Add(float64(res.Expired))
		}
		if res.Expired < sw.Limit {
			return
		}
	}
}

// pruneWorkers deletes the records of workers gone for longer than
// Config.WorkerRetention, a thousand per transaction.
func (s *Server) pruneWorkers(ctx context.Context) {
	var total int64
	for ctx.Err() == nil {
		n, err := s.store.PruneWorkers(ctx, s.cfg.WorkerRetention, 1000)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("prune workers", "err", err)
			}
			break
		}
		total += n
		if n < 1000 {
			break
		}
	}
	if total > 0 {
		s.log.Info("pruned the records of workers gone for long", "workers", total, "retention", s.cfg.WorkerRetention)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
