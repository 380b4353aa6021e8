// Command mandelbrot renders one tile of the Mandelbrot set to /out/tile.png.
//
//	mandelbrot X0 Y0 X1 Y1 WIDTH HEIGHT MAXITER
//
// Pixel (px, py) samples the point (X0 + (px+0.5)(X1-X0)/WIDTH,
// Y0 + (py+0.5)(Y1-Y0)/HEIGHT): row 0 is at Y0, so give Y0 > Y1 for the
// usual orientation. It reports progress per row and checkpoints the rows
// done; the PNG bytes are the same on every run and every runner.
package main

import (
	"fmt"
	"os"

	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	p, err := parseParams(os.Args[1:])
	if err != nil {
		taskio.Fatal("mandelbrot: %v", err)
	}
	t := newTile(p)
	if b, ok := sdk.Restore(); ok {
		if r, err := restoreTile(p, b); err != nil {
			fmt.Fprintf(os.Stderr, "mandelbrot: ignoring checkpoint: %v\n", err)
		} else {
			t = r
			fmt.Fprintf(os.Stderr, "mandelbrot: resuming at row %d of %d\n", t.Row, p.H)
		}
	}
	t.render(hooks{
		progress:      sdk.Progress,
		checkpointDue: sdk.CheckpointDue,
		checkpoint: func(b []byte) {
			if err := sdk.Checkpoint(b); err != nil {
				fmt.Fprintf(os.Stderr, "mandelbrot: %v\n", err)
			}
		},
	})
	img, err := t.png()
	if err != nil {
		taskio.Fatal("mandelbrot: %v", err)
	}
	if err := taskio.WriteOutput("tile.png", img); err != nil {
		taskio.Fatal("mandelbrot: %v", err)
	}
	fmt.Fprintf(os.Stderr, "mandelbrot: wrote tile.png (%dx%d, %d bytes)\n", p.W, p.H, len(img))
}
