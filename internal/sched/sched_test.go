package sched

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// series builds n heartbeats every 10 s ending at t0, the last at level end,
// draining perHour.
func series(end, perHour float64, n int, charging bool, conn string) []Sample {
	var ss []Sample
	for i := 0; i < n; i++ {
		back := time.Duration(n-1-i) * 10 * time.Second
		ss = append(ss, Sample{At: t0.Add(-back), Battery: end + perHour*back.Hours(), Charging: charging, Online: true, Connection: conn})
	}
	return ss
}

func TestBatteryTrend(t *testing.T) {
	ss := series(0.5, 0.6, 30, false, "wifi") // 60%/h: empty in 50 min
	slope, tte, ok := BatteryTrend(t0, ss, 10*time.Minute, 3)
	if !ok || math.Abs(slope+0.6) > 1e-9 || (tte-50*time.Minute).Abs() > time.Second {
		t.Fatalf("slope %v tte %v ok %v", slope, tte, ok)
	}
	if _, _, ok := BatteryTrend(t0, ss[:2], 10*time.Minute, 3); ok {
		t.Fatal("two samples gave a trend")
	}
	if _, tte, _ := BatteryTrend(t0, series(0.5, -0.2, 10, true, ""), time.Hour, 3); tte >= 0 {
		t.Fatalf("charging predicted empty in %v", tte)
	}
}

func TestClassify(t *testing.T) {
	cfg := DefaultStability()
	good := History{Attempts: 20}
	cases := []struct {
		name    string
		samples []Sample
		h       History
		want    Class
		reason  string
	}{
		{"mains, long clean history", series(-1, 0, 10, false, "ethernet"), good, VeryStable, ""},
		{"charging phone", series(0.4, -0.3, 10, true, "wifi"), good, VeryStable, ""},
		{"battery draining slowly", series(0.9, 0.1, 30, false, "wifi"), good, Stable, "on battery"},
		{"empty in 20 min", series(0.2, 0.6, 30, false, "wifi"), good, Unstable, "predicted empty"},
		{"empty in 3 min", series(0.15, 3, 30, false, "wifi"), good, TooUnstable, "predicted empty"},
		{"below floor", series(0.05, 0.01, 30, false, "wifi"), good, TooUnstable, "below floor"},
		{"offline", []Sample{{At: t0, Battery: -1}}, good, TooUnstable, "offline"},
		{"2g", series(-1, 0, 10, false, "2g"), good, Unstable, "slow connection"},
		{"loses attempts", series(-1, 0, 10, false, "wifi"), History{Attempts: 10, Lost: 3}, Unstable, "lost 3 of 10"},
		{"loses most", series(-1, 0, 10, false, "wifi"), History{Attempts: 10, Lost: 6}, TooUnstable, "lost 6 of 10"},
		{"new worker", series(-1, 0, 10, false, "wifi"), History{}, Stable, "short history"},
		{"jittery", []Sample{{At: t0.Add(-100 * time.Second), Battery: -1, Online: true}, {At: t0.Add(-95 * time.Second), Battery: -1, Online: true}, {At: t0.Add(-20 * time.Second), Battery: -1, Online: true}, {At: t0, Battery: -1, Online: true}}, good, Unstable, "jitter"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := Classify(t0, c.samples, c.h, cfg)
			if st.Class != c.want {
				t.Fatalf("class %v, want %v (reasons %q)", st.Class, c.want, st.Reasons)
			}
			if c.reason != "" && !contains(st.Reasons, c.reason) {
				t.Fatalf("reasons %q lack %q", st.Reasons, c.reason)
			}
		})
	}
}

func contains(ss []string, sub string) bool {
	for _, s := range ss {
		if len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0) {
			return true
		}
	}
	return false
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

