package protocol

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// DefaultMaxFrameBytes bounds a whole frame (header plus payload) unless the
// server says otherwise in Welcome.
const DefaultMaxFrameBytes = 80 << 20 // room for 64 MiB of outputs, an 8 MiB log and the header

// MaxHeaderBytes bounds the JSON header of a frame.
const MaxHeaderBytes = 1 << 20

// blobs lists the payload-carrying blobs of f in wire order.
func (f *Frame) blobs() []*Blob {
	var bs []*Blob
	for i := range f.Assign {
		a := &f.Assign[i]
		bs = append(bs, &a.Stdin)
		for j := range a.Inputs {
			bs = append(bs, &a.Inputs[j])
		}
		bs = append(bs, &a.Restore)
	}
	if f.Checkpoint != nil {
		bs = append(bs, &f.Checkpoint.State)
	}
	for i := range f.Results {
		r := &f.Results[i]
		for j := range r.Outputs {
			bs = append(bs, &r.Outputs[j])
		}
		bs = append(bs, &r.Log)
	}
	for i := range f.Fails {
		bs = append(bs, &f.Fails[i].Log)
	}
	return bs
}

// Encode serialises f. It sets every Blob's Size from its Data. binary
// reports whether the message must be sent as a binary WebSocket message
// (it carries payload); otherwise data is a plain JSON text message.
func Encode(f *Frame) (data []byte, binaryMsg bool, err error) {
	bs := f.blobs()
	total := 0
	for _, b := range bs {
		b.Size = len(b.Data)
		total += b.Size
	}
	hdr, ok := encodeFast(f)
	if !ok {
		if hdr, err = json.Marshal(f); err != nil {
			return nil, false, fmt.Errorf("encode %s frame: %w", f.Type, err)
		}
	}
	if total == 0 {
		return hdr, false, nil
	}
	out := make([]byte, 4, 4+len(hdr)+total)
	binary.BigEndian.PutUint32(out, uint32(len(hdr)))
	out = append(out, hdr...)
	for _, b := range bs {
		out = append(out, b.Data...)
	}
	return out, true, nil
}

// Decode parses one WebSocket message. binaryMsg says whether it arrived as a
// binary message. The returned frame's blobs alias data. Any inconsistency
// (bad JSON, unknown type, sizes that do not add up) is an error.
func Decode(data []byte, binaryMsg bool) (*Frame, error) {
	var hdr, payload []byte
	if binaryMsg {
		if len(data) < 4 {
			return nil, errors.New("decode frame: binary message shorter than its length prefix")
		}
		n := binary.BigEndian.Uint32(data)
		if n > MaxHeaderBytes || int(n) > len(data)-4 {
			return nil, fmt.Errorf("decode frame: header length %d does not fit a %d-byte message", n, len(data))
		}
		hdr, payload = data[4:4+n], data[4+n:]
	} else {
		hdr = data
		if len(hdr) > MaxHeaderBytes {
			return nil, fmt.Errorf("decode frame: text message of %d bytes is over the %d-byte header limit", len(hdr), MaxHeaderBytes)
		}
	}
	f, ok := decodeFast(hdr)
	if !ok {
		f = new(Frame)
		if err := json.Unmarshal(hdr, f); err != nil {
			return nil, fmt.Errorf("decode frame: %w", err)
		}
	}
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("decode %q frame: %w", f.Type, err)
	}
	off := 0
	for _, b := range f.blobs() {
		if b.Size < 0 || b.Size > len(payload)-off {
			return nil, fmt.Errorf("decode %q frame: blob %q of %d bytes overruns the %d-byte payload", f.Type, b.Name, b.Size, len(payload))
		}
		b.Data = payload[off : off+b.Size : off+b.Size]
		off += b.Size
	}
	if off != len(payload) {
		return nil, fmt.Errorf("decode %q frame: %d payload bytes left over", f.Type, len(payload)-off)
	}
	return f, nil
}

// check verifies that the field named by Type is present.
func (f *Frame) check() error {
	var ok bool
	switch f.Type {
	case TypeHello:
		ok = f.Hello != nil
	case TypeWelcome:
		ok = f.Welcome != nil
	case TypeAssign:
		ok = len(f.Assign) > 0
	case TypeHeartbeat:
		ok = f.Heartbeat != nil
	case TypeCheckpoint:
		ok = f.Checkpoint != nil
	case TypeResult:
		ok = len(f.Results) > 0
	case TypeFail:
		ok = len(f.Fails) > 0
	case TypeCancel:
		ok = f.Cancel != nil
	case TypeAck:
		ok = len(f.Acks) > 0
	case TypeError:
		ok = f.Error != nil
	default:
		return errors.New("unknown frame type")
	}
	if !ok {
		return errors.New("frame body missing")
	}
	return nil
}
