package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

func stabilityView(st sched.Stability) *api.WorkerStability {
	v := &api.WorkerStability{Class: st.Class.String(), Reasons: st.Reasons}
	if v.Reasons == nil {
		v.Reasons = []string{}
	}
	if st.TimeToEmpty >= 0 {
		x := st.TimeToEmpty.Seconds()
		v.TimeToEmptyS = &x
	}
	if !math.IsNaN(st.Slope) && !math.IsInf(st.Slope, 0) {
		x := st.Slope
		v.BatterySlopePerHour = &x
	}
	return v
}

// handleWorkers lists the connected workers of every replica: kind, device
// state, reputation; for those connected to this replica also the
// stability class with its reasons, running attempts and tasks done. It
// adds the fairness metric (variance of tasks done per worker here).
func (s *Server) handleWorkers(w http.ResponseWriter, r *http.Request, _ store.Owner) {
	rep, err := s.workers(r.Context())
	if err != nil {
		s.serverError(w, "list workers", err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// handleActivity is GET /api/v1/activity?minutes=N: tasks done (by every
// owner) and workers connected per minute over the last N minutes (default
// 60, at most 1440), the data of the dashboard's plots.
func (s *Server) handleActivity(w http.ResponseWriter, r *http.Request, _ store.Owner) {
	n := activityMinutes
	if v := r.URL.Query().Get("minutes"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 1440 {
			writeError(w, http.StatusBadRequest, "minutes must be a whole number from 1 to 1440, not %q", v)
			return
		}
	}
	act, err := s.store.Activity(r.Context(), n)
	if err != nil {
		s.serverError(w, "read activity", err)
		return
	}
	writeJSON(w, http.StatusOK, apiActivity(act))
}

// workers builds GET /api/v1/workers' answer; the dashboard's volunteers
// page shows the same.
func (s *Server) workers(ctx context.Context) (api.WorkerList, error) {
	recs, err := s.store.Workers(ctx, nil)
	if err != nil {
		return api.WorkerList{}, err
	}
	now := time.Now()
	cfg := s.disp.schedConfig()
	out := make([]api.Worker, 0, len(recs))
	var jobs []int
	for _, rec := range recs {
		rep := rec.Reputation(s.cfg.Verify)
		v := api.Worker{ID: rec.ID, Kind: rec.Kind, Slots: rec.Slots, Volunteer: rec.Volunteer, Replica: rec.Replica,
			ConnectedAt: rec.ConnectedAt, LastSeen: rec.LastSeen, Device: rec.Device, Attempts: rec.Attempts, TasksLost: rec.TasksLost,
			Reputation: api.WorkerReputation{Valid: rec.ResultsValid, Invalid: rec.ResultsInvalid, Score: rep.Score(),
				Trusted: rep.Trusted(s.cfg.Verify)},
			Operator: rec.Operator, Strikes: math.Round(rec.Strikes*100) / 100, Build: rec.Build}
		if st, ok := s.hub.stateOf(rec.ID); ok {
			running, done, allowed := st.running, st.tasksDone, st.allowed
			v.Running, v.TasksDone, v.Allowed = &running, &done, &allowed
			if dev, err := json.Marshal(st.device); err == nil {
				v.Device = dev
			}
			v.Stability = stabilityView(sched.Classify(now, st.samples, historyOf(rec), cfg.Stability))
			jobs = append(jobs, done)
		}
		out = append(out, v)
	}
	return api.WorkerList{Workers: out, Fairness: api.Fairness{Strategy: s.cfg.Fairness.String(), VarianceTasksDone: sched.Variance(jobs)}}, nil
}
