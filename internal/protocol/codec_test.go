package protocol

import (
	"bytes"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		frame  Frame
		binary bool
	}{
		{"hello", Frame{Type: TypeHello, Hello: &Hello{Version: Version, Kind: KindHeadless, Slots: 2}}, false},
		{"assign with payload", Frame{Type: TypeAssign, Assign: []Assign{
			{Attempt: 1, Module: "sha256:ab", Stdin: Blob{Data: []byte("in")}, Inputs: []Blob{{Name: "a", Data: []byte("AAA")}, {Name: "b"}}},
			{Attempt: 2, Restore: Blob{Data: []byte("state")}},
		}}, true},
		{"result", Frame{Type: TypeResult, Results: []Result{{Attempt: 3, Outputs: []Blob{{Name: "stdout", Data: []byte("42\n")}}, Log: Blob{Data: []byte("log")}}}}, true},
		{"checkpoint", Frame{Type: TypeCheckpoint, Checkpoint: &Checkpoint{Attempt: 4, Seq: 1, State: Blob{Data: []byte{0, 1, 2}}}}, true},
		{"ack", Frame{Type: TypeAck, Acks: []Ack{{Attempt: 5, Of: AckResult, OK: true}}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, bin, err := Encode(&tc.frame)
			if err != nil {
				t.Fatal(err)
			}
			if bin != tc.binary {
				t.Fatalf("binary = %v, want %v", bin, tc.binary)
			}
			got, err := Decode(data, bin)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.frame.blobs()
			have := got.blobs()
			if len(want) != len(have) {
				t.Fatalf("%d blobs, want %d", len(have), len(want))
			}
			for i := range want {
				if !bytes.Equal(want[i].Data, have[i].Data) || want[i].Name != have[i].Name {
					t.Errorf("blob %d = %q %q, want %q %q", i, have[i].Name, have[i].Data, want[i].Name, want[i].Data)
				}
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name   string
		data   []byte
		binary bool
	}{
		{"garbage text", []byte("not json"), false},
		{"unknown type", []byte(`{"t":"bogus"}`), false},
		{"missing body", []byte(`{"t":"hello"}`), false},
		{"short binary", []byte{0, 0}, true},
		{"header overruns", []byte{0, 0, 1, 0, '{', '}'}, true},
		{"blob overruns", append([]byte{0, 0, 0, 59}, []byte(`{"t":"checkpoint","checkpoint":{"attempt":1,"state":{"size":9}}}`)[:59]...), true},
		{"leftover payload", append(append([]byte{0, 0, 0, 37}, []byte(`{"t":"heartbeat","heartbeat":{"free":1}`)[:37]...), 'x'), true},
		{"negative size", []byte(`{"t":"checkpoint","checkpoint":{"attempt":1,"state":{"size":-1}}}`), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.data, tc.binary); err == nil {
				t.Fatal("Decode accepted a malformed frame")
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, fr := range []Frame{
		{Type: TypeHeartbeat, Heartbeat: &Heartbeat{Running: []Progress{{Attempt: 1, Fraction: .5}}}},
		{Type: TypeResult, Results: []Result{{Attempt: 3, Outputs: []Blob{{Name: "stdout", Data: []byte("42\n")}}}}},
	} {
		data, bin, _ := Encode(&fr)
		f.Add(data, bin)
	}
	f.Fuzz(func(t *testing.T, data []byte, bin bool) {
		fr, err := Decode(data, bin)
		if err != nil {
			return
		}
		// Whatever decodes must encode and decode again to the same blobs.
		out, bin2, err := Encode(fr)
		if err != nil {
			t.Fatal(err)
		}
		fr2, err := Decode(out, bin2)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		a, b := fr.blobs(), fr2.blobs()
		if len(a) != len(b) {
			t.Fatalf("blob count changed %d -> %d", len(a), len(b))
		}
		for i := range a {
			if !bytes.Equal(a[i].Data, b[i].Data) {
				t.Fatalf("blob %d changed", i)
			}
		}
	})
}

// A worker's queue is bounded per slot and in all.
func TestQueueLimit(t *testing.T) {
	for _, tc := range []struct{ slots, want int }{{1, 32}, {2, 64}, {32, 1024}, {256, 1024}} {
		if got := QueueLimit(tc.slots); got != tc.want {
			t.Errorf("QueueLimit(%d) = %d, want %d", tc.slots, got, tc.want)
		}
	}
}
