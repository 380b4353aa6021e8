package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Workers reads GET /api/v1/workers as documented in docs/API.md, with the
// fields another server replica leaves null.
func TestWorkers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/workers" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"workers": [{
		   "id": "w1", "kind": "browser", "slots": 2, "volunteer": "", "replica": "replica-1a2b",
		   "connected_at": "2026-11-22T10:00:00Z", "last_seen": "2026-11-22T10:01:00Z",
		   "device": {"battery": 0.62, "charging": "no"},
		   "running": 1, "tasks_done": 14, "attempts": 20, "tasks_lost": 1,
		   "stability": {"class": "unstable", "reasons": ["on battery (62%)"], "time_to_empty_s": 1260, "battery_slope_per_hour": -1.7},
		   "reputation": {"valid": 12, "invalid": 0, "score": 0.93, "trusted": false}},
		  {"id": "w2", "kind": "headless", "slots": 4, "running": null, "tasks_done": null, "stability": null,
		   "reputation": {"valid": 0, "invalid": 2, "score": 0.25, "trusted": false}}],
		 "fairness": {"strategy": "not_best", "variance_tasks_done": 2.5}}`)
	}))
	defer srv.Close()
	l, err := New(srv.URL, "tok").Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Workers) != 2 || l.Fairness.Strategy != "not_best" || l.Fairness.VarianceTasksDone != 2.5 {
		t.Fatalf("workers = %+v", l)
	}
	w1, w2 := l.Workers[0], l.Workers[1]
	if w1.Stability == nil || w1.Stability.Class != StabilityUnstable || *w1.Stability.TimeToEmptyS != 1260 ||
		*w1.TasksDone != 14 || *w1.Running != 1 || w1.Reputation.Valid != 12 || w1.Reputation.Score != 0.93 {
		t.Errorf("w1 = %+v, stability %+v", w1, w1.Stability)
	}
	if w2.Stability != nil || w2.TasksDone != nil || w2.Running != nil || w2.Reputation.Invalid != 2 {
		t.Errorf("w2 = %+v", w2)
	}
}
