package sim

import (
	"bytes"
	"strings"
	"testing"
)

func run(t *testing.T, name string, seed uint64) Result {
	t.Helper()
	s, ok := Lookup(name)
	if !ok {
		t.Fatalf("no scenario %s", name)
	}
	return s.Run(seed)
}

// value returns column col of the row with this table, case and x.
func value(t *testing.T, r Result, table, cas, x string, col int) float64 {
	t.Helper()
	for _, row := range r.Rows {
		if row.Table == table && row.Case == cas && row.X == x {
			return *row.Values[col]
		}
	}
	t.Fatalf("%s: no row %q %q %q", r.Scenario, table, cas, x)
	return 0
}

func TestDeterministic(t *testing.T) {
	for _, s := range Scenarios() {
		var a, b, c bytes.Buffer
		r := s.Run(3)
		if err := WriteJSON(&a, r); err != nil {
			t.Fatal(err)
		}
		WriteJSON(&b, s.Run(3))
		if a.String() != b.String() {
			t.Errorf("%s: same seed, different output", s.Name)
		}
		if err := WriteTable(&c, r); err != nil || !strings.Contains(c.String(), r.Title) {
			t.Errorf("%s: table: %v", s.Name, err)
		}
		var svg bytes.Buffer
		if err := SVG(&svg, r.Plot); err != nil || !strings.Contains(svg.String(), "<polyline") {
			t.Errorf("%s: svg: %v", s.Name, err)
		}
	}
}

func TestSilvaMakespan(t *testing.T) {
	r := run(t, "silva-makespan", 1)
	for _, w := range []string{"5 workflows", "10 workflows", "15 workflows"} {
		prev := 1e9
		for _, n := range []string{"1 nodes", "3 nodes", "5 nodes", "9 nodes"} {
			for col := 0; col < 2; col++ {
				m := value(t, r, "5.3 makespan", w, n, col)
				if m < 8-1e-9 { // a workflow is a chain of four 2-minute tasks
					t.Errorf("%s %s: makespan %.2f below 8 min", w, n, m)
				}
			}
			m := value(t, r, "5.3 makespan", w, n, 0)
			if m >= prev {
				t.Errorf("%s: makespan does not fall with nodes (%s: %.2f >= %.2f)", w, n, m, prev)
			}
			prev = m
			paper := value(t, r, "5.3 makespan", w, n, 2)
			if m < paper*0.6 || m > paper*1.4 {
				t.Errorf("%s %s: makespan %.2f far from the paper's %.2f", w, n, m, paper)
			}
		}
	}
}

func TestSilvaFailures(t *testing.T) {
	r := run(t, "silva-failures", 1)
	prev := 0.0
	for _, f := range []string{"0 of 9 failed", "2 of 9 failed", "5 of 9 failed", "8 of 9 failed"} {
		m := value(t, r, "5.5 makespan", "10 workflows", f, 0)
		if m <= prev {
			t.Errorf("makespan does not grow with failures (%s: %.2f)", f, m)
		}
		prev = m
	}
}

func TestHummelFairness(t *testing.T) {
	r := run(t, "hummel-fairness", 1)
	none := value(t, r, "Table 1", "no error", "none", 0)
	if none < 80 { // two workers do all the work: 85.26
		t.Errorf("no fairness variance %.2f", none)
	}
	for _, s := range []string{"not-best", "worse-than-average", "worse-than-majority", "equal-or-worse-than-majority"} {
		if v := value(t, r, "Table 1", "no error", s, 0); v > none/4 {
			t.Errorf("%s: variance %.2f not well below no fairness %.2f", s, v, none)
		}
		if v := value(t, r, "Table 1", "no error", s, 2); v > 1 {
			t.Errorf("%s most able: variance %.2f", s, v)
		}
	}
	if nb := value(t, r, "Table 1", "no error", "not-best", 0); nb > 1 {
		t.Errorf("not best variance %.2f", nb)
	}
	for _, c := range []string{"no error", "reactive FT"} {
		for _, row := range r.Rows {
			if row.Case == c && *row.Values[3] != 60 {
				t.Errorf("%s %s: %v jobs finished", c, row.X, *row.Values[3])
			}
		}
	}
}

func TestWorkrs(t *testing.T) {
	r := run(t, "workrs-checkpoints", 1)
	none := value(t, r, "Fig. 11 (mu=0.003)", "0 checkpoints", "every 300.0 s", 0)
	five := value(t, r, "Fig. 11 (mu=0.003)", "5 checkpoints", "every 50.0 s", 0)
	fifteen := value(t, r, "Fig. 11 (mu=0.003)", "15 checkpoints", "every 18.8 s", 0)
	opt := value(t, r, "Fig. 11 (mu=0.003)", "optimum: 4 checkpoints", "every 60.0 s", 0)
	if !(five < none && five < fifteen && opt < none && opt < fifteen) {
		t.Errorf("checkpoints: none %.1f five %.1f fifteen %.1f optimum %.1f", none, five, fifteen, opt)
	}
	for _, row := range r.Rows {
		if d := *row.Values[0] - *row.Values[1]; d > 0.03**row.Values[1] || -d > 0.03**row.Values[1] {
			t.Errorf("%s: simulated %.1f vs Eq. 1 %.1f", row.Case, *row.Values[0], *row.Values[1])
		}
	}
}

func TestDoAll(t *testing.T) {
	r := run(t, "doall-crashes", 1)
	for _, row := range r.Rows {
		w := *row.Values[0]
		if w < 1-1e-9 {
			t.Errorf("%s %s: work/m %.3f below 1", row.Case, row.X, w)
		}
		if w > 1.1 {
			t.Errorf("%s %s: work/m %.3f not close to 1", row.Case, row.X, w)
		}
	}
	if w := value(t, r, "work/m", "m=1000 p=100", "f=0", 0); w != 1 {
		t.Errorf("no crash: work/m %v", w)
	}
}
