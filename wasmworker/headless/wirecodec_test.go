package headless

import (
	"bytes"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/fill"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// mustFill sets every field reachable from the pointer p to a value
// other than its zero value (package fill).
func mustFill(t *testing.T, p any) {
	t.Helper()
	if err := fill.Value(reflect.ValueOf(p).Elem()); err != nil {
		t.Fatalf("%v (teach fill and the codec)", err)
	}
}

func roundTrip[M any, PM interface {
	*M
	wireMessage
}](t *testing.T, in PM) PM {
	t.Helper()
	var buf bytes.Buffer
	e := newWireEncoder(&buf)
	if err := e.Encode(in); err != nil {
		t.Fatal(err)
	}
	if err := e.Encode(in); err != nil { // twice: the encoder reuses its buffer
		t.Fatal(err)
	}
	d := newWireDecoder(&buf)
	var out PM
	for range 2 {
		out = PM(new(M))
		if err := d.Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Decode(PM(new(M))); err == nil {
		t.Fatal("a third message decoded from two")
	}
	return out
}

// Every field of the slot messages, the assignment's included, survives
// the wire.
func TestWireCodecRoundTrip(t *testing.T) {
	var req slotRequest
	mustFill(t, &req)
	if got := roundTrip(t, &req); !reflect.DeepEqual(got, &req) {
		t.Errorf("request:\n got %+v\nwant %+v\n assign got %+v\nwant %+v", got, &req, got.Assign, req.Assign)
	}
	var rep slotReply
	mustFill(t, &rep)
	rep.Took = 1234 * time.Millisecond
	if got := roundTrip(t, &rep); !reflect.DeepEqual(got, &rep) {
		t.Errorf("reply:\n got %+v\nwant %+v", got, &rep)
	}
	// Zero values, and empty slices, which decode as nil.
	empty := &slotRequest{Kind: reqRun, Assign: &protocol.Assign{Args: []string{}, Inputs: []protocol.Blob{}}}
	want := &slotRequest{Kind: reqRun, Assign: &protocol.Assign{}}
	if got := roundTrip(t, empty); !reflect.DeepEqual(got, want) {
		t.Errorf("empty request: got %+v %+v", got, got.Assign)
	}
}

// A message cut short or carrying garbage is an error, never a panic.
func TestWireCodecBadInput(t *testing.T) {
	var req slotRequest
	mustFill(t, &req)
	var buf bytes.Buffer
	if err := newWireEncoder(&buf).Encode(&req); err != nil {
		t.Fatal(err)
	}
	msg := buf.Bytes()
	for cut := 0; cut < len(msg); cut++ {
		if err := newWireDecoder(bytes.NewReader(msg[:cut])).Decode(new(slotRequest)); err == nil {
			t.Fatalf("a message cut at %d of %d bytes decoded", cut, len(msg))
		}
	}
	// The right length, wrong contents: a huge count, a bad boolean.
	for _, body := range [][]byte{{byte(reqRun), 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, {byte(reqRun), 0, 0, 0, 7}} {
		b := append([]byte{byte(len(body))}, body...)
		if err := newWireDecoder(bytes.NewReader(b)).Decode(new(slotRequest)); err == nil {
			t.Errorf("garbage %x decoded", body)
		}
	}
}

// A count larger than the rest of the message could hold fails before
// anything is allocated for it: a megabyte of zeros claiming a million
// input files (each needs three bytes at least) allocates no million
// Blobs (56 MB).
func TestWireCodecCountBoundedByMessage(t *testing.T) {
	const n = 1 << 20
	msg := append(appendUint(nil, n), make([]byte, n)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d := &wireBuf{b: msg}
	bls := d.blobs()
	runtime.ReadMemStats(&after)
	if d.err == nil || bls != nil {
		t.Fatalf("a million blobs decoded from %d bytes (err %v)", len(msg), d.err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Errorf("decoding the bad count allocated %d MiB", grew>>20)
	}
}