func TestFits(t *testing.T) {
	cfg := DefaultStability()
	cases := []struct {
		st      Stability
		run     time.Duration
		replica bool
		want    bool
	}{
		{Stability{Class: VeryStable, TimeToEmpty: -1}, time.Hour, false, true},
		{Stability{Class: Stable, TimeToEmpty: 40 * time.Minute}, 30 * time.Minute, false, false}, // dies before 1.5x run
		{Stability{Class: Stable, TimeToEmpty: 40 * time.Minute}, 20 * time.Minute, false, true},
		{Stability{Class: Unstable, TimeToEmpty: -1}, time.Minute, false, true},
		{Stability{Class: Unstable, TimeToEmpty: -1}, 10 * time.Minute, false, false},
		{Stability{Class: Unstable, TimeToEmpty: -1}, 10 * time.Minute, true, true},
		{Stability{Class: Unstable, TimeToEmpty: -1}, 0, false, false},
		{Stability{Class: TooUnstable, TimeToEmpty: -1}, time.Second, true, false},
	}
	for i, c := range cases {
		if got, why := c.st.Fits(c.run, c.replica, cfg); got != c.want {
			t.Errorf("case %d: fits %v (%s), want %v", i, got, why, c.want)
		}
	}
}

func TestRefrains(t *testing.T) {
	nb := []float64{0.5, 0.7, 0.9}
	cases := []struct {
		s    Strategy
		self float64
		want bool
	}{
		{None, 0, false},
		{NotBest, 0.8, true}, {NotBest, 0.9, false}, {NotBest, 1, false},
		{Worst, 0.4, true}, {Worst, 0.5, false}, {Worst, 0.6, false},
		{WorseThanAverage, 0.69, true}, {WorseThanAverage, 0.71, false},
		{WorseThanMajority, 0.6, true}, {WorseThanMajority, 0.7, false},
		{EqualOrWorseThanMajority, 0.7, true}, {EqualOrWorseThanMajority, 0.71, false},
	}
	for _, c := range cases {
		if got := c.s.Refrains(c.self, nb); got != c.want {
			t.Errorf("%v self %v: %v, want %v", c.s, c.self, got, c.want)
		}
	}
	for _, s := range Strategies() {
		if s.Refrains(0, nil) {
			t.Errorf("%v refrains with no neighbours", s)
		}
		p, err := ParseStrategy(s.String())
		if err != nil || p != s {
			t.Errorf("parse %v: %v %v", s, p, err)
		}
	}
}

func TestGroup(t *testing.T) {
	ids := []string{"e", "a", "d", "b", "c"} // ring a b c d e
	g := Group(ids, 1, 4)                    // self "a": 1 before (e), 2 after (b, c)
	want := []string{"e", "b", "c"}
	if len(g) != 3 {
		t.Fatalf("group %v", g)
	}
	for k, i := range g {
		if ids[i] != want[k] {
			t.Fatalf("group %v, want %v", g, want)
		}
	}
	if g := Group(ids, 0, 99); len(g) != 4 {
		t.Fatalf("whole network group has %d", len(g))
	}
	if Group(ids, 0, 1) != nil {
		t.Fatal("n=1 has neighbours")
	}
}

func TestVariance(t *testing.T) {
	// The paper's "no fairness" figure: 2 of 20 workers do all 60 jobs.
	jobs := make([]int, 20)
	jobs[0], jobs[1] = 30, 30
	if v := Variance(jobs); math.Abs(v-85.26) > 0.01 {
		t.Fatalf("variance %v, want 85.26", v)
	}
	if Variance([]int{3, 3, 3}) != 0 {
		t.Fatal("equal jobs not 0")
	}
}

// A fairness strategy never leaves a task unassigned forever: whatever the
// strategy and the performance values, once the task has waited past the
// deadlock bound it is assigned to an idle worker.
func TestFairnessNeverStarves(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range Strategies() {
		for trial := 0; trial < 200; trial++ {
			n := 2 + rng.IntN(12)
			ws := make([]Worker, n)
			for i := range ws {
				ws[i] = Worker{ID: fmt.Sprintf("w%02d", i), Slots: 1, JobsDone: rng.IntN(10), History: History{Attempts: 20}}
				if rng.IntN(2) == 0 {
					ws[i].Busy = 1
				} else {
					ws[i].Idle = 1
				}
			}
			ws[rng.IntN(n)].Idle, ws[0].Busy = 1, 0
			cfg := DefaultConfig()
			cfg.Fairness, cfg.GroupSize = s, 1+rng.IntN(n+1)
			task := Task{ID: "t", ReadySince: t0, Priority: Batch}
			assigned := false
			for wait := time.Duration(0); wait <= time.Duration(n+1)*cfg.DeadlockPerCandidate; wait += time.Second {
				p := Schedule(FixedClock(t0.Add(wait)), Input{Ready: []Task{task}, Workers: ws}, cfg)
				if len(p.Assignments) == 1 {
					assigned = true
					break
				}
			}
			if !assigned {
				t.Fatalf("%v: task never assigned (trial %d)", s, trial)
			}
		}
	}
}

