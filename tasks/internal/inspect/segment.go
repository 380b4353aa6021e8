package inspect

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// SegmentParams tune the segmentation.
type SegmentParams struct {
	// Threshold is how far (in grey levels) a smoothed pixel must be from
	// its local background to be foreground.
	Threshold int `json:"threshold"`
	// Window is the half-size of the square window giving the local
	// background (the mean over (2*Window+1)^2 pixels).
	Window int `json:"window"`
}

// DefaultSegmentParams are used by the segment task unless told otherwise.
var DefaultSegmentParams = SegmentParams{Threshold: 40, Window: 20}

// Region is one connected component of foreground pixels.
type Region struct {
	ID   int    `json:"id"`
	Kind string `json:"kind"` // "bright" or "dark"
	Area int    `json:"area_px"`
	// BBox is [x0, y0, x1, y1), in pixels.
	BBox [4]int `json:"bbox"`
	// Centroid is in pixel coordinates (pixel centres at +0.5).
	Centroid [2]float64 `json:"centroid"`
	// MeanIntensity is the mean smoothed grey level over the region.
	MeanIntensity float64 `json:"mean_intensity"`
	// MeanContrast and PeakContrast are the mean and the extreme of the
	// difference from the local background (negative for dark regions).
	MeanContrast float64 `json:"mean_contrast"`
	PeakContrast int     `json:"peak_contrast"`
}

// Regions is what the segment stage writes to regions.json.
type Regions struct {
	Width   int           `json:"width"`
	Height  int           `json:"height"`
	Params  SegmentParams `json:"params"`
	Regions []Region      `json:"regions"`
}

// Mask values.
const (
	MaskBright = 255
	MaskDark   = 128
)

// Segmenter segments an image in three phases: a 3x3 median filter (row by
// row, the part worth checkpointing), a local-background threshold and
// connected components (8-connected, in scan order).
type Segmenter struct {
	P      SegmentParams
	Img    *Gray
	Smooth *Gray
	Row    int // rows of Smooth done
}

// NewSegmenter prepares to segment img.
func NewSegmenter(img *Gray, p SegmentParams) (*Segmenter, error) {
	if p.Threshold <= 0 || p.Threshold > 255 || p.Window < 1 || p.Window > 1000 {
		return nil, fmt.Errorf("bad segmentation parameters %+v", p)
	}
	return &Segmenter{P: p, Img: img, Smooth: NewGray(img.W, img.H)}, nil
}

const segMagic = "cpSEG1"

// Checkpoint is the state after the rows done so far: parameters, image
// size, a checksum of the input, the row and the smoothed rows.
func (s *Segmenter) Checkpoint() []byte {
	b := []byte(segMagic)
	for _, v := range []uint32{uint32(s.P.Threshold), uint32(s.P.Window), uint32(s.Img.W), uint32(s.Img.H), checksum(s.Img.Pix), uint32(s.Row)} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return append(b, s.Smooth.Pix[:s.Row*s.Img.W]...)
}

