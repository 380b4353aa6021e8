package sim

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// WriteTable prints a result as an aligned text table, our figures beside
// the paper's, followed by its notes.
func WriteTable(w io.Writer, r Result) error {
	fmt.Fprintf(w, "%s (seed %d)\n\n", r.Title, r.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "table\tcase\t\t")
	for _, c := range r.Columns {
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw)
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t", row.Table, row.Case, row.X)
		for _, x := range row.Values {
			if x == nil {
				fmt.Fprint(tw, "-\t")
			} else {
				fmt.Fprintf(tw, "%.2f\t", *x)
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note: "+n)
	}
	return nil
}

// WriteJSON prints a result as one indented JSON object.
func WriteJSON(w io.Writer, r Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// SVG draws a result's plot as a self-contained SVG line chart: one
// polyline with markers per series, the paper's series dashed.
func SVG(w io.Writer, p Plot) error {
	const W, H, left, right, top, bottom = 760.0, 440.0, 70.0, 210.0, 40.0, 50.0
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), 0.0, math.Inf(-1)
	for _, s := range p.Series {
		for i := range s.X {
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax, ymax = 0, 1, 1
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	ystep := niceStep((ymax - ymin) / 6)
	if ystep <= 0 {
		ystep = 1
	}
	ymax = math.Ceil(ymax/ystep) * ystep
	ymin = math.Floor(ymin/ystep) * ystep
	if ymax == ymin {
		ymax = ymin + ystep
	}
	pw, ph := W-left-right, H-top-bottom
	sx := func(x float64) float64 { return left + (x-xmin)/(xmax-xmin)*pw }
	sy := func(y float64) float64 { return top + ph - (y-ymin)/(ymax-ymin)*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(p.Title))
	for y := ymin; y <= ymax+ystep/2; y += ystep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, sy(y), left+pw, sy(y))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, sy(y)+4, trimNum(y))
	}
	xstep := niceStep((xmax - xmin) / 8)
	for x := math.Ceil(xmin/xstep) * xstep; x <= xmax+xstep/1e6; x += xstep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`+"\n", sx(x), top+ph, sx(x), top+ph+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", sx(x), top+ph+18, trimNum(x))
	}
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", left+pw/2, H-10, html.EscapeString(p.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+ph/2, html.EscapeString(p.YLabel))
	for i, s := range p.Series {
		col := palette[i%len(palette)]
		if s.Dashed && i > 0 && !p.Series[i-1].Dashed {
			col = palette[(i-1)%len(palette)] // the paper's series takes the colour of ours before it
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for k := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", sx(s.X[k]), sy(s.Y[k])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", col, dash, strings.Join(pts, " "))
		for k := range s.X {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", sx(s.X[k]), sy(s.Y[k]), col)
		}
		ly := top + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", left+pw+12, ly, left+pw+36, ly, col, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", left+pw+42, ly+4, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

func trimNum(x float64) string {
	s := fmt.Sprintf("%.2f", x)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		s = "0"
	}
	return s
}