func TestScheduleRules(t *testing.T) {
	cfg := DefaultConfig()
	mains := series(-1, 0, 10, false, "ethernet")
	dying := series(0.2, 0.6, 30, false, "wifi") // unstable, 20 min left
	ws := []Worker{
		{ID: "a", Slots: 1, Idle: 1, Samples: dying, History: History{Attempts: 20}},
		{ID: "b", Slots: 1, Idle: 1, Samples: mains, History: History{Attempts: 20}},
		{ID: "c", Slots: 1, Idle: 1, Samples: series(0.02, 0.01, 30, false, "wifi"), History: History{Attempts: 20}},
	}
	ready := []Task{
		{ID: "short", Estimate: time.Minute, ReadySince: t0, Priority: Batch},
		{ID: "long", Estimate: time.Hour, ReadySince: t0, Priority: Batch},
		{ID: "long", Replica: 1, Estimate: time.Hour, ReadySince: t0, Priority: Batch, Exclude: []string{"x"}},
	}
	p := Schedule(FixedClock(t0), Input{Ready: ready, Workers: ws}, cfg)
	got := map[string]string{}
	for _, a := range p.Assignments {
		got[fmt.Sprint(a.Task, a.Replica)] = a.Worker
	}
	// Longest first: "long" goes to the very stable worker b, "short" to
	// the unstable a; the replica of "long" cannot go to b (holds one),
	// not to a (would die before it ends), not to c (too unstable).
	if got["long0"] != "b" || got["short0"] != "a" || got["long1"] != "" {
		t.Fatalf("assignments %v, waiting %v", got, p.Waiting)
	}
	if p.Stability["c"].Class != TooUnstable || len(p.Waiting) != 1 {
		t.Fatalf("stability %v waiting %v", p.Stability["c"], p.Waiting)
	}
}

func TestNoTwoReplicasOnOneWorker(t *testing.T) {
	ws := []Worker{{ID: "a", Slots: 4, Idle: 4, Samples: series(-1, 0, 10, false, ""), History: History{Attempts: 20}}}
	ready := []Task{{ID: "t", ReadySince: t0}, {ID: "t", Replica: 1, ReadySince: t0}, {ID: "t", Replica: 2, ReadySince: t0}}
	p := Schedule(FixedClock(t0), Input{Ready: ready, Workers: ws}, DefaultConfig())
	if len(p.Assignments) != 1 || len(p.Waiting) != 2 {
		t.Fatalf("assignments %v", p.Assignments)
	}
}

// ScheduleRounds gives each worker one slot per round: longest first, the
// work alternates between the workers while both have idle slots, replicas
// stay on distinct workers across rounds, and a task withdrawn by placed
// leaves no instance waiting.
func TestScheduleRounds(t *testing.T) {
	mains := series(-1, 0, 10, false, "ethernet")
	ws := []Worker{
		{ID: "a", Slots: 3, Idle: 3, Samples: mains, History: History{Attempts: 20}},
		{ID: "b", Slots: 2, Idle: 1, Samples: mains, History: History{Attempts: 20}},
	}
	ready := []Task{
		{ID: "t1", Estimate: time.Minute, ReadySince: t0, Priority: Batch},
		{ID: "t4", Estimate: 4 * time.Minute, ReadySince: t0, Priority: Batch},
		{ID: "t3", Estimate: 3 * time.Minute, ReadySince: t0, Priority: Batch},
		{ID: "t2", Estimate: 2 * time.Minute, ReadySince: t0, Priority: Batch},
		{ID: "r", Estimate: 30 * time.Second, ReadySince: t0, Priority: Batch},
		{ID: "r", Replica: 1, Estimate: 30 * time.Second, ReadySince: t0, Priority: Batch},
	}
	p := ScheduleRounds(FixedClock(t0), Input{Ready: ready, Workers: ws}, DefaultConfig(), nil)
	var got []string
	for _, a := range p.Assignments {
		got = append(got, a.Task+"@"+a.Worker)
	}
	// Round 1: t4 to a, t3 to b; then only a is idle: t2, t1.
	if want := "[t4@a t3@b t2@a t1@a]"; fmt.Sprint(got) != want {
		t.Fatalf("assignments %v, want %s", got, want)
	}
	if len(p.Waiting) != 2 || p.Waiting[0].Reason != "no idle slot" {
		t.Fatalf("waiting %v", p.Waiting)
	}

	ws[1].Idle = 2
	ready = ready[4:] // the two replicas of r
	var seen []string
	p = ScheduleRounds(FixedClock(t0), Input{Ready: ready, Workers: ws}, DefaultConfig(), func(a Assignment) bool {
		seen = append(seen, a.Task+"@"+a.Worker)
		return false // r runs alone
	})
	if fmt.Sprint(seen) != "[r@a]" || len(p.Assignments) != 1 || len(p.Waiting) != 0 {
		t.Fatalf("withdrawn: seen %v, assignments %v, waiting %v", seen, p.Assignments, p.Waiting)
	}
	p = ScheduleRounds(FixedClock(t0), Input{Ready: ready, Workers: ws}, DefaultConfig(), nil)
	if len(p.Assignments) != 2 || p.Assignments[0].Worker == p.Assignments[1].Worker {
		t.Fatalf("replicas: %v", p.Assignments)
	}
}