// Resume continues from a checkpoint made by Checkpoint for the same image
// and parameters.
func (s *Segmenter) Resume(b []byte) error {
	if !bytes.HasPrefix(b, []byte(segMagic)) || len(b) < len(segMagic)+24 {
		return errors.New("not a segmentation checkpoint")
	}
	b = b[len(segMagic):]
	var h [6]uint32
	for i := range h {
		h[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	b = b[24:]
	if h[0] != uint32(s.P.Threshold) || h[1] != uint32(s.P.Window) || h[2] != uint32(s.Img.W) || h[3] != uint32(s.Img.H) || h[4] != checksum(s.Img.Pix) {
		return errors.New("checkpoint is for another image or other parameters")
	}
	row := int(h[5])
	if row > s.Img.H || len(b) != row*s.Img.W {
		return errors.New("checkpoint is inconsistent")
	}
	copy(s.Smooth.Pix, b)
	s.Row = row
	return nil
}

// checksum is FNV-1a over the pixels.
func checksum(p []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range p {
		h ^= uint32(c)
		h *= 16777619
	}
	return h
}

// SmoothRows runs the median filter over the remaining rows. after is
// called after every row; it may checkpoint.
func (s *Segmenter) SmoothRows(after func(row int)) {
	g := s.Img
	var win [9]byte
	for s.Row < g.H {
		y := s.Row
		for x := 0; x < g.W; x++ {
			k := 0
			for dy := -1; dy <= 1; dy++ {
				for dx := -1; dx <= 1; dx++ {
					win[k] = g.At(x+dx, y+dy)
					k++
				}
			}
			// Insertion sort of nine values.
			for i := 1; i < 9; i++ {
				for j := i; j > 0 && win[j-1] > win[j]; j-- {
					win[j-1], win[j] = win[j], win[j-1]
				}
			}
			s.Smooth.Pix[y*g.W+x] = win[4]
		}
		s.Row++
		after(s.Row)
	}
}

// Finish thresholds the smoothed image against its local background and
// labels the connected components. It needs all rows smoothed.
func (s *Segmenter) Finish() (*Gray, Regions, error) {
	g := s.Smooth
	w, h := g.W, g.H
	if s.Row != h {
		return nil, Regions{}, errors.New("smoothing not finished")
	}
	// Integral image for box means.
	ii := make([]int64, (w+1)*(h+1))
	for y := 0; y < h; y++ {
		var rowSum int64
		for x := 0; x < w; x++ {
			rowSum += int64(g.Pix[y*w+x])
			ii[(y+1)*(w+1)+x+1] = ii[y*(w+1)+x+1] + rowSum
		}
	}
	dev := make([]int, w*h)
	mask := NewGray(w, h)
	r := s.P.Window
	for y := 0; y < h; y++ {
		y0, y1 := max(y-r, 0), min(y+r+1, h)
		for x := 0; x < w; x++ {
			x0, x1 := max(x-r, 0), min(x+r+1, w)
			sum := ii[y1*(w+1)+x1] - ii[y0*(w+1)+x1] - ii[y1*(w+1)+x0] + ii[y0*(w+1)+x0]
			n := int64((y1 - y0) * (x1 - x0))
			d := int((int64(g.Pix[y*w+x])*n - sum) / n)
			dev[y*w+x] = d
			switch {
			case d >= s.P.Threshold:
				mask.Pix[y*w+x] = MaskBright
			case d <= -s.P.Threshold:
				mask.Pix[y*w+x] = MaskDark
			}
		}
	}
	// Connected components, 8-connected, same mask value.
	seen := make([]bool, w*h)
	var regions []Region
	var queue []int
	for start := range mask.Pix {
		v := mask.Pix[start]
		if v == 0 || seen[start] {
			continue
		}
		reg := Region{ID: len(regions) + 1, Kind: "bright", BBox: [4]int{w, h, 0, 0}}
		if v == MaskDark {
			reg.Kind = "dark"
		}
		var sumX, sumY, sumI, sumD int64
		queue = append(queue[:0], start)
		seen[start] = true
		for len(queue) > 0 {
			p := queue[len(queue)-1]
			queue = queue[:len(queue)-1]
			x, y := p%w, p/w
			reg.Area++
			sumX += int64(x)
			sumY += int64(y)
			sumI += int64(g.Pix[p])
			sumD += int64(dev[p])
			if v == MaskBright && dev[p] > reg.PeakContrast || v == MaskDark && dev[p] < reg.PeakContrast {
				reg.PeakContrast = dev[p]
			}
			reg.BBox = [4]int{min(reg.BBox[0], x), min(reg.BBox[1], y), max(reg.BBox[2], x+1), max(reg.BBox[3], y+1)}
			for dy := -1; dy <= 1; dy++ {
				for dx := -1; dx <= 1; dx++ {
					nx, ny := x+dx, y+dy
					if nx < 0 || ny < 0 || nx >= w || ny >= h {
						continue
					}
					q := ny*w + nx
					if !seen[q] && mask.Pix[q] == v {
						seen[q] = true
						queue = append(queue, q)
					}
				}
			}
		}
		a := float64(reg.Area)
		reg.Centroid = [2]float64{round3(float64(sumX)/a + 0.5), round3(float64(sumY)/a + 0.5)}
		reg.MeanIntensity = round3(float64(sumI) / a)
		reg.MeanContrast = round3(float64(sumD) / a)
		regions = append(regions, reg)
	}
	if regions == nil {
		regions = []Region{}
	}
	return mask, Regions{Width: w, Height: h, Params: s.P, Regions: regions}, nil
}
