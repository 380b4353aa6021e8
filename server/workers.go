package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

// workerStability is a worker's stability class as the API shows it.
type workerStability struct {
	Class       string   `json:"class"`
	Reasons     []string `json:"reasons"`
	TimeToEmpty *float64 `json:"time_to_empty_s"` // null when no drain is predicted
	SlopePerH   *float64 `json:"battery_slope_per_hour"`
}

// workerReputation is a worker's record of verified results.
type workerReputation struct {
	Valid   int64   `json:"valid"`
	Invalid int64   `json:"invalid"`
	Score   float64 `json:"score"`
	Trusted bool    `json:"trusted"`
}

// workerView is one worker in GET /api/v1/workers.
type workerView struct {
	ID          string           `json:"id"`
	Kind        string           `json:"kind"`
	Slots       int              `json:"slots"`
	Volunteer   string           `json:"volunteer"`
	Replica     string           `json:"replica"`
	ConnectedAt time.Time        `json:"connected_at"`
	LastSeen    time.Time        `json:"last_seen"`
	Device      json.RawMessage  `json:"device"`
	Running     *int             `json:"running"`    // null: connected to another replica
	TasksDone   *int             `json:"tasks_done"` // results accepted since it connected; null: another replica
	Attempts    int64            `json:"attempts"`
	TasksLost   int64            `json:"tasks_lost"`
	Stability   *workerStability `json:"stability"` // null: connected to another replica
	Reputation  workerReputation `json:"reputation"`
	// Operator: it presented an operator key. Strikes: its strikes as of
	// now (sched.Standing). Allowed: the attempts it may hold now, fewer
	// than its slots and queue while its standing holds it back; null:
	// another replica.
	Operator bool    `json:"operator"`
	Strikes  float64 `json:"strikes"`
	Allowed  *int    `json:"allowed"`
	// Build is the worker's build, as it said ("" for a worker too old
	// to say).
	Build string `json:"build"`
}

func stabilityView(st sched.Stability) *workerStability {
	v := &workerStability{Class: st.Class.String(), Reasons: st.Reasons}
	if v.Reasons == nil {
		v.Reasons = []string{}
	}
	if st.TimeToEmpty >= 0 {
		x := st.TimeToEmpty.Seconds()
		v.TimeToEmpty = &x
	}
	if !math.IsNaN(st.Slope) && !math.IsInf(st.Slope, 0) {
		x := st.Slope
		v.SlopePerH = &x
	}
	return v
}

// workerFairness is the fairness of the load in GET /api/v1/workers.
type workerFairness struct {
	Strategy          string  `json:"strategy"`
	VarianceTasksDone float64 `json:"variance_tasks_done"`
}

// workersReport is the answer of GET /api/v1/workers.
type workersReport struct {
	Workers  []workerView   `json:"workers"`
	Fairness workerFairness `json:"fairness"`
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
	writeJSON(w, http.StatusOK, map[string]any{"minutes": act})
}

// workers builds GET /api/v1/workers' answer; the dashboard's volunteers
// page shows the same.
func (s *Server) workers(ctx context.Context) (workersReport, error) {
	recs, err := s.store.Workers(ctx, nil)
	if err != nil {
		return workersReport{}, err
	}
	now := time.Now()
	cfg := s.schedConfig()
	out := make([]workerView, 0, len(recs))
	var jobs []int
	s.hub.mu.Lock()
	for _, rec := range recs {
		rep := rec.Reputation(s.cfg.Verify)
		v := workerView{ID: rec.ID, Kind: rec.Kind, Slots: rec.Slots, Volunteer: rec.Volunteer, Replica: rec.Replica,
			ConnectedAt: rec.ConnectedAt, LastSeen: rec.LastSeen, Device: rec.Device, Attempts: rec.Attempts, TasksLost: rec.TasksLost,
			Reputation: workerReputation{Valid: rec.ResultsValid, Invalid: rec.ResultsInvalid, Score: rep.Score(),
				Trusted: rep.Trusted(s.cfg.Verify)},
			Operator: rec.Operator, Strikes: math.Round(rec.Strikes*100) / 100, Build: rec.Build}
		if c := s.hub.conns[rec.ID]; c != nil {
			running, done, allowed := len(c.running), c.tasksDone, c.allowed()
			v.Running, v.TasksDone, v.Allowed = &running, &done, &allowed
			if dev, err := json.Marshal(c.device); err == nil {
				v.Device = dev
			}
			h := sched.History{Attempts: int(rec.Attempts), Lost: int(rec.TasksLost), Valid: int(rec.ResultsValid), Invalid: int(rec.ResultsInvalid)}
			v.Stability = stabilityView(sched.Classify(now, slices.Clone(c.samples), h, cfg.Stability))
			jobs = append(jobs, done)
		}
		out = append(out, v)
	}
	s.hub.mu.Unlock()
	return workersReport{Workers: out, Fairness: workerFairness{Strategy: s.cfg.Fairness.String(), VarianceTasksDone: sched.Variance(jobs)}}, nil
}
