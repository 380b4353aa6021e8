package headless

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// The encoding of the messages between the worker and a slot process (see
// wire.go): each message is its length (a uvarint) followed by its fields,
// every field of the message type in the order of its declaration, whatever
// the Kind: integers as (zig-zag) varints, booleans as one byte, floats as
// their 8 IEEE 754 bytes, strings and byte slices as a uvarint length and
// the bytes, slices as a uvarint count and the elements, a *protocol.Assign
// as a presence byte and its fields. An empty byte slice or slice decodes as
// nil. (It replaced encoding/gob, whose reflection was about a tenth of the
// worker's CPU per small attempt.) TestWireCodecRoundTrip fills every field
// of every type, so that a field added to one of them without being added
// here fails it.

// maxWireMessage bounds a message, as gob did (far above any limit of an
// attempt).
const maxWireMessage = 1 << 30

// wireEncoder writes messages to w, each with one Write.
type wireEncoder struct {
	w   io.Writer
	buf []byte
}

func newWireEncoder(w io.Writer) *wireEncoder { return &wireEncoder{w: w} }

// wireMessage is a slotRequest or a slotReply.
type wireMessage interface {
	appendWire(b []byte) []byte
	decodeWire(d *wireBuf) error
}

// Encode writes one message.
func (e *wireEncoder) Encode(m wireMessage) error {
	const room = binary.MaxVarintLen64
	b := append(e.buf[:0], make([]byte, room)...)
	b = m.appendWire(b)
	n := len(b) - room
	if n > maxWireMessage {
		return fmt.Errorf("slot message of %d bytes", n)
	}
	var hdr [binary.MaxVarintLen64]byte
	h := binary.PutUvarint(hdr[:], uint64(n))
	start := room - h
	copy(b[start:], hdr[:h])
	_, err := e.w.Write(b[start:])
	if cap(b) <= 64<<10 {
		e.buf = b // keep small buffers for the next message
	}
	return err
}

// wireDecoder reads messages from r.
type wireDecoder struct {
	r   *bufio.Reader
	buf []byte
}

func newWireDecoder(r io.Reader) *wireDecoder {
	return &wireDecoder{r: bufio.NewReaderSize(r, 64<<10)}
}

// Decode reads one message into m.
func (d *wireDecoder) Decode(m wireMessage) error {
	n, err := binary.ReadUvarint(d.r)
	if err != nil {
		return err
	}
	if n > maxWireMessage {
		return fmt.Errorf("slot message of %d bytes", n)
	}
	if uint64(cap(d.buf)) < n {
		d.buf = make([]byte, n)
	}
	b := d.buf[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if cap(d.buf) > 64<<10 {
		d.buf = nil // do not keep a module's bytes
	}
	wb := &wireBuf{b: b}
	if err := m.decodeWire(wb); err != nil {
		return err
	}
	if wb.err == nil && len(wb.b) != 0 {
		wb.err = errors.New("trailing bytes")
	}
	if wb.err != nil {
		return fmt.Errorf("bad slot message: %w", wb.err)
	}
	return nil
}

// Appending fields.

func appendInt(b []byte, v int64) []byte     { return binary.AppendVarint(b, v) }
func appendUint(b []byte, v uint64) []byte   { return binary.AppendUvarint(b, v) }
func appendString(b []byte, s string) []byte { return append(appendUint(b, uint64(len(s))), s...) }
func appendBytes(b, p []byte) []byte         { return append(appendUint(b, uint64(len(p))), p...) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendBlob(b []byte, bl *protocol.Blob) []byte {
	b = appendString(b, bl.Name)
	b = appendInt(b, int64(bl.Size))
	return appendBytes(b, bl.Data)
}

func appendBlobs(b []byte, bls []protocol.Blob) []byte {
	b = appendUint(b, uint64(len(bls)))
	for i := range bls {
		b = appendBlob(b, &bls[i])
	}
	return b
}

func appendAssign(b []byte, a *protocol.Assign) []byte {
	if a == nil {
		return appendBool(b, false)
	}
	b = appendBool(b, true)
	b = appendInt(b, a.Attempt)
	b = appendString(b, a.Task)
	b = appendString(b, a.Module)
	b = appendUint(b, uint64(len(a.Args)))
	for _, s := range a.Args {
		b = appendString(b, s)
	}
	b = appendBlob(b, &a.Stdin)
	b = appendBlobs(b, a.Inputs)
	b = appendBlob(b, &a.Restore)
	b = appendUint(b, a.Seed)
	b = appendUint(b, uint64(a.Limits.MemoryPages))
	b = appendInt(b, a.Limits.WallMS)
	b = appendInt(b, a.Limits.OutputBytes)
	b = appendInt(b, a.Limits.LogBytes)
	b = appendInt(b, a.CkptMS)
	b = appendString(b, a.Priority)
	// The setup and a checkpoint to download are rare: JSON, empty when
	// there is none.
	var setup, from []byte
	if a.Setup != nil {
		setup, _ = json.Marshal(a.Setup)
	}
	if a.RestoreFrom != nil {
		from, _ = json.Marshal(a.RestoreFrom)
	}
	return appendBytes(appendBytes(b, setup), from)
}

// wireBuf reads fields; the first error sticks and later reads return
// zero values.
type wireBuf struct {
	b   []byte
	err error
}

func (d *wireBuf) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("cut short or malformed %s", what)
	}
	d.b = nil
}

func (d *wireBuf) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("unsigned integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *wireBuf) int() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *wireBuf) bool() bool {
	if len(d.b) < 1 || d.b[0] > 1 {
		d.fail("boolean")
		return false
	}
	v := d.b[0] == 1
	d.b = d.b[1:]
	return v
}

