package inspect

import (
	"fmt"
	"math"
)

// Geo is the georeference of a north-up image written by the georef stage.
type Geo struct {
	CaptureID string `json:"capture_id"`
	CRS       string `json:"crs"`
	Width     int    `json:"width"`
	Height    int    `json:"height"`
	// OriginEasting and OriginNorthing are the map position (metres) of the
	// top left corner of the top left pixel.
	OriginEasting  float64 `json:"origin_easting"`
	OriginNorthing float64 `json:"origin_northing"`
	PixelSize      float64 `json:"pixel_size_m"`
	// GeoTransform is the same in GDAL order: E = gt0 + col*gt1 + row*gt2,
	// N = gt3 + col*gt4 + row*gt5, for pixel corner coordinates.
	GeoTransform [6]float64 `json:"geotransform"`
	// RotationDeciDeg is the correction applied to the raw image.
	RotationDeciDeg int    `json:"rotation_decideg"`
	Time            string `json:"time"`
}

// PixelToMap returns the map position of the point (x, y) in pixel
// coordinates (pixel centres at +0.5).
func (g Geo) PixelToMap(x, y float64) (easting, northing float64) {
	return g.OriginEasting + float64(x*g.PixelSize), g.OriginNorthing - float64(y*g.PixelSize)
}

// rotation returns the correction for a heading in fixed point, 16
// fractional bits, so that resampling is pure integer arithmetic.
func rotation(deciDeg int) (cos, sin int64) {
	a := float64(deciDeg) * (math.Pi / 1800)
	return int64(math.Round(math.Cos(a) * 65536)), int64(math.Round(math.Sin(a) * 65536))
}

// RawToGeo maps raw image pixel coordinates to georeferenced ones (the
// inverse of the resampling in Georeference), for checking results.
func RawToGeo(m Meta, x, y float64) (float64, float64) {
	c, s := rotation(m.HeadingDeciDeg)
	cf, sf := float64(c)/65536, float64(s)/65536
	cx, cy := float64(m.Width)/2, float64(m.Height)/2
	dx, dy := x-cx, y-cy
	// src = R d, so d = R^T src.
	return cx + cf*dx + sf*dy, cy - sf*dx + cf*dy
}

// Georeference turns the raw capture north-up (a rotation about its centre
// by the heading, bilinear resampling, edges clamped) and computes where
// it lies on the map.
func Georeference(raw *Gray, m Meta, progress func(float64)) (*Gray, Geo, error) {
	if raw.W != m.Width || raw.H != m.Height {
		return nil, Geo{}, fmt.Errorf("image is %dx%d but the metadata says %dx%d", raw.W, raw.H, m.Width, m.Height)
	}
	if m.GSD <= 0 {
		return nil, Geo{}, fmt.Errorf("bad ground sampling distance %v", m.GSD)
	}
	w, h := raw.W, raw.H
	c, s := rotation(m.HeadingDeciDeg)
	out := NewGray(w, h)
	for row := 0; row < h; row++ {
		// Offsets from the centre, 16 fractional bits.
		dy := int64(2*row+1-h) << 15
		for col := 0; col < w; col++ {
			dx := int64(2*col+1-w) << 15
			// Source position, in pixel-index units (pixel centres at integers).
			sx := (c*dx-s*dy)>>16 + int64(w-1)<<15
			sy := (s*dx+c*dy)>>16 + int64(h-1)<<15
			x0, y0 := int(sx>>16), int(sy>>16)
			fx, fy := sx&0xffff, sy&0xffff
			p00, p10 := int64(raw.At(x0, y0)), int64(raw.At(x0+1, y0))
			p01, p11 := int64(raw.At(x0, y0+1)), int64(raw.At(x0+1, y0+1))
			top := p00*(65536-fx) + p10*fx
			bot := p01*(65536-fx) + p11*fx
			v := (top*(65536-fy) + bot*fy + 1<<31) >> 32
			out.Pix[row*w+col] = byte(min(max(v, 0), 255))
		}
		if row%32 == 0 {
			progress(float64(row) / float64(h))
		}
	}
	ps := m.GSD
	e0 := m.CentreEasting - float64(float64(w)/2*ps)
	n0 := m.CentreNorthing + float64(float64(h)/2*ps)
	g := Geo{
		CaptureID:       m.CaptureID,
		CRS:             m.CRS,
		Width:           w,
		Height:          h,
		OriginEasting:   round3(e0),
		OriginNorthing:  round3(n0),
		PixelSize:       ps,
		RotationDeciDeg: -m.HeadingDeciDeg,
		Time:            m.Time,
	}
	g.GeoTransform = [6]float64{g.OriginEasting, ps, 0, g.OriginNorthing, 0, -ps}
	progress(1)
	return out, g, nil
}