func TestLongestFirst(t *testing.T) {
	var st RuntimeStats
	st.Observe("m", "a", 10*time.Second)
	st.Observe("m", "a", 30*time.Second)
	st.Observe("m", "b", 50*time.Second)
	if d, ok := st.Expected("m", "a"); !ok || d != 20*time.Second {
		t.Fatalf("a: %v", d)
	}
	if d, ok := st.Expected("m", "zzz"); !ok || d != 30*time.Second { // module average
		t.Fatalf("module average %v", d)
	}
	if _, ok := st.Expected("other", "a"); ok {
		t.Fatal("unknown module known")
	}
	// A module average loaded from the database covers names without an
	// average of their own.
	var loaded RuntimeStats
	loaded.Set("m", "a", 2, 20*time.Second)
	loaded.SetModule("m", 100, 2*time.Second)
	if d, _ := loaded.Expected("m", "a"); d != 20*time.Second {
		t.Fatalf("loaded a: %v", d)
	}
	if d, _ := loaded.Expected("m", "zzz"); d != 2*time.Second {
		t.Fatalf("loaded module average: %v", d)
	}
	tasks := []Task{
		{ID: "1", Module: "m", Name: "a", Priority: Batch},
		{ID: "2", Module: "m", Name: "b", Priority: Batch},
		{ID: "3", Module: "x", Name: "q", Priority: Batch},
		{ID: "4", Module: "m", Name: "a", Priority: Interactive},
	}
	order := LongestFirst(len(tasks), func(i int) int { return int(tasks[i].Priority) },
		func(i int) (time.Duration, bool) { return st.Expected(tasks[i].Module, tasks[i].Name) }, rand.New(rand.NewPCG(1, 1)))
	var ids string
	for _, i := range order {
		ids += tasks[i].ID
	}
	if ids != "4321" { // interactive first; unknown (3) explored first; then 50 s, 20 s
		t.Fatalf("order %s", ids)
	}
}

func TestEfficiencyAndCap(t *testing.T) {
	e := Efficiency([]WorkerTime{{Work: 8 * time.Second, Up: 10 * time.Second}, {Work: 4 * time.Second, Up: 10 * time.Second, Suspended: 5 * time.Second}})
	if math.Abs(e-0.8) > 1e-9 {
		t.Fatalf("efficiency %v", e)
	}
	cases := []struct {
		share   float64
		similar bool
		want    float64
	}{
		{0.2, true, 1}, {0.2, false, 0.6}, {0.3, true, 0.7}, {0.45, true, 0.55}, {0.45, false, 0.35},
		{0.5, false, 0.30}, {0.95, true, 0.25}, {0.9, false, 0.2},
	}
	for _, c := range cases {
		if got := WorkerShare(c.share, c.similar); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("share %v similar %v: %v, want %v", c.share, c.similar, got, c.want)
		}
	}
	// 10 tasks: two of 40 s (similar), eight of 5 s: the largest 20% do
	// 80/120 = 67% of the work -> 35% of 10 workers -> 4.
	runs := []time.Duration{40, 40, 5, 5, 5, 5, 5, 5, 5, 5}
	for i := range runs {
		runs[i] *= time.Second
	}
	share, similar := Workload(runs)
	if math.Abs(share-80.0/120) > 1e-9 || !similar {
		t.Fatalf("workload %v %v", share, similar)
	}
	if c := ParallelismCap(runs); c != 4 {
		t.Fatalf("cap %d", c)
	}
	if AdjustWorkers(4, 4, false, 1.0, 0.7) != 3 || AdjustWorkers(3, 4, false, 1.0, 0.9) != 4 || AdjustWorkers(4, 4, false, 1.0, 0.9) != 4 || AdjustWorkers(2, 4, true, 2, 0.1) != 4 {
		t.Fatal("AdjustWorkers")
	}
}

