// Command montage stitches the PNG tiles under /in into /out/image.png.
//
//	montage COLS ROWS
//
// The inputs, sorted by name, fill the grid row by row (name them so that
// they sort in that order, e.g. r0-c0.png, r0-c1.png, ...).
package main

import (
	"bytes"
	"fmt"
	"image"
	"image/png"
	"os"
	"strconv"

	"github.com/cyclepool/cyclepool/tasks/internal/taskio"
	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	if len(os.Args) != 3 {
		taskio.Fatal("usage: montage COLS ROWS")
	}
	cols, err1 := strconv.Atoi(os.Args[1])
	rows, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil {
		taskio.Fatal("montage: bad grid %q %q", os.Args[1], os.Args[2])
	}
	names, err := taskio.ListInputs()
	if err != nil {
		taskio.Fatal("montage: %v", err)
	}
	if len(names) != cols*rows {
		taskio.Fatal("montage: a %dx%d grid needs %d tiles, /in has %d", cols, rows, cols*rows, len(names))
	}
	tiles := make([]image.Image, len(names))
	for i, n := range names {
		b, err := taskio.ReadInput(n)
		if err != nil {
			taskio.Fatal("montage: %v", err)
		}
		if tiles[i], err = png.Decode(bytes.NewReader(b)); err != nil {
			taskio.Fatal("montage: %s: %v", n, err)
		}
		sdk.Progress(0.5 * float64(i+1) / float64(len(names)))
	}
	img, err := montage(tiles, cols, rows, func(f float64) { sdk.Progress(0.5 + 0.4*f) })
	if err != nil {
		taskio.Fatal("montage: %v", err)
	}
	out, err := encodePNG(img)
	if err != nil {
		taskio.Fatal("montage: %v", err)
	}
	if err := taskio.WriteOutput("image.png", out); err != nil {
		taskio.Fatal("montage: %v", err)
	}
	sdk.Progress(1)
	fmt.Fprintf(os.Stderr, "montage: wrote image.png (%dx%d, %d bytes)\n", img.Bounds().Dx(), img.Bounds().Dy(), len(out))
}
