package protocol

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/cyclepool/cyclepool/internal/fill"
)

// fastSamples are assign, ack, result and heartbeat frames as json.Marshal writes them, with
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
		hb := &Frame{Type: TypeHeartbeat, Heartbeat: &Heartbeat{Free: i % 4}}
		for j := range rng.IntN(3) {
			hb.Heartbeat.Running = append(hb.Heartbeat.Running, Progress{Attempt: rng.Int64(), Fraction: float64(j) / 3})
		}
		if i%2 == 0 {
			q := i
			hb.Heartbeat.Queue = &q
		}
		if i%3 != 0 {
			b, mb, rtt := rng.Float64(), float64(i)*1e-7, 1e300*rng.Float64()
			hb.Heartbeat.Device = &Device{Battery: &b, Charging: pick(), Connection: "4g", DownlinkMbps: &mb, RTTMillis: &rtt,
				SaveData: "no", Online: "yes", Visibility: pick(), Cores: i, UserAgent: pick(), Paused: i%5 == 0, PausedBecause: pick()}
		}
		data, _ = json.Marshal(hb)
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
		[]byte(`{"t":"result","results":[{"log":null}]}`), []byte(`{"t":"result","results":[{"duration_ms":1e3}]}`),
		[]byte(`{"t":"heartbeat","heartbeat":{"running":[{"attempt":1,"fraction":0.5e-3}],"free":1,"queue":null,"device":null}}`),
		[]byte(`{"t":"heartbeat","heartbeat":{"running":null,"device":{"battery":1E+2,"cores":2.0}}}`),
		[]byte(`{"t":"heartbeat","heartbeat":{"device":{"battery":-0,"rtt_ms":1e400,"memory_gib":.5}}}`),
		[]byte(`{"t":"heartbeat","heartbeat":{"device":{"battery":01.5,"downlink_mbps":1.}}}`),
		[]byte(`{"t":"heartbeat","heartbeat":null}`), []byte(`{"t":"heartbeat","heartbeat":{"free":1,"free":2}}`),
		[]byte(`{"t":"heartbeat","heartbeat":{"device":{"paused":null,"charging":null}}}`))
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
		{Type: TypeHeartbeat, Heartbeat: &Heartbeat{Running: []Progress{}}},
		{Type: TypeHeartbeat, Heartbeat: &Heartbeat{Running: []Progress{{Attempt: 3, Fraction: 0.25}}, Free: 1, Queue: new(int),
			Device: &Device{Battery: new(0.87), Charging: "no", Connection: "4g", DownlinkMbps: new(9.5), RTTMillis: new(50.0),
				SaveData: "no", Online: "yes", Visibility: "visible", Cores: 8, MemoryGiB: new(8.0),
				UserAgent: "Mozilla/5.0 (Linux; Android 14) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Mobile Safari/537.36",
				Paused:    true, PausedBecause: "on battery"}}},
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

// Whatever encodeFast writes, json.Marshal writes the same.
func checkEncodeFast(t *testing.T, f *Frame) bool {
	got, ok := encodeFast(f)
	if !ok {
		return false
	}
	want, err := json.Marshal(f)
	if err != nil {
		t.Fatalf("encodeFast wrote %s for a frame json.Marshal refuses: %v", got, err)
	}
	if string(got) != string(want) {
		t.Fatalf("encodeFast:   %s\njson.Marshal: %s", got, want)
	}
	return true
}

func TestEncodeFastMatchesJSON(t *testing.T) {
	fast := 0
	for _, data := range fastSamples() {
		var f Frame
		if err := json.Unmarshal(data, &f); err != nil {
			continue
		}
		if checkEncodeFast(t, &f) {
			fast++
		}
	}
	if fast < 50 { // most samples hold strings that encoding/json escapes
		t.Errorf("only %d samples took the fast path", fast)
	}
	// What the server and a worker send most takes the fast path; other
	// frames, and strings that encoding/json escapes, do not.
	for _, tc := range []struct {
		f    *Frame
		fast bool
	}{
		{&Frame{Type: TypeAssign, Assign: []Assign{{Attempt: 7, Task: "0b7c7a5e-4a3b-4c1a-9d7e-1b2c3d4e5f60/t1", Module: "sha256:5d2c",
			Seed: 1 << 63, Args: []string{"0", "3000000"}, Inputs: []Blob{{Name: "a", Size: 3}}, Restore: Blob{Size: 5},
			Limits: Limits{MemoryPages: 4096, WallMS: 3600000, OutputBytes: 64 << 20, LogBytes: 1 << 20}, Priority: "batch"}}}, true},
		{&Frame{Type: TypeAck, Acks: []Ack{{Attempt: 1, Of: AckResult, OK: true}, {Attempt: 2, Of: AckCheckpoint, Seq: 3},
			{Attempt: 3, Of: AckFail, Retry: true, Error: "not committed: server error; send it again"}}}, true},
		{&Frame{Type: TypeResult, Results: []Result{{Attempt: 9, Outputs: []Blob{{Name: "stdout", Size: 12}}, DurationMS: 41}}}, true},
		{&Frame{Type: TypeResult, Results: []Result{{Attempt: 9, Outputs: []Blob{{Name: "a<b", Size: 1}}}}}, false},
		{&Frame{Type: TypeAssign, Assign: []Assign{{Args: []string{`q"uote`}}}}, false},
		{&Frame{Type: TypeAck, Acks: []Ack{{Error: "ünïcode"}}}, false},
		{&Frame{Type: TypeResult, Results: []Result{{}}, Acks: []Ack{{}}}, false},
		{&Frame{Type: TypeHeartbeat, Heartbeat: &Heartbeat{}}, false},
		{&Frame{Type: TypeAck}, false},
	} {
		if got := checkEncodeFast(t, tc.f); got != tc.fast {
			data, _ := json.Marshal(tc.f)
			t.Errorf("%s: fast path %v, want %v", data, got, tc.fast)
		}
	}
}

