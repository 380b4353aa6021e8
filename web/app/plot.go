package app

import (
	"fmt"
	"strings"
)

// The chart area of a plot, in SVG user units. The SVG scales to the width
// of the page (preserveAspectRatio="none"), so a phone sees the whole hour.
const (
	plotW = 600
	plotH = 120
)

// Plot is a small chart of the last hour, drawn as inline SVG on the
// volunteers page; app.js redraws it from /app/volunteers.json.
type Plot struct {
	Bars string `json:"bars"` // bar chart (tasks done per minute)
	Line string `json:"line"` // step line (connected workers)
	Area string `json:"area"` // the area under Line
	Max  int    `json:"max"`  // the value at the top of the chart
	Last int    `json:"last"` // the value of the current minute
	Sum  int    `json:"sum"`
	Peak int    `json:"peak"`
	// Caption says it in words.
	Caption string `json:"caption"`
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten (at least 1), for
// the top of a chart.
func niceMax(v int) int {
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*p >= v {
				return m * p
			}
		}
	}
}

func scan(vals []int) (sum, peak, last int) {
	for _, v := range vals {
		sum += v
		peak = max(peak, v)
	}
	if len(vals) > 0 {
		last = vals[len(vals)-1]
	}
	return sum, peak, last
}

// barsPlot draws one bar per value.
func barsPlot(vals []int) Plot {
	p := Plot{}
	p.Sum, p.Peak, p.Last = scan(vals)
	p.Max = niceMax(p.Peak)
	if len(vals) == 0 {
		return p
	}
	step := float64(plotW) / float64(len(vals))
	w := step * 0.8
	var b strings.Builder
	for i, v := range vals {
		if v <= 0 {
			continue
		}
		h := float64(v) * plotH / float64(p.Max)
		fmt.Fprintf(&b, "M%.1f,%dv%.1fh%.1fv%.1fz", float64(i)*step+(step-w)/2, plotH, -h, w, h)
	}
	p.Bars = b.String()
	return p
}

// stepPlot draws the values as a step line (each holds for its minute) and
// the area under it.
func stepPlot(vals []int) Plot {
	p := Plot{}
	p.Sum, p.Peak, p.Last = scan(vals)
	p.Max = niceMax(p.Peak)
	if len(vals) == 0 {
		return p
	}
	step := float64(plotW) / float64(len(vals))
	y := func(v int) float64 { return plotH - float64(v)*plotH/float64(p.Max) }
	var b strings.Builder
	fmt.Fprintf(&b, "M0,%.1f", y(vals[0]))
	for i, v := range vals {
		if i > 0 {
			fmt.Fprintf(&b, "V%.1f", y(v))
		}
		fmt.Fprintf(&b, "H%.1f", float64(i+1)*step)
	}
	p.Line = b.String()
	p.Area = fmt.Sprintf("%sV%dH0z", p.Line, plotH)
	return p
}
