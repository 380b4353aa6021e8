// Command inspect-georef is the second stage of the inspection example: it
// georeferences a raw capture, turning it north-up (a small affine
// correction by the capture heading, bilinear resampling) and placing it on
// the map.
//
//	inspect-georef
//
// Inputs: raw.pgm and meta.json (from inspect-import). Outputs: geo.pgm and
// geo.json (map origin, pixel size, GDAL-style geotransform).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/cyclepool/cyclepool/tasks/internal/inspect"
	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	if len(os.Args) != 1 {
		taskio.Fatal("usage: inspect-georef (inputs raw.pgm and meta.json)")
	}
	rawB, err := taskio.ReadInput("raw.pgm")
	if err != nil {
		taskio.Fatal("inspect-georef: %v", err)
	}
	metaB, err := taskio.ReadInput("meta.json")
	if err != nil {
		taskio.Fatal("inspect-georef: %v", err)
	}
	raw, err := inspect.DecodePGM(rawB)
	if err != nil {
		taskio.Fatal("inspect-georef: raw.pgm: %v", err)
	}
	var meta inspect.Meta
	if err := json.Unmarshal(metaB, &meta); err != nil {
		taskio.Fatal("inspect-georef: meta.json: %v", err)
	}
	sdk.Progress(0.05)
	img, geo, err := inspect.Georeference(raw, meta, func(f float64) { sdk.Progress(0.05 + 0.85*f) })
	if err != nil {
		taskio.Fatal("inspect-georef: %v", err)
	}
	gj, _ := json.MarshalIndent(geo, "", "  ")
	if err := errors.Join(
		taskio.WriteOutput("geo.pgm", inspect.EncodePGM(img)),
		taskio.WriteOutput("geo.json", append(gj, '\n')),
	); err != nil {
		taskio.Fatal("inspect-georef: %v", err)
	}
	sdk.Progress(1)
	fmt.Fprintf(os.Stderr, "inspect-georef: %s rotated by %.1f degrees, origin E %.3f N %.3f\n",
		geo.CaptureID, float64(geo.RotationDeciDeg)/10, geo.OriginEasting, geo.OriginNorthing)
}
