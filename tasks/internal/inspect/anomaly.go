package inspect

import (
	"fmt"
	"math"
	"sort"
)

// AnomalyParams say which regions are anomalous: at least MinArea pixels
// and a mean contrast of at least MinContrast grey levels either way.
type AnomalyParams struct {
	MinArea     int     `json:"min_area_px"`
	MinContrast float64 `json:"min_contrast"`
}

// DefaultAnomalyParams are used by the anomaly task unless told otherwise.
var DefaultAnomalyParams = AnomalyParams{MinArea: 20, MinContrast: 45}

// Anomaly is one flagged region, placed on the map.
type Anomaly struct {
	CaptureID    string  `json:"capture_id"`
	Region       int     `json:"region"`
	Kind         string  `json:"kind"`
	Label        string  `json:"label"`
	Severity     string  `json:"severity"`
	AreaPx       int     `json:"area_px"`
	AreaM2       float64 `json:"area_m2"`
	MeanContrast float64 `json:"mean_contrast"`
	PeakContrast int     `json:"peak_contrast"`
	Easting      float64 `json:"easting"`
	Northing     float64 `json:"northing"`
	// BBoxMap is [min easting, min northing, max easting, max northing].
	BBoxMap [4]float64 `json:"bbox_map"`
	Pixel   [2]float64 `json:"pixel"`
}

// AnomalyReport is what the anomaly stage prints.
type AnomalyReport struct {
	CaptureID       string        `json:"capture_id"`
	CRS             string        `json:"crs"`
	Time            string        `json:"time"`
	PixelSize       float64       `json:"pixel_size_m"`
	RegionsExamined int           `json:"regions_examined"`
	Criteria        AnomalyParams `json:"criteria"`
	Anomalies       []Anomaly     `json:"anomalies"`
}

// Severity is "high" for strong or large anomalies, else "medium".
func severity(area int, contrast float64) string {
	if math.Abs(contrast) >= 80 || area >= 200 {
		return "high"
	}
	return "medium"
}

// Detect flags the anomalous regions and georeferences them.
func Detect(rs Regions, g Geo, p AnomalyParams) (AnomalyReport, error) {
	if rs.Width != g.Width || rs.Height != g.Height {
		return AnomalyReport{}, fmt.Errorf("regions are for a %dx%d image, the georeference for %dx%d", rs.Width, rs.Height, g.Width, g.Height)
	}
	rep := AnomalyReport{
		CaptureID: g.CaptureID, CRS: g.CRS, Time: g.Time, PixelSize: g.PixelSize,
		RegionsExamined: len(rs.Regions), Criteria: p, Anomalies: []Anomaly{},
	}
	for _, r := range rs.Regions {
		if r.Area < p.MinArea || math.Abs(r.MeanContrast) < p.MinContrast {
			continue
		}
		a := Anomaly{
			CaptureID: g.CaptureID, Region: r.ID, Kind: r.Kind, Severity: severity(r.Area, r.MeanContrast),
			AreaPx: r.Area, AreaM2: round3(float64(r.Area) * float64(g.PixelSize*g.PixelSize)),
			MeanContrast: r.MeanContrast, PeakContrast: r.PeakContrast, Pixel: r.Centroid,
		}
		if r.Kind == "bright" {
			a.Label = "possible hot spot"
		} else {
			a.Label = "possible vegetation encroachment"
		}
		e, n := g.PixelToMap(r.Centroid[0], r.Centroid[1])
		a.Easting, a.Northing = round3(e), round3(n)
		e0, n1 := g.PixelToMap(float64(r.BBox[0]), float64(r.BBox[1]))
		e1, n0 := g.PixelToMap(float64(r.BBox[2]), float64(r.BBox[3]))
		a.BBoxMap = [4]float64{round3(e0), round3(n0), round3(e1), round3(n1)}
		rep.Anomalies = append(rep.Anomalies, a)
	}
	return rep, nil
}

// Summary is what the report stage prints: every anomaly of every capture.
type Summary struct {
	Reports         int            `json:"reports"`
	Captures        []string       `json:"captures"`
	RegionsExamined int            `json:"regions_examined"`
	AnomaliesTotal  int            `json:"anomalies_total"`
	BySeverity      map[string]int `json:"by_severity"`
	ByKind          map[string]int `json:"by_kind"`
	ByCapture       map[string]int `json:"by_capture"`
	// Anomalies are ordered high severity first, then by capture and region.
	Anomalies []Anomaly `json:"anomalies"`
}

// Combine merges anomaly reports. (encoding/json writes map keys sorted, so
// the output is deterministic.)
func Combine(reports []AnomalyReport) Summary {
	s := Summary{
		Reports: len(reports), Captures: []string{}, Anomalies: []Anomaly{},
		BySeverity: map[string]int{}, ByKind: map[string]int{}, ByCapture: map[string]int{},
	}
	for _, r := range reports {
		s.Captures = append(s.Captures, r.CaptureID)
		s.RegionsExamined += r.RegionsExamined
		s.ByCapture[r.CaptureID] += len(r.Anomalies)
		for _, a := range r.Anomalies {
			s.BySeverity[a.Severity]++
			s.ByKind[a.Kind]++
			s.Anomalies = append(s.Anomalies, a)
		}
	}
	sort.Strings(s.Captures)
	rank := map[string]int{"high": 0, "medium": 1}
	sort.SliceStable(s.Anomalies, func(i, j int) bool {
		a, b := s.Anomalies[i], s.Anomalies[j]
		if rank[a.Severity] != rank[b.Severity] {
			return rank[a.Severity] < rank[b.Severity]
		}
		if a.CaptureID != b.CaptureID {
			return a.CaptureID < b.CaptureID
		}
		return a.Region < b.Region
	})
	s.AnomaliesTotal = len(s.Anomalies)
	return s
}
