// Command inspect-segment is the third stage of the inspection example: it
// segments a georeferenced capture (3x3 median filter, threshold against
// the local background, 8-connected components).
//
//	inspect-segment [THRESHOLD [WINDOW]]
//
// Input: geo.pgm (from inspect-georef). Outputs: mask.pgm (255 bright, 128
// dark, 0 background) and regions.json. The filter pass reports progress
// per row and checkpoints the rows done when the platform asks.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/cyclepool/cyclepool/tasks/internal/inspect"
	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	p := inspect.DefaultSegmentParams
	var err error
	if len(os.Args) > 3 {
		taskio.Fatal("usage: inspect-segment [THRESHOLD [WINDOW]]")
	}
	if len(os.Args) > 1 {
		if p.Threshold, err = strconv.Atoi(os.Args[1]); err != nil {
			taskio.Fatal("inspect-segment: bad THRESHOLD: %v", err)
		}
	}
	if len(os.Args) > 2 {
		if p.Window, err = strconv.Atoi(os.Args[2]); err != nil {
			taskio.Fatal("inspect-segment: bad WINDOW: %v", err)
		}
	}
	b, err := taskio.ReadInput("geo.pgm")
	if err != nil {
		taskio.Fatal("inspect-segment: %v", err)
	}
	img, err := inspect.DecodePGM(b)
	if err != nil {
		taskio.Fatal("inspect-segment: geo.pgm: %v", err)
	}
	s, err := inspect.NewSegmenter(img, p)
	if err != nil {
		taskio.Fatal("inspect-segment: %v", err)
	}
	if st, ok := sdk.Restore(); ok {
		if err := s.Resume(st); err != nil {
			fmt.Fprintf(os.Stderr, "inspect-segment: ignoring checkpoint: %v\n", err)
		} else {
			fmt.Fprintf(os.Stderr, "inspect-segment: resuming at row %d of %d\n", s.Row, img.H)
		}
	}
	s.SmoothRows(func(row int) {
		sdk.Progress(0.8 * float64(row) / float64(img.H))
		if row < img.H && sdk.CheckpointDue() {
			if err := sdk.Checkpoint(s.Checkpoint()); err != nil {
				fmt.Fprintf(os.Stderr, "inspect-segment: %v\n", err)
			}
		}
	})
	mask, regions, err := s.Finish()
	if err != nil {
		taskio.Fatal("inspect-segment: %v", err)
	}
	sdk.Progress(0.95)
	rj, _ := json.MarshalIndent(regions, "", "  ")
	if err := errors.Join(
		taskio.WriteOutput("mask.pgm", inspect.EncodePGM(mask)),
		taskio.WriteOutput("regions.json", append(rj, '\n')),
	); err != nil {
		taskio.Fatal("inspect-segment: %v", err)
	}
	sdk.Progress(1)
	fmt.Fprintf(os.Stderr, "inspect-segment: %d regions\n", len(regions.Regions))
}
