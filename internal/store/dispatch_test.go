package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkCandidatesClaimPicksComplete measures the store's side of the
// dispatcher's round as the server runs it: read the candidates
// (Candidates), claim the plan's picks (ClaimPicks), complete them
// (Complete), in batches of 80 picks with the server's candidate limit. It
// reports the time of each step per batch.
func BenchmarkCandidatesClaimPicksComplete(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b)
	tasks := make([]NewTask, b.N)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	f.submit(b, "batch", tasks...)
	const batch = 80
	var cand, claim, complete time.Duration
	batches := 0
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		t0 := time.Now()
		cs, err := f.s.Candidates(ctx, 4*n+64)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		picks := make([]Pick, 0, n)
		for _, c := range cs[:min(n, len(cs))] {
			picks = append(picks, Pick{TaskID: c.TaskID, Worker: f.worker})
		}
		claimed, err := f.s.ClaimPicks(ctx, picks, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		comps := make([]Completion, len(claimed))
		for i, c := range claimed {
			comps[i] = ok(c, "")
		}
		if _, err := f.s.Complete(ctx, comps); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		cand, claim, complete = cand+t1.Sub(t0), claim+t2.Sub(t1), complete+t3.Sub(t2)
		batches++
		done += len(claimed)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(batches) }
	b.ReportMetric(ms(cand), "candidates-ms/batch")
	b.ReportMetric(ms(claim), "claimpicks-ms/batch")
	b.ReportMetric(ms(complete), "complete-ms/batch")
}
