package inspect

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
)

func noProgress(float64) {}

// pipeline runs every stage on one synthetic capture.
func pipeline(t *testing.T, seed uint64, w, h int) (Meta, Regions, AnomalyReport) {
	t.Helper()
	raw, meta, err := Synthesize(seed, w, h, noProgress)
	if err != nil {
		t.Fatal(err)
	}
	raw2, err := DecodePGM(EncodePGM(raw))
	if err != nil || !bytes.Equal(raw2.Pix, raw.Pix) {
		t.Fatalf("PGM round trip: %v", err)
	}
	geoImg, geo, err := Georeference(raw2, meta, noProgress)
	if err != nil {
		t.Fatal(err)
	}
	seg, err := NewSegmenter(geoImg, DefaultSegmentParams)
	if err != nil {
		t.Fatal(err)
	}
	seg.SmoothRows(func(int) {})
	_, regions, err := seg.Finish()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Detect(regions, geo, DefaultAnomalyParams)
	if err != nil {
		t.Fatal(err)
	}
	return meta, regions, rep
}

func TestPipelineFindsPlantedDefects(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		meta, regions, rep := pipeline(t, seed, 320, 240)
		if len(meta.Planted) < 2 {
			t.Fatalf("seed %d: %d defects planted", seed, len(meta.Planted))
		}
		if len(rep.Anomalies) != len(meta.Planted) {
			t.Errorf("seed %d: %d anomalies for %d planted defects (%d regions)\nplanted %+v\nfound %+v",
				seed, len(rep.Anomalies), len(meta.Planted), len(regions.Regions), meta.Planted, rep.Anomalies)
			continue
		}
		for _, d := range meta.Planted {
			gx, gy := RawToGeo(meta, float64(d.X)+0.5, float64(d.Y)+0.5)
			found := false
			for _, a := range rep.Anomalies {
				if a.Kind == d.Kind && math.Hypot(a.Pixel[0]-gx, a.Pixel[1]-gy) < 2.5 {
					found = true
				}
			}
			if !found {
				t.Errorf("seed %d: planted %+v (at %.1f,%.1f after georeferencing) not flagged; found %+v", seed, d, gx, gy, rep.Anomalies)
			}
		}
		t.Logf("seed %d: heading %d, %d regions, %d anomalies", seed, meta.HeadingDeciDeg, len(regions.Regions), len(rep.Anomalies))
	}
}

func TestGeoreferencedCoordinates(t *testing.T) {
	_, _, rep := pipeline(t, 3, 200, 160)
	for _, a := range rep.Anomalies {
		if a.BBoxMap[0] > a.Easting || a.Easting > a.BBoxMap[2] || a.BBoxMap[1] > a.Northing || a.Northing > a.BBoxMap[3] {
			t.Errorf("centre (%v, %v) outside its box %v", a.Easting, a.Northing, a.BBoxMap)
		}
		if a.Easting < 480000 || a.Easting > 500000+10 || a.Northing < 4280000 || a.Northing > 4300000+10 {
			t.Errorf("implausible position %v %v", a.Easting, a.Northing)
		}
	}
}

func TestDeterministic(t *testing.T) {
	a1, b1, c1 := pipeline(t, 42, 160, 120)
	a2, b2, c2 := pipeline(t, 42, 160, 120)
	j := func(v ...any) string { b, _ := json.Marshal(v); return string(b) }
	if j(a1, b1, c1) != j(a2, b2, c2) {
		t.Fatal("two runs differ")
	}
	a3, _, _ := pipeline(t, 43, 160, 120)
	if j(a1) == j(a3) {
		t.Fatal("seeds 42 and 43 give the same capture")
	}
}

func TestSegmentCheckpoint(t *testing.T) {
	raw, meta, _ := Synthesize(7, 128, 96, noProgress)
	img, _, _ := Georeference(raw, meta, noProgress)
	full, _ := NewSegmenter(img, DefaultSegmentParams)
	full.SmoothRows(func(int) {})
	wantMask, wantRegions, _ := full.Finish()

	s, _ := NewSegmenter(img, DefaultSegmentParams)
	var saved []byte
	s.SmoothRows(func(row int) {
		if row == 40 {
			saved = s.Checkpoint()
		}
	})
	r, _ := NewSegmenter(img, DefaultSegmentParams)
	if err := r.Resume(saved); err != nil {
		t.Fatal(err)
	}
	if r.Row != 40 {
		t.Fatalf("resumed at row %d", r.Row)
	}
	r.SmoothRows(func(int) {})
	mask, regions, err := r.Finish()
	if err != nil {
		t.Fatal(err)
	}
	j := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	if !bytes.Equal(mask.Pix, wantMask.Pix) || j(regions) != j(wantRegions) {
		t.Fatal("resumed segmentation differs")
	}
	other, _ := NewSegmenter(img, SegmentParams{Threshold: 41, Window: 20})
	if err := other.Resume(saved); err == nil {
		t.Error("checkpoint with other parameters accepted")
	}
	img.Pix[0] ^= 1
	if err := r.Resume(saved); err == nil {
		t.Error("checkpoint of another image accepted")
	}
}

func TestCombine(t *testing.T) {
	var reps []AnomalyReport
	for _, seed := range []uint64{5, 2} {
		_, _, rep := pipeline(t, seed, 160, 120)
		reps = append(reps, rep)
	}
	s := Combine(reps)
	n := len(reps[0].Anomalies) + len(reps[1].Anomalies)
	if s.Reports != 2 || s.AnomaliesTotal != n || len(s.Anomalies) != n {
		t.Fatalf("summary %+v", s)
	}
	if s.Captures[0] != "capture-0002" {
		t.Errorf("captures %v", s.Captures)
	}
	for i := 1; i < len(s.Anomalies); i++ {
		if s.Anomalies[i-1].Severity == "medium" && s.Anomalies[i].Severity == "high" {
			t.Error("not ordered by severity")
		}
	}
	if s.BySeverity["high"]+s.BySeverity["medium"] != n || s.ByKind["bright"]+s.ByKind["dark"] != n {
		t.Errorf("counts %v %v", s.BySeverity, s.ByKind)
	}
}

func TestDecodePGMErrors(t *testing.T) {
	for _, b := range []string{"", "P2\n1 1\n255\n\x00", "P5\n2 2\n255\n\x00", "P5\n1 1\n65535\n\x00\x00", "P5 # c\n1 x\n255\n\x00"} {
		if _, err := DecodePGM([]byte(b)); err == nil {
			t.Errorf("%q accepted", b)
		}
	}
	g, err := DecodePGM([]byte("P5 # comment\n2 1\n255\n\x01\x02"))
	if err != nil || g.W != 2 || g.Pix[1] != 2 {
		t.Errorf("%+v %v", g, err)
	}
}
