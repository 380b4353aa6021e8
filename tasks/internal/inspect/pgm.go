// Package inspect holds the computational cores of the inspection example
// pipeline (tasks/inspect-*), modelled on the aerial power-line inspection
// workflow of the seed paper: import a capture, georeference it, segment it,
// flag anomalies, report. Every stage is deterministic: integer or
// explicitly rounded arithmetic, no clocks, no maps iterated into output.
package inspect

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Gray is an 8-bit grayscale image, row-major.
type Gray struct {
	W, H int
	Pix  []byte
}

// NewGray returns a black w x h image.
func NewGray(w, h int) *Gray { return &Gray{W: w, H: h, Pix: make([]byte, w*h)} }

// At returns the pixel at (x, y), with coordinates clamped to the image.
func (g *Gray) At(x, y int) byte {
	x = min(max(x, 0), g.W-1)
	y = min(max(y, 0), g.H-1)
	return g.Pix[y*g.W+x]
}

// MaxPixels bounds the images the stages accept.
const MaxPixels = 1 << 24

// EncodePGM encodes g as a binary (P5) PGM file.
func EncodePGM(g *Gray) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "P5\n%d %d\n255\n", g.W, g.H)
	b.Write(g.Pix)
	return b.Bytes()
}

// DecodePGM decodes a binary (P5) PGM file with a maximum value of 255.
func DecodePGM(data []byte) (*Gray, error) {
	if !bytes.HasPrefix(data, []byte("P5")) {
		return nil, errors.New("pgm: not a binary PGM (P5) file")
	}
	pos := 2
	var fields [3]int
	for i := range fields {
		// Skip whitespace and comments.
		for pos < len(data) {
			c := data[pos]
			if c == '#' {
				for pos < len(data) && data[pos] != '\n' {
					pos++
				}
				continue
			}
			if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				break
			}
			pos++
		}
		start := pos
		for pos < len(data) && data[pos] >= '0' && data[pos] <= '9' {
			pos++
		}
		v, err := strconv.Atoi(string(data[start:pos]))
		if err != nil {
			return nil, errors.New("pgm: bad header")
		}
		fields[i] = v
	}
	if pos >= len(data) {
		return nil, errors.New("pgm: truncated header")
	}
	pos++ // the single whitespace byte before the raster
	w, h, maxv := fields[0], fields[1], fields[2]
	if w <= 0 || h <= 0 || w*h > MaxPixels {
		return nil, fmt.Errorf("pgm: bad size %dx%d", w, h)
	}
	if maxv != 255 {
		return nil, fmt.Errorf("pgm: maximum value %d, want 255", maxv)
	}
	if len(data)-pos != w*h {
		return nil, fmt.Errorf("pgm: raster has %d bytes, want %d", len(data)-pos, w*h)
	}
	g := NewGray(w, h)
	copy(g.Pix, data[pos:])
	return g, nil
}

// round3 rounds to three decimals, so that JSON output stays short. The
// conversion keeps the multiplication from being fused with anything.
func round3(v float64) float64 {
	return math.Round(float64(v*1000)) / 1000
}
