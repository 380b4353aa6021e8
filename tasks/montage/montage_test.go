package main

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"testing"
)

func solid(w, h int, c color.NRGBA) image.Image {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	return img
}

func TestMontage(t *testing.T) {
	red := color.NRGBA{255, 0, 0, 255}
	green := color.NRGBA{0, 255, 0, 255}
	blue := color.NRGBA{0, 0, 255, 255}
	white := color.NRGBA{255, 255, 255, 255}
	tiles := []image.Image{solid(4, 3, red), solid(5, 3, green), solid(4, 2, blue), solid(5, 2, white)}
	var last float64
	img, err := montage(tiles, 2, 2, func(f float64) { last = f })
	if err != nil {
		t.Fatal(err)
	}
	if last != 1 {
		t.Errorf("last progress %v", last)
	}
	if b := img.Bounds(); b.Dx() != 9 || b.Dy() != 5 {
		t.Fatalf("size %v", b)
	}
	for _, c := range []struct {
		x, y int
		want color.NRGBA
	}{{0, 0, red}, {3, 2, red}, {4, 0, green}, {8, 2, green}, {0, 3, blue}, {4, 4, white}, {8, 4, white}} {
		if got := img.NRGBAAt(c.x, c.y); got != c.want {
			t.Errorf("(%d,%d) = %v, want %v", c.x, c.y, got, c.want)
		}
	}
	b1, err := encodePNG(img)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := encodePNG(img)
	if !bytes.Equal(b1, b2) {
		t.Error("encoding is not deterministic")
	}
	if _, err := png.Decode(bytes.NewReader(b1)); err != nil {
		t.Error(err)
	}
	if _, err := montage(tiles, 3, 2, func(float64) {}); err == nil {
		t.Error("wrong tile count accepted")
	}
}
