package app

import (
	"strings"
	"testing"
)

func TestNiceMax(t *testing.T) {
	for _, tc := range []struct{ in, want int }{{0, 1}, {1, 1}, {2, 2}, {3, 5}, {7, 10}, {11, 20}, {49, 50}, {51, 100}, {120, 200}} {
		if got := niceMax(tc.in); got != tc.want {
			t.Errorf("niceMax(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// The plots come from the data: one bar per busy minute, a step per
// minute, the sums and peaks of the values.
func TestPlots(t *testing.T) {
	vals := []int{0, 3, 0, 1}
	b := barsPlot(vals)
	if n := strings.Count(b.Bars, "M"); n != 2 || b.Sum != 4 || b.Peak != 3 || b.Last != 1 || b.Max != 5 {
		t.Errorf("bars %+v: want 2 bars, sum 4, peak 3, last 1, max 5", b)
	}
	s := stepPlot(vals)
	if n := strings.Count(s.Line, "H"); n != len(vals) || !strings.HasPrefix(s.Area, s.Line) || s.Peak != 3 {
		t.Errorf("steps %+v: want %d steps and the area under them", s, len(vals))
	}
	if e := barsPlot(nil); e.Bars != "" || e.Max != 1 {
		t.Errorf("no data: %+v", e)
	}
}
