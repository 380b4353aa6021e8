package protocol

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

// fastSamples are assign, ack and result frames as json.Marshal writes them, with
// the oddities a task can bring (names and arguments to escape, empty and
// absent lists, extreme numbers).
func fastSamples() [][]byte {
	strs := []string{"", "t1", "a b", `q"uote`, `back\slash`, "<html>&", "ünïcode", "tab\there", "\x7f", "ctl\x01"}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return strs[rng.IntN(len(strs))] }
	var out [][]byte
	for i := range 200 {
		f := &Frame{Type: TypeAssign}
		for range 1 + rng.IntN(3) {
			a := Assign{Attempt: rng.Int64() - rng.Int64(), Task: "wf/" + pick(), Module: "sha256:" + pick(), Seed: rng.Uint64(),
				Limits: Limits{MemoryPages: rng.Uint32(), WallMS: rng.Int64(), OutputBytes: -rng.Int64(), LogBytes: int64(i)},
				CkptMS: int64(i), Priority: pick(), Stdin: Blob{Name: pick(), Size: i}, Restore: Blob{Size: 3}}
			switch i % 3 {
			case 1:
				a.Args, a.Inputs = []string{}, []Blob{}
			case 2:
				a.Args = []string{pick(), pick()}
				a.Inputs = []Blob{{Name: pick(), Size: 1}, {Name: "x"}}
			}
			f.Assign = append(f.Assign, a)
		}
		data, _ := json.Marshal(f)
		out = append(out, data)
		k := &Frame{Type: TypeAck}
		for j := range 1 + rng.IntN(3) {
			k.Acks = append(k.Acks, Ack{Attempt: rng.Int64(), Of: AckResult, Seq: j, OK: j%2 == 0, Retry: j == 1, Error: pick()})
		}
		data, _ = json.Marshal(k)
		out = append(out, data)
		r := &Frame{Type: TypeResult}
		for j := range 1 + rng.IntN(3) {
			res := Result{Attempt: rng.Int64() - rng.Int64(), Log: Blob{Name: pick(), Size: j}, DurationMS: rng.Int64()}
			switch (i + j) % 3 {
			case 1:
				res.Outputs = []Blob{}
			case 2:
				res.Outputs = []Blob{{Name: "stdout", Size: i}, {Name: pick(), Size: 1}}
			}
			r.Results = append(r.Results, res)
		}
		data, _ = json.Marshal(r)
		out = append(out, data)
	}
	out = append(out, []byte(` { "t" : "ack" , "acks" : [ { "attempt" : 1 , "of" : "fail" , "ok" : true } ] } `),
		[]byte(`{"t":"ack","acks":[]}`), []byte(`{"t":"assign"}`), []byte(`{"t":"ack","acks":null}`),
		[]byte(`{"t":"ack","acks":[{"attempt":1,"attempt":2}]}`), []byte(`{"t":"ack","acks":[{"Attempt":1}]}`),
		[]byte(`{"t":"ack","acks":[{"attempt":1.0}]}`), []byte(`{"t":"ack","acks":[{"attempt":01}]}`),
		[]byte(`{"t":"ack","acks":[{"attempt":-0}]}`), []byte(`{"t":"ack","acks":[{"seq":99999999999999999999}]}`),
		[]byte(`{"t":"assign","assign":[{"seed":-1}]}`), []byte(`{"t":"assign","assign":[{"limits":{"memory_pages":4294967296}}]}`),
		[]byte(`{"t":"assign","assign":[{"args":["a",1]}]}`), []byte(`{"t":"ack","acks":[{"ok":null}]} x`),
		[]byte(`{"t":"result","results":[{"attempt":1,"outputs":null,"log":{"size":0},"duration_ms":2}]}`),
		[]byte(`{"t":"result","results":[{"attempt":1,"outputs":[{"name":"a","size":1,"data":"x"}]}]}`),
		[]byte(`{"t":"result","results":[{"attempt":1,"fails":[]}]}`), []byte(`{"t":"result","fails":[{"attempt":1}]}`),
		[]byte(`{"t":"result","results":[{"log":null}]}`), []byte(`{"t":"result","results":[{"duration_ms":1e3}]}`))
	return out
}

// Whatever decodeFast accepts, encoding/json decodes to the same frame.
func checkFast(t *testing.T, data []byte) {
	f, ok := decodeFast(data)
	if !ok {
		return
	}
	var want Frame
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("decodeFast accepted %s, which encoding/json refuses: %v", data, err)
	}
	if !reflect.DeepEqual(f, &want) {
		t.Fatalf("decodeFast(%s)\n= %+v\nencoding/json: %+v", data, f, &want)
	}
}

func TestDecodeFastMatchesJSON(t *testing.T) {
	fast := 0
	for _, data := range fastSamples() {
		checkFast(t, data)
		if _, ok := decodeFast(data); ok {
			fast++
		}
		// Every cut and every changed byte too.
		for i := 0; i < len(data); i += 7 {
			checkFast(t, data[:i])
			m := append([]byte(nil), data...)
			for _, c := range []byte{'"', '1', '}', ' ', 'n', '\\'} {
				m[i] = c
				checkFast(t, m)
			}
		}
	}
	if fast < 30 {
		t.Fatalf("only %d samples took the fast path", fast)
	}
	// What the server sends, and the results a worker sends, take the fast
	// path.
	for _, f := range []*Frame{
		{Type: TypeAssign, Assign: []Assign{{Attempt: 7, Task: "0b7c7a5e-4a3b-4c1a-9d7e-1b2c3d4e5f60/t1", Module: "sha256:5d2c", Seed: 1 << 63,
			Args: []string{"0", "3000000"}, Inputs: []Blob{{Name: "a", Size: 3}}, Restore: Blob{Size: 5},
			Limits: Limits{MemoryPages: 4096, WallMS: 3600000, OutputBytes: 64 << 20, LogBytes: 1 << 20}, Priority: "batch"}}},
		{Type: TypeAck, Acks: []Ack{{Attempt: 1, Of: AckResult, OK: true}, {Attempt: 2, Of: AckCheckpoint, Seq: 3},
			{Attempt: 3, Of: AckFail, Retry: true, Error: "not committed: server error; send it again"}}},
		{Type: TypeResult, Results: []Result{{Attempt: 9, Outputs: []Blob{{Name: "stdout", Size: 12}, {Name: "tile.png", Size: 4096}},
			Log: Blob{Size: 3}, DurationMS: 41}, {Attempt: 10, Outputs: []Blob{}, DurationMS: 1}}},
	} {
		data, _, _ := Encode(f)
		if _, ok := decodeFast(data); !ok {
			t.Errorf("%s: not on the fast path", data)
		}
		checkFast(t, data)
	}
}

func FuzzDecodeFast(f *testing.F) {
	for _, data := range fastSamples()[:20] {
		f.Add(data)
	}
	f.Fuzz(checkFast)
}
