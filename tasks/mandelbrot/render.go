package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/png"
	"strconv"
)

// params describe one tile: the pixel (px, py) samples the complex point
// (X0 + (px+0.5)*(X1-X0)/W, Y0 + (py+0.5)*(Y1-Y0)/H), so row 0 is at Y0.
type params struct {
	X0, Y0, X1, Y1 float64
	W, H, MaxIter  int
}

const maxPixels = 1 << 24 // 16 Mpixel; a tile is far smaller

func parseParams(args []string) (params, error) {
	if len(args) != 7 {
		return params{}, errors.New("usage: mandelbrot X0 Y0 X1 Y1 WIDTH HEIGHT MAXITER")
	}
	var p params
	var errs []error
	f := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		errs = append(errs, err)
		return v
	}
	i := func(s string) int {
		v, err := strconv.Atoi(s)
		errs = append(errs, err)
		return v
	}
	p.X0, p.Y0, p.X1, p.Y1 = f(args[0]), f(args[1]), f(args[2]), f(args[3])
	p.W, p.H, p.MaxIter = i(args[4]), i(args[5]), i(args[6])
	if err := errors.Join(errs...); err != nil {
		return params{}, err
	}
	if p.W <= 0 || p.H <= 0 || p.W*p.H > maxPixels {
		return params{}, fmt.Errorf("bad size %dx%d", p.W, p.H)
	}
	if p.MaxIter <= 0 || p.MaxIter > 1<<24 {
		return params{}, fmt.Errorf("bad MAXITER %d", p.MaxIter)
	}
	return p, nil
}

// key identifies the parameters inside a checkpoint.
func (p params) key() string {
	return fmt.Sprintf("%v %v %v %v %d %d %d", p.X0, p.Y0, p.X1, p.Y1, p.W, p.H, p.MaxIter)
}

// escape returns the iteration at which c escapes, or maxIter if it never
// does. Explicit conversions keep the compiler from fusing multiply-adds, so
// the result is the same on every architecture and under wasm.
func escape(cx, cy float64, maxIter int) int {
	var x, y float64
	for n := 0; n < maxIter; n++ {
		xx := float64(x * x)
		yy := float64(y * y)
		if xx+yy > 4 {
			return n
		}
		xy := float64(x * y)
		x = float64(xx-yy) + cx
		y = float64(xy+xy) + cy
	}
	return maxIter
}

// palette is a smooth cyclic gradient of 256 colours.
var palette = func() [256][3]uint8 {
	anchors := [][3]int{
		{0, 7, 100}, {32, 107, 203}, {237, 255, 255}, {255, 170, 0}, {0, 2, 0}, {0, 7, 100},
	}
	var pal [256][3]uint8
	seg := 256 / (len(anchors) - 1)
	for i := range pal {
		a := i / seg
		if a >= len(anchors)-1 {
			a = len(anchors) - 2
		}
		t := i - a*seg
		for c := 0; c < 3; c++ {
			pal[i][c] = uint8(anchors[a][c] + (anchors[a+1][c]-anchors[a][c])*t/seg)
		}
	}
	return pal
}()

func colour(n, maxIter int) [3]uint8 {
	if n >= maxIter {
		return [3]uint8{0, 0, 0}
	}
	return palette[(n*5)%256]
}

// renderRow writes row py of the tile as RGB triples into dst (3*W bytes).
func renderRow(p params, py int, dst []byte) {
	dx := (p.X1 - p.X0) / float64(p.W)
	dy := (p.Y1 - p.Y0) / float64(p.H)
	cy := p.Y0 + float64((float64(py)+0.5)*dy)
	for px := 0; px < p.W; px++ {
		cx := p.X0 + float64((float64(px)+0.5)*dx)
		c := colour(escape(cx, cy, p.MaxIter), p.MaxIter)
		copy(dst[3*px:], c[:])
	}
}

// tile is a tile being rendered: rows [0, Row) of Pix are done.
type tile struct {
	P   params
	Row int
	Pix []byte // RGB, 3*W*H bytes
}

func newTile(p params) *tile {
	return &tile{P: p, Pix: make([]byte, 3*p.W*p.H)}
}

const magic = "cpMB1"

// encode is the checkpoint state: magic, parameters, rows done and the
// pixels of those rows.
func (t *tile) encode() []byte {
	k := t.P.key()
	done := t.Pix[:3*t.P.W*t.Row]
	b := make([]byte, 0, len(magic)+4+len(k)+4+len(done))
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(k)))
	b = append(b, k...)
	b = binary.LittleEndian.AppendUint32(b, uint32(t.Row))
	return append(b, done...)
}

// restoreTile rebuilds a tile of p from a checkpoint.
func restoreTile(p params, b []byte) (*tile, error) {
	if !bytes.HasPrefix(b, []byte(magic)) || len(b) < len(magic)+8 {
		return nil, errors.New("not a mandelbrot checkpoint")
	}
	b = b[len(magic):]
	kl := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	if kl > len(b)-4 || string(b[:kl]) != p.key() {
		return nil, errors.New("checkpoint is for another tile")
	}
	b = b[kl:]
	row := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	if row < 0 || row > p.H || len(b) != 3*p.W*row {
		return nil, errors.New("checkpoint is inconsistent")
	}
	t := newTile(p)
	t.Row = row
	copy(t.Pix, b)
	return t, nil
}

type hooks struct {
	progress      func(float64)
	checkpointDue func() bool
	checkpoint    func([]byte)
}

// render renders the remaining rows of t.
func (t *tile) render(h hooks) {
	rowBytes := 3 * t.P.W
	for t.Row < t.P.H {
		renderRow(t.P, t.Row, t.Pix[t.Row*rowBytes:(t.Row+1)*rowBytes])
		t.Row++
		h.progress(float64(t.Row) / float64(t.P.H))
		if t.Row < t.P.H && h.checkpointDue() {
			h.checkpoint(t.encode())
		}
	}
}

// png encodes the tile; the bytes depend only on the pixels.
func (t *tile) png() ([]byte, error) {
	img := image.NewNRGBA(image.Rect(0, 0, t.P.W, t.P.H))
	for i := 0; i < t.P.W*t.P.H; i++ {
		copy(img.Pix[4*i:], t.Pix[3*i:3*i+3])
		img.Pix[4*i+3] = 255
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.DefaultCompression}
	if err := enc.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
