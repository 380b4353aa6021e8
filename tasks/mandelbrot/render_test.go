package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"image/png"
	"testing"
)

var full = []string{"-2.2", "1.25", "0.8", "-1.25", "96", "80", "200"}

func mustParams(t *testing.T, args []string) params {
	t.Helper()
	p, err := parseParams(args)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func renderAll(p params) *tile {
	tl := newTile(p)
	tl.render(hooks{progress: func(float64) {}, checkpointDue: func() bool { return false }, checkpoint: func([]byte) {}})
	return tl
}

func TestDeterministicPNG(t *testing.T) {
	p := mustParams(t, full)
	a, err := renderAll(p).png()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := renderAll(p).png()
	if !bytes.Equal(a, b) {
		t.Fatal("two renders differ")
	}
	img, err := png.Decode(bytes.NewReader(a))
	if err != nil {
		t.Fatalf("not a valid PNG: %v", err)
	}
	if r := img.Bounds(); r.Dx() != 96 || r.Dy() != 80 {
		t.Fatalf("size %v", r)
	}
	// The centre of the main cardioid (-0.25, 0) is in the set: black.
	// Pixel column for x=-0.25: (x-x0)/dx - 0.5 = (1.95/3.0)*96 - 0.5 ≈ 62.
	if r, g, b, _ := img.At(62, 40).RGBA(); r|g|b != 0 {
		t.Errorf("centre pixel is not black: %v %v %v", r, g, b)
	}
	// A corner far outside escapes at once: not black.
	if r, g, b, _ := img.At(0, 0).RGBA(); r|g|b == 0 {
		t.Error("corner pixel is black")
	}
}

// TestPixelsPinned pins the raw pixels, so that a change of arithmetic (for
// example fused multiply-adds on some architecture) shows up here rather
// than as replicas that disagree.
func TestPixelsPinned(t *testing.T) {
	tl := renderAll(mustParams(t, full))
	got := fmt.Sprintf("%x", sha256.Sum256(tl.Pix))
	const want = "5832f51d2e0b18f9f0bd1896da29ed68ca2cfc192c4321ec28f8f750277d6baa"
	if got != want {
		t.Errorf("pixel hash %s, want %s", got, want)
	}
}

func TestCheckpointResume(t *testing.T) {
	p := mustParams(t, full)
	want := renderAll(p).Pix
	var saved [][]byte
	tl := newTile(p)
	tl.render(hooks{progress: func(float64) {}, checkpointDue: func() bool { return true },
		checkpoint: func(b []byte) { saved = append(saved, bytes.Clone(b)) }})
	if len(saved) != p.H-1 {
		t.Fatalf("%d checkpoints, want %d", len(saved), p.H-1)
	}
	r, err := restoreTile(p, saved[30])
	if err != nil {
		t.Fatal(err)
	}
	if r.Row != 31 {
		t.Fatalf("restored at row %d", r.Row)
	}
	r.render(hooks{progress: func(float64) {}, checkpointDue: func() bool { return false }, checkpoint: func([]byte) {}})
	if !bytes.Equal(r.Pix, want) {
		t.Fatal("resumed render differs")
	}
	other := mustParams(t, []string{"-2.2", "1.25", "0.8", "-1.25", "96", "80", "201"})
	if _, err := restoreTile(other, saved[30]); err == nil {
		t.Error("checkpoint of another tile accepted")
	}
	if _, err := restoreTile(p, saved[30][:len(saved[30])-1]); err == nil {
		t.Error("truncated checkpoint accepted")
	}
}

func TestBadArgs(t *testing.T) {
	for _, a := range [][]string{nil, {"0", "0", "1", "1", "0", "10", "10"}, {"x", "0", "1", "1", "10", "10", "10"}, {"0", "0", "1", "1", "10", "10", "0"}} {
		if _, err := parseParams(a); err == nil {
			t.Errorf("%q accepted", a)
		}
	}
}