func (d *wireBuf) u8() uint8 {
	if len(d.b) < 1 {
		d.fail("kind")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *wireBuf) float() float64 {
	if len(d.b) < 8 {
		d.fail("float")
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(d.b))
	d.b = d.b[8:]
	return v
}

// raw returns the next length-prefixed bytes, still in the message.
func (d *wireBuf) raw() []byte {
	n := d.uint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.fail("bytes")
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *wireBuf) string() string { return string(d.raw()) }

// bytes returns a copy of the next length-prefixed bytes (nil when empty).
func (d *wireBuf) bytes() []byte {
	p := d.raw()
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

// count returns a slice length, at most what the rest could hold when
// each element takes at least min bytes: a garbage count cannot make the
// decoder allocate more than a small multiple of the message.
func (d *wireBuf) count(min int) int {
	n := d.uint()
	if d.err != nil || n > uint64(len(d.b)/min) {
		d.fail("count")
		return 0
	}
	return int(n)
}

func (d *wireBuf) blob(bl *protocol.Blob) {
	bl.Name = d.string()
	bl.Size = int(d.int())
	bl.Data = d.bytes()
}

func (d *wireBuf) blobs() []protocol.Blob {
	n := d.count(3) // a name, a size and data: a byte each at least
	if n == 0 {
		return nil
	}
	bls := make([]protocol.Blob, n)
	for i := range bls {
		d.blob(&bls[i])
	}
	return bls
}

func (d *wireBuf) assign() *protocol.Assign {
	if !d.bool() {
		return nil
	}
	a := &protocol.Assign{}
	a.Attempt = d.int()
	a.Task = d.string()
	a.Module = d.string()
	if n := d.count(1); n > 0 {
		a.Args = make([]string, n)
		for i := range a.Args {
			a.Args[i] = d.string()
		}
	}
	d.blob(&a.Stdin)
	a.Inputs = d.blobs()
	d.blob(&a.Restore)
	a.Seed = d.uint()
	pages := d.uint()
	if pages > math.MaxUint32 {
		d.fail("memory pages")
	}
	a.Limits.MemoryPages = uint32(pages)
	a.Limits.WallMS = d.int()
	a.Limits.OutputBytes = d.int()
	a.Limits.LogBytes = d.int()
	a.CkptMS = d.int()
	a.Priority = d.string()
	if setup := d.raw(); len(setup) > 0 {
		a.Setup = new(protocol.Setup)
		if err := json.Unmarshal(setup, a.Setup); err != nil {
			d.fail("setup")
		}
	}
	if from := d.raw(); len(from) > 0 {
		a.RestoreFrom = new(protocol.File)
		if err := json.Unmarshal(from, a.RestoreFrom); err != nil {
			d.fail("restore_from")
		}
	}
	return a
}

// The two messages.

func (m *slotRequest) appendWire(b []byte) []byte {
	b = append(b, byte(m.Kind))
	b = appendInt(b, int64(m.Version))
	b = appendString(b, m.CacheDir)
	b = appendString(b, m.DataDir)
	b = appendString(b, m.Dir)
	b = appendBool(b, m.Gate)
	b = appendString(b, m.ModuleID)
	b = appendBytes(b, m.Module)
	b = appendAssign(b, m.Assign)
	b = appendBool(b, m.Host)
	b = appendUint(b, uint64(m.Seq))
	return appendString(b, m.Err)
}

func (m *slotRequest) decodeWire(d *wireBuf) error {
	m.Kind = requestKind(d.u8())
	m.Version = int(d.int())
	m.CacheDir = d.string()
	m.DataDir = d.string()
	m.Dir = d.string()
	m.Gate = d.bool()
	m.ModuleID = d.string()
	m.Module = d.bytes()
	m.Assign = d.assign()
	m.Host = d.bool()
	seq := d.uint()
	if seq > math.MaxUint32 {
		d.fail("seq")
	}
	m.Seq = uint32(seq)
	m.Err = d.string()
	return d.err
}

func (m *slotReply) appendWire(b []byte) []byte {
	b = append(b, byte(m.Kind))
	b = appendInt(b, int64(m.Version))
	b = appendInt(b, int64(m.Pid))
	b = appendString(b, m.Err)
	b = appendBool(b, m.ModuleErr)
	b = appendBytes(b, m.Data)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(m.Fraction))
	b = appendString(b, m.Message)
	b = appendBlobs(b, m.Outputs)
	b = appendUint(b, uint64(len(m.Files)))
	for _, f := range m.Files {
		b = appendString(b, f.Name)
		b = appendString(b, f.Path)
		b = appendInt(b, f.Size)
	}
	b = appendString(b, m.Reason)
	return appendInt(b, int64(m.Took))
}

func (m *slotReply) decodeWire(d *wireBuf) error {
	m.Kind = replyKind(d.u8())
	m.Version = int(d.int())
	m.Pid = int(d.int())
	m.Err = d.string()
	m.ModuleErr = d.bool()
	m.Data = d.bytes()
	m.Fraction = d.float()
	m.Message = d.string()
	m.Outputs = d.blobs()
	if n := d.count(3); n > 0 {
		m.Files = make([]wasmworker.OutputFile, n)
		for i := range m.Files {
			m.Files[i] = wasmworker.OutputFile{Name: d.string(), Path: d.string(), Size: d.int()}
		}
	}
	m.Reason = d.string()
	m.Took = time.Duration(d.int())
	return d.err
}
