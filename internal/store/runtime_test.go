package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestFlushRuntimeStatsKeepsNamesThatDiffer checks that the module average
// covers every run and that only the names that differ notably from it, or
// that had an average of their own already, keep one.
func TestFlushRuntimeStatsKeepsNamesThatDiffer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	ms := time.Millisecond
	flushes := []struct {
		runs []Run
		// want: the averages read back, by name ("" for the module's).
		want map[string]RuntimeStat
	}{
		{
			// 53 ms of module average: a (5 ms), b (60 ms) and the 10 ms
			// names are within 50 ms of it, c (1 s) is not; d, of another
			// module, is alone in it.
			runs: []Run{{"m", "a", 5 * ms}, {"m", "a", 5 * ms}, {"m", "b", 60 * ms}, {"m", "c", 1000 * ms},
				{"m", "e", 10 * ms}, {"m", "f", 10 * ms}, {"m", "g", 10 * ms}, {"m", "h", 10 * ms},
				{"m", "i", 10 * ms}, {"m", "j", 10 * ms}, {"m", "k", 10 * ms}, {"m", "l", 10 * ms},
				{"m", "n", 10 * ms}, {"m", "o", 10 * ms}, {"m", "p", 10 * ms}, {"m", "q", 10 * ms},
				{"m", "r", 10 * ms}, {"m", "s", 10 * ms}, {"m", "t", 10 * ms}, {"m", "u", 10 * ms},
				{"m", "v", 10 * ms}, {"m", "w", 10 * ms}, {"m", "x", 10 * ms}, {"m", "y", 10 * ms},
				{"o", "d", 7 * ms}},
			want: map[string]RuntimeStat{
				"m/":  {Runs: 24, Mean: 1270 * ms / 24},
				"m/c": {Runs: 1, Mean: 1000 * ms},
				"o/":  {Runs: 1, Mean: 7 * ms},
			},
		},
		{
			// c's run and b's differ from the module's new average
			// (243 ms), c's by 193 ms, b's by far.
			runs: []Run{{"m", "c", 50 * ms}, {"m", "b", 5000 * ms}},
			want: map[string]RuntimeStat{
				"m/":  {Runs: 26, Mean: 6320 * ms / 26},
				"m/b": {Runs: 1, Mean: 5000 * ms},
				"m/c": {Runs: 2, Mean: 525 * ms},
				"o/":  {Runs: 1, Mean: 7 * ms},
			},
		},
		{
			// o has no name of its own: z's first run differs from o's
			// new average (36 ms) by 64 ms, but z's average (50.5 ms)
			// by less than 50 ms, so z keeps none. a, of m, differs.
			runs: []Run{{"o", "z", 100 * ms}, {"o", "z", 1 * ms}, {"m", "a", 5000 * ms}},
			want: map[string]RuntimeStat{
				"m/":  {Runs: 27, Mean: 11320 * ms / 27},
				"m/a": {Runs: 1, Mean: 5000 * ms},
				"m/b": {Runs: 1, Mean: 5000 * ms},
				"m/c": {Runs: 2, Mean: 525 * ms},
				"o/":  {Runs: 3, Mean: 36 * ms},
			},
		},
		{
			// m has three names of their own, more than the runs
			// flushed: the first two come back (a and b), and c, close
			// to m's new average (419 ms), goes to PostgreSQL as every
			// name of a module with many, which keeps its average.
			runs: []Run{{"m", "c", 420 * ms}},
			want: map[string]RuntimeStat{
				"m/":  {Runs: 28, Mean: 11740 * ms / 28},
				"m/a": {Runs: 1, Mean: 5000 * ms},
				"m/b": {Runs: 1, Mean: 5000 * ms},
				"m/c": {Runs: 3, Mean: 1470 * ms / 3},
				"o/":  {Runs: 3, Mean: 36 * ms},
			},
		},
		{
			// Fewer than the runs, all of them come back: c keeps its
			// average, e and f, close to m's, get none.
			runs: []Run{{"m", "c", 420 * ms}, {"m", "e", 420 * ms}, {"m", "f", 420 * ms}},
			want: map[string]RuntimeStat{
				"m/":  {Runs: 31, Mean: 13000 * ms / 31},
				"m/a": {Runs: 1, Mean: 5000 * ms},
				"m/b": {Runs: 1, Mean: 5000 * ms},
				"m/c": {Runs: 4, Mean: 1890 * ms / 4},
				"o/":  {Runs: 3, Mean: 36 * ms},
			},
		},
	}
	for i, fl := range flushes {
		f.s.runs.add(fl.runs)
		if _, err := f.s.FlushRuntimeStats(ctx); err != nil {
			t.Fatal(err)
		}
		stats, err := f.s.RuntimeStats(ctx, []string{"m", "o"})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]RuntimeStat{}
		for _, st := range stats {
			got[st.Module+"/"+st.Name] = RuntimeStat{Runs: st.Runs, Mean: st.Mean.Round(time.Microsecond)}
		}
		for k, w := range fl.want {
			w.Mean = w.Mean.Round(time.Microsecond)
			if got[k] != w {
				t.Errorf("flush %d: %s = %+v, want %+v", i, k, got[k], w)
			}
		}
		if len(got) != len(fl.want) {
			t.Errorf("flush %d: averages %v, want those of %v", i, got, fl.want)
		}
	}
}

// BenchmarkFlushRuntimeStats folds the runs of a 20,000-task workflow of
// uniform tasks (the dispatch benchmark's) into the averages, as the
// server does every 2 s, for a module with a few names of their own.
func BenchmarkFlushRuntimeStats(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	rs := make([]Run, 20000)
	for i := range rs {
		rs[i] = Run{Module: f.module, Name: fmt.Sprintf("t%d", i), Duration: time.Millisecond + time.Duration(i%100)*time.Microsecond}
	}
	// A few names of the module have averages of their own (as the first
	// attempts on a fresh worker, slowed by its start, leave behind).
	f.s.runs.add([]Run{{f.module, "slow-1", time.Second}, {f.module, "slow-2", time.Second}, {f.module, "t7", time.Second}})
	for range 50 {
		f.s.runs.add(rs[:10])
	}
	if _, err := f.s.FlushRuntimeStats(ctx); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		f.s.runs.add(rs)
		if _, err := f.s.FlushRuntimeStats(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