// The checkpoint optimum matches the closed form and the paper's Listing 1.
func TestOptimalCheckpoints(t *testing.T) {
	cases := []struct{ mu, T, C float64 }{
		{0.003, 300, 6}, {0.001, 3600, 10}, {0.01, 100, 1}, {0.0001, 86400, 30}, {0.05, 600, 2}, {0.003, 300, 400},
	}
	for _, c := range cases {
		p := OptimalCheckpoints(c.mu, secs(c.T), secs(c.C), 0)
		// brute force over N
		best, bestN := math.Inf(1), 0
		for n := 1; n <= 5000; n++ {
			if e := ExpectedTimeCheckpointed(c.mu, c.T, n, c.C); e < best-1e-9 {
				best, bestN = e, n
			}
		}
		if p.Segments != bestN {
			t.Errorf("%+v: closed form %d segments, brute force %d", c, p.Segments, bestN)
		}
		if l := ListingOptimalSegments(c.mu, c.T, c.C); l != bestN {
			t.Errorf("%+v: listing %d, brute force %d", c, l, bestN)
		}
		// N* is a stationary point of E_Y: dE/dN = E_x(T/N) - (T/N) e^(mu T/N) + C = 0.
		ns := OptimalSegmentsReal(c.mu, c.T, c.C)
		if ns > 0 && !math.IsInf(ns, 1) {
			x := c.T / ns
			if d := ExpectedTime(c.mu, x) - x*math.Exp(c.mu*x) + c.C; math.Abs(d) > 1e-6 {
				t.Errorf("%+v: derivative %v at N*=%v", c, d, ns)
			}
		}
	}
	// The paper's setting: T=300 s, mu=0.003, C=6 s.
	p := OptimalCheckpoints(0.003, 300*time.Second, 6*time.Second, 0)
	if p.Segments != 5 || p.Interval != time.Minute {
		t.Fatalf("workrs setting: %+v", p)
	}
	for _, x := range []float64{-1 / math.E, -0.3, -0.1, 0.5, 1, 10, 1000} {
		w := lambertW0(x)
		if math.Abs(w*math.Exp(w)-x) > 1e-9 {
			t.Errorf("W(%v) = %v", x, w)
		}
	}
	if !CheckpointDue(time.Minute, time.Minute) || CheckpointDue(time.Hour, 0) {
		t.Fatal("CheckpointDue")
	}
	if r := FaultRate(3, 1000*time.Second, 0, 0); r != 0.003 {
		t.Fatalf("fault rate %v", r)
	}
}

func TestDecide(t *testing.T) {
	cfg := VerifyConfig{Replicas: 2, Quorum: 2, MaxReplicas: 5}
	r := func(ws ...string) []Result {
		var out []Result
		for i, h := range ws {
			out = append(out, Result{Worker: fmt.Sprint("w", i), Hash: h})
		}
		return out
	}
	cases := []struct {
		name        string
		results     []Result
		outstanding int
		trusted     bool
		state       VerdictState
		hash        string
		more        int
	}{
		{"agree", r("a", "a"), 0, false, Accepted, "a", 0},
		{"disagree", r("a", "b"), 0, false, Pending, "", 1},
		{"one waiting", r("a"), 1, false, Pending, "", 0},
		{"trusted alone", r("a"), 0, true, Accepted, "a", 0},
		{"untrusted alone", r("a"), 0, false, Pending, "", 1},
		{"three way", r("a", "b", "c"), 0, false, Pending, "", 2},
		{"majority", r("a", "b", "a"), 0, false, Accepted, "a", 0},
		{"tie 2-2", r("a", "a", "b", "b"), 0, false, Pending, "", 1},
		{"exhausted", r("a", "b", "c", "d", "e"), 0, false, Failed, "", 0},
		{"impossible", r("a", "b", "c", "d"), 0, false, Failed, "", 0},
	}
	for _, c := range cases {
		v := Decide(c.results, c.outstanding, cfg, c.trusted)
		if v.State != c.state || v.Hash != c.hash || v.More != c.more {
			t.Errorf("%s: %+v", c.name, v)
		}
	}
	v := Decide(r("a", "b", "a"), 0, cfg, false)
	if len(v.Losers) != 1 || v.Losers[0] != "w1" || len(v.Winners) != 2 {
		t.Fatalf("losers %v winners %v", v.Losers, v.Winners)
	}
}

