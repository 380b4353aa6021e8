package inspect

import "fmt"

// rng is splitmix64: tiny, fast and the same everywhere.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// between returns a number in [lo, hi].
func (r *rng) between(lo, hi int) int { return lo + r.intn(hi-lo+1) }

// Defect is a planted defect, in raw image pixel coordinates.
type Defect struct {
	Kind   string `json:"kind"` // "bright" or "dark"
	X      int    `json:"x"`
	Y      int    `json:"y"`
	Radius int    `json:"radius"`
	Delta  int    `json:"delta"` // intensity change at the centre
}

// Meta is the capture metadata written by the import stage.
type Meta struct {
	CaptureID string `json:"capture_id"`
	Seed      uint64 `json:"seed"`
	Width     int    `json:"width"`
	Height    int    `json:"height"`
	Sensor    string `json:"sensor"`
	Time      string `json:"time"`
	// CRS is the projected reference system of the centre position.
	CRS string `json:"crs"`
	// CentreEasting and CentreNorthing are the ground position (metres)
	// under the image centre.
	CentreEasting  float64 `json:"centre_easting"`
	CentreNorthing float64 `json:"centre_northing"`
	AltitudeM      float64 `json:"altitude_m"`
	// GSD is the ground sampling distance in metres per pixel.
	GSD float64 `json:"gsd_m"`
	// HeadingDeciDeg is the camera heading in tenths of a degree clockwise
	// from north: the raw image is rotated by it.
	HeadingDeciDeg int `json:"heading_decideg"`
	// Planted is the ground truth: the defects put into the image.
	Planted []Defect `json:"planted"`
}

// Synthesize makes a deterministic aerial capture of a power-line corridor:
// smooth terrain, pixel noise, the line itself (a faint dark band), small
// specks of clutter and two to four defects (bright hot spots, dark
// encroachments). The scene is drawn in the camera's frame, which is turned
// by the capture heading; georeferencing turns it north-up.
func Synthesize(seed uint64, w, h int, progress func(float64)) (*Gray, Meta, error) {
	if w < 64 || h < 64 || w*h > MaxPixels {
		return nil, Meta{}, fmt.Errorf("bad size %dx%d (at least 64x64)", w, h)
	}
	r := &rng{s: seed}
	m := Meta{
		CaptureID:      fmt.Sprintf("capture-%04d", seed%10000),
		Seed:           seed,
		Width:          w,
		Height:         h,
		Sensor:         "synthetic-rgb-gray-8",
		Time:           fmt.Sprintf("2014-06-%02dT%02d:%02d:%02dZ", 1+r.intn(28), 8+r.intn(10), r.intn(60), r.intn(60)),
		CRS:            "EPSG:32629",
		CentreEasting:  float64(480000 + r.intn(20000)),
		CentreNorthing: float64(4280000 + r.intn(20000)),
		AltitudeM:      float64(r.between(80, 140)),
		GSD:            0.05,
		HeadingDeciDeg: r.between(-40, 40),
	}

	// Terrain: value noise on a coarse grid, bilinear in fixed point.
	const cell = 48
	gw, gh := w/cell+2, h/cell+2
	grid := make([]int, gw*gh)
	for i := range grid {
		grid[i] = r.between(100, 140)
	}
	img := NewGray(w, h)
	val := make([]int, w*h)
	for y := 0; y < h; y++ {
		gy, fy := y/cell, y%cell
		for x := 0; x < w; x++ {
			gx, fx := x/cell, x%cell
			a := grid[gy*gw+gx]*(cell-fx) + grid[gy*gw+gx+1]*fx
			b := grid[(gy+1)*gw+gx]*(cell-fx) + grid[(gy+1)*gw+gx+1]*fx
			val[y*w+x] = (a*(cell-fy) + b*fy) / (cell * cell)
		}
		if y%64 == 0 {
			progress(0.5 * float64(y) / float64(h))
		}
	}

	// The power line: a faint dark band from the left edge to the right.
	ya, yb := r.between(h/4, 3*h/4), r.between(h/4, 3*h/4)
	for x := 0; x < w; x++ {
		yc := ya + (yb-ya)*x/(w-1)
		for y := yc - 1; y <= yc+1; y++ {
			if y >= 0 && y < h {
				val[y*w+x] -= 22
			}
		}
	}

	// Clutter: 3x3 specks, too small to matter.
	for i, n := 0, 3+r.intn(4); i < n; i++ {
		cx, cy, d := r.between(2, w-3), r.between(2, h-3), r.between(50, 70)
		if r.intn(2) == 0 {
			d = -d
		}
		for y := cy - 1; y <= cy+1; y++ {
			for x := cx - 1; x <= cx+1; x++ {
				val[y*w+x] += d
			}
		}
	}

	// Defects: discs with a flat core and a soft rim, kept apart.
	n := 2 + r.intn(3)
	const margin = 24
	for tries := 0; len(m.Planted) < n && tries < 1000; tries++ {
		d := Defect{X: r.between(margin, w-1-margin), Y: r.between(margin, h-1-margin), Radius: r.between(5, 10)}
		if r.intn(2) == 0 {
			d.Kind, d.Delta = "bright", r.between(90, 120)
		} else {
			d.Kind, d.Delta = "dark", -r.between(75, 95)
		}
		ok := true
		for _, o := range m.Planted {
			dx, dy := d.X-o.X, d.Y-o.Y
			if dx*dx+dy*dy < 64*64 {
				ok = false
			}
		}
		if !ok {
			continue
		}
		m.Planted = append(m.Planted, d)
		rr := d.Radius * d.Radius
		for y := d.Y - d.Radius; y <= d.Y+d.Radius; y++ {
			for x := d.X - d.Radius; x <= d.X+d.Radius; x++ {
				q := (x-d.X)*(x-d.X) + (y-d.Y)*(y-d.Y)
				if q > rr {
					continue
				}
				// Full strength inside 70% of the radius, fading to half at the rim.
				f := 1024
				if q*100 > rr*49 {
					f = 1024 - 512*(q*100-rr*49)/(rr*51)
				}
				val[y*w+x] += d.Delta * f / 1024
			}
		}
	}

	// Pixel noise and quantisation.
	for i, v := range val {
		v += r.between(-10, 10)
		img.Pix[i] = byte(min(max(v, 0), 255))
		if i%(w*64) == 0 {
			progress(0.5 + 0.5*float64(i)/float64(len(val)))
		}
	}
	progress(1)
	return img, m, nil
}
