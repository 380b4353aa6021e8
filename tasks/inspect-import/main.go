// Command inspect-import is the first stage of the inspection example: it
// "imports" one aerial capture of a power-line corridor, synthesised
// deterministically from a seed, with a few planted defects.
//
//	inspect-import SEED WIDTH HEIGHT
//
// Outputs: raw.pgm (8-bit grayscale, binary PGM) and meta.json (capture
// metadata: position, ground sampling distance, heading, and the planted
// defects as ground truth).
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
	if len(os.Args) != 4 {
		taskio.Fatal("usage: inspect-import SEED WIDTH HEIGHT")
	}
	seed, err1 := strconv.ParseUint(os.Args[1], 10, 64)
	w, err2 := strconv.Atoi(os.Args[2])
	h, err3 := strconv.Atoi(os.Args[3])
	if err := errors.Join(err1, err2, err3); err != nil {
		taskio.Fatal("inspect-import: %v", err)
	}
	img, meta, err := inspect.Synthesize(seed, w, h, func(f float64) { sdk.Progress(0.9 * f) })
	if err != nil {
		taskio.Fatal("inspect-import: %v", err)
	}
	mj, _ := json.MarshalIndent(meta, "", "  ")
	if err := errors.Join(
		taskio.WriteOutput("raw.pgm", inspect.EncodePGM(img)),
		taskio.WriteOutput("meta.json", append(mj, '\n')),
	); err != nil {
		taskio.Fatal("inspect-import: %v", err)
	}
	sdk.Progress(1)
	fmt.Fprintf(os.Stderr, "inspect-import: %s, %dx%d, %d defects planted\n", meta.CaptureID, w, h, len(meta.Planted))
}