// A quorum never accepts a minority result: for random result sequences,
// whenever Decide accepts a hash, it is carried by a strict majority of the
// results received so far and by at least quorum of them.
func TestQuorumNeverAcceptsMinority(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := 0; trial < 20000; trial++ {
		cfg := VerifyConfig{Quorum: 1 + rng.IntN(4), MaxReplicas: 1 + rng.IntN(9)}
		var res []Result
		for i := 0; i < 10; i++ {
			res = append(res, Result{Worker: fmt.Sprint(i), Hash: string(rune('a' + rng.IntN(3)))})
			trusted := rng.IntN(4) == 0
			v := Decide(res, 0, cfg, trusted)
			if v.State == Accepted {
				n := 0
				for _, x := range res {
					if x.Hash == v.Hash {
						n++
					}
				}
				if 2*n <= len(res) {
					t.Fatalf("accepted minority %q in %v", v.Hash, res)
				}
				if n < cfg.Quorum && !(trusted && len(res) == 1) {
					t.Fatalf("accepted %q with %d results, fewer than quorum %d: %v", v.Hash, n, cfg.Quorum, res)
				}
				break
			}
			if v.State == Failed {
				break
			}
		}
	}
}

func TestReputation(t *testing.T) {
	cfg := VerifyConfig{Replicas: 2, Quorum: 2, MaxReplicas: 5, TrustAfter: 5, TrustWindow: 3}
	var r Reputation
	if InitialReplicas(cfg, r) != 2 || r.Score() != 0.5 {
		t.Fatal("new worker")
	}
	for i := 0; i < 5; i++ {
		r = r.Record(true, 3)
	}
	if !r.Trusted(cfg) || InitialReplicas(cfg, r) != 1 {
		t.Fatal("trusted")
	}
	r = r.Record(false, 3)
	if r.Trusted(cfg) || r.Score() >= 6.0/7 {
		t.Fatalf("after a loss: %+v", r)
	}
	acc := []AcceptedResult{{Task: "x", Worker: "bad"}, {Task: "y", Worker: "bad", Verified: true}, {Task: "z", Worker: "good"}}
	if got := Recheck("bad", acc); len(got) != 1 || got[0] != "x" {
		t.Fatalf("recheck %v", got)
	}
}

