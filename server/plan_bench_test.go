package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

// BenchmarkPlan is one dispatch round's plan as the throughput benchmark
// makes it: 2 workers with 40 reserved slots each, and the candidates the
// dispatcher reads for 80 slots (4 × 80 + 64), of unknown run time.
func BenchmarkPlan(b *testing.B) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var ss []sched.Sample
	for i := 5; i >= 0; i-- {
		ss = append(ss, sched.Sample{At: now.Add(-time.Duration(i) * 3 * time.Second), Online: true, Battery: -1})
	}
	workers := []planWorker{
		{w: sched.Worker{ID: "a", Slots: 80, Samples: ss, Link: -1}, idle: 40},
		{w: sched.Worker{ID: "b", Slots: 80, Samples: ss, Link: -1}, idle: 40},
	}
	cands := make([]store.Candidate, 4*80+64)
	for i := range cands {
		cands[i] = store.Candidate{TaskID: int64(i + 1), Module: "m", Name: fmt.Sprintf("t%d", i), Priority: "interactive",
			ReadySince: now.Add(-time.Second), Pending: 1, Replicas: 1, Fresh: true}
	}
	s := &dispatcher{rt: newRuntimes(), cfg: Config{Heartbeat: 3 * time.Second}}
	for b.Loop() {
		if picks := s.plan(now, cands, workers, nil); len(picks) != 80 {
			b.Fatalf("%d picks", len(picks))
		}
	}
}
