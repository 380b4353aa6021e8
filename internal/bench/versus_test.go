package bench

import (
	"bytes"
	"maps"
	"testing"
)

// The figures Versus compares are the numeric "name: value" lines of a
// run's output; lists of rounds, errors and other lines are not.
func TestParseFigures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, out string
		want      map[string]float64
	}{
		{"plain", "dispatch_tasks_per_s: 13584\nsingle_task_ms_p50: 2.08\n",
			map[string]float64{"dispatch_tasks_per_s": 13584, "single_task_ms_p50": 2.08}},
		{"with a note", "blob_upload_mib_per_s: 231 (1 GiB into the database, chunked)\n",
			map[string]float64{"blob_upload_mib_per_s": 231}},
		{"rounds", "dispatch_tasks_per_s_rounds: 10370,10746,12602\n", map[string]float64{}},
		{"error", "dispatch_tasks_per_s: error: the server did not start\n", map[string]float64{}},
		{"not a figure", "versus: a is x, b is y\nsome words: 12\nchurn_workflow: done\n", map[string]float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseFigures([]byte(tc.out)); !maps.Equal(got, tc.want) {
				t.Errorf("parseFigures(%q) = %v, want %v", tc.out, got, tc.want)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		vs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tc.vs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.vs, got, tc.want)
		}
	}
}

// Each line a run prints carries its build's label, however the writes cut
// the lines.
func TestPrefixWriter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	w := &prefixWriter{w: &out, prefix: "a "}
	for _, s := range []string{"x: 1\ny: ", "2\n", "z", ": 3\n\n"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if want := "a x: 1\na y: 2\na z: 3\na \n"; out.String() != want {
		t.Errorf("wrote %q, want %q", out.String(), want)
	}
}
