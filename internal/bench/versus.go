package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Versus runs the parts cfg selects repeat times for each of two builds of
// cyclepool, cfg.Executable (a) and other (b), alternately (a, b, b, a...),
// so that both meet the same spells of a shared machine, and prints every
// run's figures prefixed with their build ("a dispatch_tasks_per_s: ...")
// as they come, then each numeric figure's median per build and their
// ratio (docs/BENCHMARKS.md, "Comparing two builds"). A part that fails in
// one run prints its error line and the runs go on.
func Versus(ctx context.Context, cfg Config, other string, repeat int) error {
	out := cfg.Out
	builds := []struct{ label, exe string }{{"a", cfg.Executable}, {"b", other}}
	fmt.Fprintf(out, "versus: a is %s, b is %s, %d runs each, alternately\n", cfg.Executable, other, repeat)
	figures := map[string]*versusFigure{}
	var names []string // figure names in the order first printed
	for i := range repeat {
		// a, b, then b, a: whatever runs second in a pair (a warmer
		// cache, a machine that gets busier) falls on each build alike.
		pair := []int{0, 1}
		if i%2 == 1 {
			pair = []int{1, 0}
		}
		for _, j := range pair {
			b := builds[j]
			if err := ctx.Err(); err != nil {
				return err
			}
			var buf bytes.Buffer
			run := cfg
			run.Executable, run.Out = b.exe, io.MultiWriter(&buf, &prefixWriter{w: out, prefix: b.label + " "})
			err := Run(ctx, run)
			for name, v := range parseFigures(buf.Bytes()) {
				f := figures[name]
				if f == nil {
					f = &versusFigure{}
					figures[name] = f
					names = append(names, name)
				}
				f.values[j] = append(f.values[j], v)
			}
			if err != nil {
				fmt.Fprintf(out, "%s run %d: error: %v\n", b.label, i+1, err)
			}
		}
	}
	fmt.Fprintln(out, "versus: medians (a, b, b/a)")
	slices.Sort(names) // stable output whatever order the parts printed in
	for _, name := range names {
		f := figures[name]
		a, b := median(f.values[0]), median(f.values[1])
		ratio := "-"
		if len(f.values[0]) > 0 && len(f.values[1]) > 0 && a != 0 {
			ratio = strconv.FormatFloat(b/a, 'f', 3, 64)
		}
		fmt.Fprintf(out, "%s: a %s b %s %s\n", name, formatMedian(f.values[0], a), formatMedian(f.values[1], b), ratio)
	}
	return nil
}

// versusFigure holds one figure's values from each build's runs.
type versusFigure struct {
	values [2][]float64
}

// parseFigures reads the numeric figures of a benchmark's output: lines
// "name: value" whose value starts with a number (what follows it, such as
// a unit or a note in parentheses, is ignored). Lines of lists
// (comma-separated rounds) and errors are not figures.
func parseFigures(out []byte) map[string]float64 {
	figs := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ": ")
		if !ok || strings.ContainsAny(name, " \t") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimSpace(value), " ")
		if strings.Contains(first, ",") {
			continue
		}
		v, err := strconv.ParseFloat(first, 64)
		if err != nil {
			continue
		}
		figs[name] = v
	}
	return figs
}

// median returns the median of vs (the mean of the middle two for an even
// count); 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// formatMedian prints a median, "-" when the build gave no value.
func formatMedian(vs []float64, m float64) string {
	if len(vs) == 0 {
		return "-"
	}
	return strconv.FormatFloat(m, 'g', 6, 64)
}

// prefixWriter writes each line it is given with prefix before it.
type prefixWriter struct {
	w       io.Writer
	prefix  string
	midLine bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	var buf bytes.Buffer
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if !p.midLine {
			buf.WriteString(p.prefix)
		}
		buf.Write(line)
		p.midLine = line[len(line)-1] != '\n'
	}
	if _, err := p.w.Write(buf.Bytes()); err != nil {
		return 0, err
	}
	return len(b), nil
}