// FuzzEncodeFast builds frames from fuzzed strings and numbers: whatever
// encodeFast writes, json.Marshal writes the same.
func FuzzEncodeFast(f *testing.F) {
	f.Add("t1", "sha256:x", "stdout", int64(1), uint64(2), 3, true)
	f.Add("a<b", "", "ü", int64(-1), uint64(1<<63), 0, false)
	f.Fuzz(func(t *testing.T, s1, s2, s3 string, n int64, u uint64, k int, b bool) {
		var args []string
		if b {
			args = []string{s1, s3}
		}
		for _, fr := range []*Frame{
			{Type: TypeAssign, Assign: []Assign{{Attempt: n, Task: s1, Module: s2, Args: args, Seed: u, Stdin: Blob{Name: s3, Size: k},
				Inputs: []Blob{{Name: s1}}, Limits: Limits{MemoryPages: uint32(u), WallMS: n, OutputBytes: -n, LogBytes: int64(k)},
				CkptMS: n, Priority: s2}}},
			{Type: TypeResult, Results: []Result{{Attempt: n, Outputs: []Blob{{Name: s3, Size: k}}, Log: Blob{Name: s1}, DurationMS: n}}},
			{Type: s1, Acks: []Ack{{Attempt: n, Of: s2, Seq: k, OK: b, Retry: !b, Error: s3}}},
		} {
			checkEncodeFast(t, fr)
		}
	})
}

// BenchmarkEncode encodes a frame of 64 assignments and one of 8 results,
// with the fast encoder (Encode) and with json.Marshal.
func BenchmarkEncode(b *testing.B) {
	as := make([]Assign, 64)
	for i := range as {
		as[i] = Assign{Attempt: int64(1000 + i), Task: "0b7c7a5e-4a3b-4c1a-9d7e-1b2c3d4e5f60/t1", Module: "sha256:5d2c",
			Args: []string{}, Inputs: []Blob{}, Limits: Limits{MemoryPages: 4096, WallMS: 3600000, OutputBytes: 64 << 20, LogBytes: 1 << 20},
			Priority: "batch", Seed: uint64(i) << 40}
	}
	rs := make([]Result, 8)
	for i := range rs {
		rs[i] = Result{Attempt: int64(1000 + i), Outputs: []Blob{{Name: "stdout"}}, DurationMS: 1}
	}
	for _, f := range []*Frame{{Type: TypeAssign, Assign: as}, {Type: TypeResult, Results: rs}} {
		b.Run(f.Type+"/fast", func(b *testing.B) {
			for range b.N {
				if _, ok := encodeFast(f); !ok {
					b.Fatal("not on the fast path")
				}
			}
		})
		b.Run(f.Type+"/json", func(b *testing.B) {
			for range b.N {
				if _, err := json.Marshal(f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Every field of an assignment, a result and an ack is written by the fast
// encoder as json.Marshal writes it: a field added to them without being
// taught to encodeFast fails this.
func TestEncodeFastWritesEveryField(t *testing.T) {
	var a Assign
	var r Result
	var k Ack
	for _, p := range []any{&a, &r, &k} {
		if err := fill.Value(reflect.ValueOf(p).Elem()); err != nil {
			t.Fatalf("%v (teach fill and encodeFast)", err)
		}
	}
	for _, f := range []*Frame{{Type: TypeAssign, Assign: []Assign{a}}, {Type: TypeResult, Results: []Result{r}}, {Type: TypeAck, Acks: []Ack{k}}} {
		if !checkEncodeFast(t, f) {
			data, _ := json.Marshal(f)
			t.Errorf("%s: not on the fast path", data)
		}
	}
}
