// Command inspect-anomaly is the fourth stage of the inspection example: it
// flags the segmented regions whose area and contrast are anomalous and
// places them on the map.
//
//	inspect-anomaly [MIN_AREA_PX [MIN_CONTRAST]]
//
// Inputs: regions.json (from inspect-segment) and geo.json (from
// inspect-georef). Prints a JSON report to stdout.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"github.com/cyclepool/cyclepool/tasks/internal/inspect"
	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	p := inspect.DefaultAnomalyParams
	var err error
	if len(os.Args) > 3 {
		taskio.Fatal("usage: inspect-anomaly [MIN_AREA_PX [MIN_CONTRAST]]")
	}
	if len(os.Args) > 1 {
		if p.MinArea, err = strconv.Atoi(os.Args[1]); err != nil {
			taskio.Fatal("inspect-anomaly: bad MIN_AREA_PX: %v", err)
		}
	}
	if len(os.Args) > 2 {
		if p.MinContrast, err = strconv.ParseFloat(os.Args[2], 64); err != nil {
			taskio.Fatal("inspect-anomaly: bad MIN_CONTRAST: %v", err)
		}
	}
	var regions inspect.Regions
	var geo inspect.Geo
	for name, v := range map[string]any{"regions.json": &regions, "geo.json": &geo} {
		b, err := taskio.ReadInput(name)
		if err != nil {
			taskio.Fatal("inspect-anomaly: %v", err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			taskio.Fatal("inspect-anomaly: %s: %v", name, err)
		}
	}
	sdk.Progress(0.5)
	rep, err := inspect.Detect(regions, geo, p)
	if err != nil {
		taskio.Fatal("inspect-anomaly: %v", err)
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Printf("%s\n", out)
	sdk.Progress(1)
	fmt.Fprintf(os.Stderr, "inspect-anomaly: %s: %d of %d regions flagged\n", rep.CaptureID, len(rep.Anomalies), len(regions.Regions))
}
