package main

import (
	"bytes"
	"fmt"
	"image"
	"image/draw"
	"image/png"
)

// montage places tiles row-major on a cols x rows grid. Every column is as
// wide as its widest tile and every row as tall as its tallest one; tiles
// sit at the top left of their cell and uncovered pixels are black.
func montage(tiles []image.Image, cols, rows int, progress func(float64)) (*image.NRGBA, error) {
	if cols <= 0 || rows <= 0 {
		return nil, fmt.Errorf("bad grid %dx%d", cols, rows)
	}
	if len(tiles) != cols*rows {
		return nil, fmt.Errorf("a %dx%d grid needs %d tiles, have %d", cols, rows, cols*rows, len(tiles))
	}
	colW := make([]int, cols)
	rowH := make([]int, rows)
	for i, t := range tiles {
		b := t.Bounds()
		colW[i%cols] = max(colW[i%cols], b.Dx())
		rowH[i/cols] = max(rowH[i/cols], b.Dy())
	}
	colX := make([]int, cols+1)
	for c, w := range colW {
		colX[c+1] = colX[c] + w
	}
	rowY := make([]int, rows+1)
	for r, h := range rowH {
		rowY[r+1] = rowY[r] + h
	}
	if int64(colX[cols])*int64(rowY[rows]) > 1<<26 {
		return nil, fmt.Errorf("montage of %dx%d pixels is too large", colX[cols], rowY[rows])
	}
	out := image.NewNRGBA(image.Rect(0, 0, colX[cols], rowY[rows]))
	draw.Draw(out, out.Bounds(), image.NewUniform(image.Black), image.Point{}, draw.Src)
	for i, t := range tiles {
		at := image.Pt(colX[i%cols], rowY[i/cols])
		b := t.Bounds()
		draw.Draw(out, image.Rectangle{Min: at, Max: at.Add(b.Size())}, t, b.Min, draw.Src)
		progress(float64(i+1) / float64(len(tiles)))
	}
	return out, nil
}

func encodePNG(img image.Image) ([]byte, error) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
