package protocol

// The hot frames of a worker: an assign frame of 20 attempts, the acks of
// 20 results, a result frame of 20 (run them as WebAssembly too:
// GOOS=js GOARCH=wasm go test -exec=$(go env GOROOT)/lib/wasm/go_js_wasm_exec).

import "testing"

func benchFrames() (assign, result, ack []byte) {
	f := &Frame{Type: TypeAssign}
	for i := range 20 {
		f.Assign = append(f.Assign, Assign{Attempt: int64(1000 + i), Task: "0b7c7a5e-4a3b-4c1a-9d7e-1b2c3d4e5f60/t1234", Module: "sha256:5d2c6e0c8d8a6a2e8f4e1b7a1c6f4b8e0a3d1c9b7e5f3a1d2c4b6a8e0f1d3c5b",
			Seed: 1234567890123, Limits: Limits{MemoryPages: 4096, WallMS: 3600000, OutputBytes: 64 << 20, LogBytes: 1 << 20}, Priority: "interactive"})
	}
	assign, _, _ = Encode(f)
	r := &Frame{Type: TypeResult}
	a := &Frame{Type: TypeAck}
	for i := range 20 {
		r.Results = append(r.Results, Result{Attempt: int64(1000 + i), Outputs: []Blob{{Name: "stdout"}}, DurationMS: 1})
		a.Acks = append(a.Acks, Ack{Attempt: int64(1000 + i), Of: AckResult, OK: true})
	}
	result, _, _ = Encode(r)
	ack, _, _ = Encode(a)
	return
}

func BenchmarkDecodeAssign20(b *testing.B) {
	as, _, _ := benchFrames()
	for b.Loop() {
		if _, err := Decode(as, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeAck20(b *testing.B) {
	_, _, ack := benchFrames()
	for b.Loop() {
		if _, err := Decode(ack, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeResult20(b *testing.B) {
	r := &Frame{Type: TypeResult}
	for i := range 20 {
		r.Results = append(r.Results, Result{Attempt: int64(1000 + i), Outputs: []Blob{{Name: "stdout"}}, DurationMS: 1})
	}
	for b.Loop() {
		if _, _, err := Encode(r); err != nil {
			b.Fatal(err)
		}
	}
}