func TestStandingAllowance(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Standing
		want int
	}{
		{"a new worker", Standing{}, 8},
		{"a few strikes never hold a worker back", Standing{Results: 0, Strikes: 2.9}, 8},
		{"strikes against few results: one at a time", Standing{Results: 4, Strikes: 3}, 1},
		{"many strikes and few results: none", Standing{Results: 10, Strikes: 6}, 0},
		{"many strikes, more than twice as many results: one at a time", Standing{Results: 13, Strikes: 6}, 1},
		{"strikes that are a small share of many results", Standing{Results: 1000, Strikes: 20}, 8},
	} {
		if got := tc.s.Allowance(8); got != tc.want {
			t.Errorf("%s: Allowance(8) = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// Locality: an idle worker that holds a task's data takes that task before
// its turn, within LocalityWindow of the head and while the head has not
// waited LocalityMaxWait; past them, the order rules.
func TestScheduleRoundsLocality(t *testing.T) {
	mains := series(-1, 0, 10, false, "ethernet")
	workers := func() []Worker {
		return []Worker{
			{ID: "a", Slots: 1, Idle: 1, Samples: mains, History: History{Attempts: 20}, Holds: map[string]bool{"X": true}},
			{ID: "b", Slots: 1, Idle: 1, Samples: mains, History: History{Attempts: 20}, Holds: map[string]bool{"Y": true}},
		}
	}
	tasks := func(waited time.Duration, filler int) []Task {
		var ts []Task
		for i := range filler {
			ts = append(ts, Task{ID: fmt.Sprintf("f%02d", i), Estimate: time.Hour - time.Duration(i)*time.Second, ReadySince: t0.Add(-waited), Priority: Batch})
		}
		return append(ts,
			Task{ID: "y1", Estimate: 4 * time.Minute, ReadySince: t0.Add(-waited), Priority: Batch, Data: []string{"Y"}},
			Task{ID: "x1", Estimate: 3 * time.Minute, ReadySince: t0.Add(-waited), Priority: Batch, Data: []string{"X"}},
			Task{ID: "y2", Estimate: 2 * time.Minute, ReadySince: t0.Add(-waited), Priority: Batch, Data: []string{"Y"}},
			Task{ID: "xy", Estimate: time.Minute, ReadySince: t0.Add(-waited), Priority: Batch, Data: []string{"X", "Y"}},
		)
	}
	tests := []struct {
		name  string
		tasks []Task
		cfg   Config
		want  string
	}{
		{"each worker takes the task whose data it holds", tasks(0, 0), DefaultConfig(), "[x1@a y1@b]"},
		{"the head waited too long: order rules", tasks(LocalityMaxWait, 0), DefaultConfig(), "[y1@a x1@b]"},
		{"data tasks past the window: order rules", tasks(0, LocalityWindow), DefaultConfig(), "[f00@a f01@b]"},
		{"within the window: data first, then order", tasks(0, 3), DefaultConfig(), "[x1@a y1@b]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := ScheduleRounds(FixedClock(t0), Input{Ready: tc.tasks, Workers: workers()}, tc.cfg, nil)
			var got []string
			for _, a := range p.Assignments {
				got = append(got, a.Task+"@"+a.Worker)
			}
			if fmt.Sprint(got) != tc.want {
				t.Fatalf("assignments %v, want %s", got, tc.want)
			}
		})
	}
}

func TestHeartbeatJitterCountsGapsInTheirIntervals(t *testing.T) {
	const normal, idle = 3 * time.Second, 12 * time.Second
	// beats returns samples at the given offsets (s before t0), each
	// naming the interval it keeps after it.
	beats := func(at []int, every []time.Duration) []Sample {
		ss := make([]Sample, len(at))
		for i := range at {
			ss[i] = Sample{At: t0.Add(-time.Duration(at[i]) * time.Second), Battery: -1, Online: true, Every: every[i]}
		}
		return ss
	}
	cases := []struct {
		name     string
		samples  []Sample
		atMost   float64 // the jitter is at most this
		atLeast  float64 // and at least this
		unstable bool
	}{
		{"normal, on time", beats([]int{12, 9, 6, 3, 0}, []time.Duration{normal, normal, normal, normal, normal}), 0.01, 0, false},
		{"idle, on time", beats([]int{48, 36, 24, 12, 0}, []time.Duration{idle, idle, idle, idle, idle}), 0.01, 0, false},
		{"paused, then resumed", beats([]int{42, 30, 18, 6, 3, 0}, []time.Duration{idle, idle, idle, normal, normal, normal}), 0.01, 0, false},
		{"idle gaps on the normal interval's samples", beats([]int{36, 24, 12, 9, 6, 3, 0}, []time.Duration{normal, normal, normal, normal, normal, normal, normal}), 2, 0.6, true},
		{"no interval named: seconds", beats([]int{36, 24, 21, 0}, []time.Duration{0, 0, 0, 0}), 2, 0.5, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := HeartbeatJitter(t0, c.samples, 10*time.Minute)
			if j > c.atMost || j < c.atLeast {
				t.Fatalf("jitter %.3f, want %.2f to %.2f", j, c.atLeast, c.atMost)
			}
			st := Classify(t0, c.samples, History{Attempts: 20}, DefaultStability())
			if got := contains(st.Reasons, "jitter"); got != c.unstable {
				t.Fatalf("jitter among the reasons: %v, want %v (%q)", got, c.unstable, st.Reasons)
			}
		})
	}
}
