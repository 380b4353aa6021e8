package server

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

func TestPlan(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	hb := func(online bool, battery float64, charging bool) []sched.Sample {
		var ss []sched.Sample
		for i := 5; i >= 0; i-- {
			ss = append(ss, sched.Sample{At: now.Add(-time.Duration(i) * 3 * time.Second), Online: online, Battery: battery, Charging: charging})
		}
		return ss
	}
	steady := sched.History{Attempts: 20}
	worker := func(id string, idle int, samples []sched.Sample, rep sched.Reputation) planWorker {
		return planWorker{w: sched.Worker{ID: id, Slots: idle, Samples: samples, History: steady, Link: -1}, rep: rep, idle: idle}
	}
	trusted := sched.Reputation{Valid: 50, Recent: []bool{true, true, true, true, true, true, true, true, true, true}}
	task := func(id int64, pending, replicas int, exclude ...string) store.Candidate {
		return store.Candidate{TaskID: id, Module: "m", Name: "t", Priority: "batch", ReadySince: now.Add(-time.Second),
			Pending: pending, Replicas: replicas, Fresh: len(exclude) == 0, Exclude: exclude}
	}
	tests := []struct {
		name    string
		cands   []store.Candidate
		workers []planWorker
		stats   map[string]time.Duration // task name -> known average
		ckpt    time.Duration
		want    []store.Pick
	}{
		{name: "replicas go to distinct workers",
			cands:   []store.Candidate{task(1, 2, 2)},
			workers: []planWorker{worker("a", 2, hb(true, -1, false), sched.Reputation{}), worker("b", 2, hb(true, -1, false), sched.Reputation{})},
			want:    []store.Pick{{TaskID: 1, Worker: "a"}, {TaskID: 1, Worker: "b"}}},
		{name: "a worker that ran a replica gets no other",
			cands:   []store.Candidate{task(1, 1, 2, "a")},
			workers: []planWorker{worker("a", 2, hb(true, -1, false), sched.Reputation{})},
			want:    nil},
		{name: "work spreads over workers",
			cands:   []store.Candidate{task(1, 1, 1), task(2, 1, 1), task(3, 1, 1)},
			workers: []planWorker{worker("a", 2, hb(true, -1, false), sched.Reputation{}), worker("b", 2, hb(true, -1, false), sched.Reputation{})},
			// Run times are unknown: the order of the tasks is random (TaskID 0: any).
			want: []store.Pick{{Worker: "a"}, {Worker: "b"}, {Worker: "a"}}},
		{name: "a trusted worker runs a fresh replicated task alone",
			cands:   []store.Candidate{task(1, 2, 2)},
			workers: []planWorker{worker("a", 1, hb(true, -1, false), trusted), worker("b", 1, hb(true, -1, false), sched.Reputation{})},
			want:    []store.Pick{{TaskID: 1, Worker: "a", Solo: true}}},
		{name: "an unstable trusted worker takes a long replicated task only as a replica, not alone",
			cands:   []store.Candidate{{TaskID: 1, Module: "m", Name: "long", Priority: "batch", Pending: 2, Replicas: 2, Fresh: true}},
			workers: []planWorker{worker("a", 1, hb(true, 0.5, false)[5:], trusted)},
			stats:   map[string]time.Duration{"long": time.Hour},
			want:    []store.Pick{{TaskID: 1, Worker: "a"}}},
		{name: "a task with a setup goes only to a worker that lays setups out",
			cands: []store.Candidate{{TaskID: 1, Module: "m", Name: "t", Priority: "batch", Pending: 1, Replicas: 1, Setup: true}},
			workers: []planWorker{worker("a", 1, hb(true, -1, false), sched.Reputation{}),
				func() planWorker {
					w := worker("b", 1, hb(true, -1, false), sched.Reputation{})
					w.setup = true
					return w
				}()},
			want: []store.Pick{{TaskID: 1, Worker: "b"}}},
		{name: "a task with a setup waits while no worker lays setups out",
			cands:   []store.Candidate{{TaskID: 1, Module: "m", Name: "t", Priority: "batch", Pending: 1, Replicas: 1, Setup: true}},
			workers: []planWorker{worker("a", 2, hb(true, -1, false), sched.Reputation{})},
			want:    nil},
		{name: "a task goes to the worker that keeps its data",
			cands: []store.Candidate{{TaskID: 1, Module: "m", Name: "t", Priority: "batch", ReadySince: now.Add(-time.Second), Pending: 1, Replicas: 1, Setup: true, Blobs: []string{"B"}},
				{TaskID: 2, Module: "m", Name: "t", Priority: "batch", ReadySince: now.Add(-time.Second), Pending: 1, Replicas: 1, Setup: true, Blobs: []string{"A"}}},
			workers: []planWorker{
				func() planWorker {
					w := worker("a", 1, hb(true, -1, false), sched.Reputation{})
					w.setup, w.w.Holds = true, map[string]bool{"A": true}
					return w
				}(),
				func() planWorker {
					w := worker("b", 1, hb(true, -1, false), sched.Reputation{})
					w.setup, w.w.Holds = true, map[string]bool{"B": true}
					return w
				}()},
			want: []store.Pick{{TaskID: 2, Worker: "a"}, {TaskID: 1, Worker: "b"}}},
		{name: "too unstable worker gets nothing",
			cands:   []store.Candidate{task(1, 1, 1)},
			workers: []planWorker{worker("a", 1, hb(false, -1, false), sched.Reputation{})},
			want:    nil},
		{name: "unstable worker takes only short tasks",
			cands:   []store.Candidate{{TaskID: 1, Module: "m", Name: "long", Priority: "batch", Pending: 1, Replicas: 1}, {TaskID: 2, Module: "m", Name: "short", Priority: "batch", Pending: 1, Replicas: 1}},
			workers: []planWorker{worker("a", 2, hb(true, 0.5, false)[5:], sched.Reputation{})},
			stats:   map[string]time.Duration{"long": time.Hour, "short": 10 * time.Second},
			want:    []store.Pick{{TaskID: 2, Worker: "a"}}},
		{name: "longest first, checkpoint interval from the optimum",
			cands:   []store.Candidate{{TaskID: 1, Module: "m", Name: "short", Priority: "batch", Pending: 1, Replicas: 1}, {TaskID: 2, Module: "m", Name: "long", Priority: "batch", Pending: 1, Replicas: 1}},
			workers: []planWorker{worker("a", 1, hb(true, -1, false), sched.Reputation{})},
			stats:   map[string]time.Duration{"long": 2 * time.Hour, "short": 10 * time.Second},
			ckpt:    2 * time.Second,
			want:    []store.Pick{{TaskID: 2, Worker: "a", CkptMS: -1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &dispatcher{rt: newRuntimes(), cfg: Config{Heartbeat: 3 * time.Second, Verify: sched.DefaultVerify()}}
			for name, d := range tc.stats {
				s.rt.stats.Set("m", name, 5, d)
			}
			if tc.ckpt > 0 {
				s.rt.ckpt["m"] = tc.ckpt
			}
			got := s.plan(now, tc.cands, tc.workers, nil)
			if len(got) != len(tc.want) {
				t.Fatalf("picks = %+v, want %+v", got, tc.want)
			}
			seen := map[int64]int{}
			for i := range got {
				w := tc.want[i]
				seen[got[i].TaskID]++
				if w.TaskID == 0 {
					w.TaskID = got[i].TaskID
				}
				if w.CkptMS == -1 {
					if got[i].CkptMS <= 0 {
						t.Errorf("pick %d has no checkpoint interval: %+v", i, got[i])
					}
					w.CkptMS = got[i].CkptMS
				}
				if got[i] != w {
					t.Errorf("pick %d = %+v, want %+v", i, got[i], w)
				}
			}
			for id, n := range seen {
				if n > 1 && tc.cands[0].Replicas == 1 {
					t.Errorf("task %d picked %d times", id, n)
				}
			}
		})
	}
}

func TestDeviceSamples(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := 0.4
	tests := []struct {
		dev  *protocol.Device
		want sched.Sample
	}{
		{nil, sched.Sample{At: at, Battery: -1, Online: true}},
		{&protocol.Device{Battery: &b, Charging: "no", Online: "no", Connection: "cellular", Visibility: "hidden"},
			sched.Sample{At: at, Battery: 0.4, Online: false, Connection: "cellular", Hidden: true}},
		{&protocol.Device{Charging: "yes", Online: "unknown"}, sched.Sample{At: at, Battery: -1, Charging: true, Online: true}},
	}
	for _, tc := range tests {
		if got := deviceSample(at, tc.dev); got != tc.want {
			t.Errorf("deviceSample(%+v) = %+v, want %+v", tc.dev, got, tc.want)
		}
	}
	c := &conn{}
	c.addSample(sched.Sample{At: at}, time.Second)
	c.addSample(sched.Sample{At: at.Add(100 * time.Millisecond), Battery: 0.5}, time.Second) // an early heartbeat replaces
	c.addSample(sched.Sample{At: at.Add(time.Second)}, time.Second)
	if len(c.samples) != 2 || c.samples[0].Battery != 0.5 || !c.samples[0].At.Equal(at) {
		t.Errorf("samples = %+v", c.samples)
	}
	for i := range 2 * maxSamples {
		c.addSample(sched.Sample{At: at.Add(time.Duration(i+2) * time.Second)}, time.Second)
	}
	if len(c.samples) != maxSamples {
		t.Errorf("%d samples kept, want %d", len(c.samples), maxSamples)
	}
}

func TestEfficiency(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e, p := efficiency(nil)
	if e != nil || p != nil {
		t.Fatalf("efficiency of nothing = %v, %v", e, p)
	}
	spans := []store.AttemptSpan{
		{Task: "a", Worker: "w1", Start: t0, End: t0.Add(10 * time.Second), Succeeded: true},
		{Task: "b", Worker: "w1", Start: t0.Add(10 * time.Second), End: t0.Add(20 * time.Second), Succeeded: true},
		{Task: "c", Worker: "w2", Start: t0, End: t0.Add(10 * time.Second), Succeeded: false},
		{Task: "c", Worker: "w2", Start: t0.Add(10 * time.Second), End: t0.Add(20 * time.Second), Succeeded: true},
	}
	e, p = efficiency(spans)
	if e == nil || *e != 0.75 || p == nil || *p < 1 || *p > 3 {
		t.Fatalf("efficiency = %v, parallelism %v; want 0.75 and 1..3", *e, *p)
	}
}

// The candidate window widens, round after round, while a full window
// cannot fill the slots because their workers ran replicas of its tasks,
// up to maxCandidates, and narrows again once a round fills them, sees the
// whole queue, or is short for another reason.
func TestCandidateWindowWidens(t *testing.T) {
	t.Parallel()
	widen, slots := 0, 4
	var windows []int
	for range 12 { // the oldest ready tasks are all replicas these workers ran
		limit := candidateWindow(slots, widen)
		windows = append(windows, limit)
		widen = nextWiden(widen, limit, true, 0, slots, true)
	}
	want := []int{24, 48, 96, 192, 384, 768, 1536, 3072, 4096, 4096, 4096, 4096}
	if !slices.Equal(windows, want) {
		t.Errorf("windows %v, want %v", windows, want)
	}
	for _, tc := range []struct {
		name        string
		limit       int
		full        bool
		picks, want int
		excluding   bool
	}{
		{"slots filled", 4096, true, slots, 0, true},
		{"the whole queue seen", 4096, false, 1, 0, true},
		{"short for another reason", 4096, true, 1, 0, false},
		{"still short, at the maximum", 4096, true, 1, widen, true},
	} {
		if w := nextWiden(widen, tc.limit, tc.full, tc.picks, slots, tc.excluding); w != tc.want {
			t.Errorf("%s: widen %d, want %d", tc.name, w, tc.want)
		}
	}
}

// The dispatcher's cache of candidates loses the tasks a round claimed,
// keeping the others in order. It is dropped when it may hide better
// candidates (an error, idle slots), and turned off for a while when it
// proved wrong (a pick not claimed, a replicated task in it).
func TestCandidateCacheAfterAClaim(t *testing.T) {
	t.Parallel()
	task := func(id int64) store.Candidate { return store.Candidate{TaskID: id, Pending: 1, Replicas: 1} }
	replicated := store.Candidate{TaskID: 3, Pending: 2, Replicas: 2}
	excluded := store.Candidate{TaskID: 3, Pending: 1, Replicas: 1, Exclude: []string{"w"}}
	now := time.Now()
	for _, tc := range []struct {
		name         string
		tasks        []store.Candidate
		claimed      []int64
		picks, slots int
		err          error
		want         []int64 // nil: dropped
		off          bool
	}{
		{"claimed leave", []store.Candidate{task(1), task(2), task(3), task(4)}, []int64{1, 3}, 2, 2, nil, []int64{2, 4}, false},
		{"idle slots", []store.Candidate{task(1), task(2)}, []int64{1}, 1, 2, nil, nil, false},
		{"an error", []store.Candidate{task(1), task(2)}, []int64{1}, 1, 1, errors.New("broken"), nil, false},
		{"a pick not claimed", []store.Candidate{task(1), task(2), task(3)}, []int64{1}, 2, 2, nil, nil, true},
		{"a replicated task", []store.Candidate{task(1), task(2), replicated}, []int64{1}, 1, 1, nil, nil, true},
		{"an excluded worker", []store.Candidate{task(1), task(2), excluded}, []int64{1}, 1, 1, nil, nil, true},
	} {
		c := candidateCache{tasks: slices.Clone(tc.tasks), ok: true}
		var claimed []store.Claimed
		for _, id := range tc.claimed {
			claimed = append(claimed, store.Claimed{TaskID: id})
		}
		c.claimed(claimed, tc.picks, tc.slots, tc.err, now)
		var got []int64
		for _, t := range c.tasks {
			got = append(got, t.TaskID)
		}
		if c.ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%s: cache %v (kept %v), want %v", tc.name, got, c.ok, tc.want)
		}
		if off := c.offUntil.After(now); off != tc.off {
			t.Errorf("%s: turned off %v, want %v", tc.name, off, tc.off)
		}
	}
}

// checkpointCost returns the module's moving average of a checkpoint's
// cost, and whether one was measured.
func (r *runtimes) checkpointCost(module string) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.ckpt[module]
	return d, ok
}
