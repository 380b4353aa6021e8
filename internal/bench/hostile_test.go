package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"runtime"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/workflow"
)

// The forger's streamed result frame is one the server decodes as a result
// for that attempt, with the payload as its stdout.
func TestWriteResultFrame(t *testing.T) {
	payload := bytes.Repeat([]byte("forged"), 1000)
	var buf bytes.Buffer
	if err := writeResultFrame(&buf, 1<<40+7, payload); err != nil {
		t.Fatal(err)
	}
	f, err := protocol.Decode(buf.Bytes(), true)
	if err != nil {
		t.Fatal(err)
	}
	if f.Type != protocol.TypeResult || len(f.Results) != 1 {
		t.Fatalf("decoded %s frame with %d results, want one result", f.Type, len(f.Results))
	}
	r := f.Results[0]
	if r.Attempt != 1<<40+7 || len(r.Outputs) != 1 || r.Outputs[0].Name != "stdout" ||
		!bytes.Equal(r.Outputs[0].Data, payload) || len(r.Log.Data) != 0 {
		t.Errorf("decoded result for attempt %d with outputs %d, want attempt %d with its payload as stdout",
			r.Attempt, len(r.Outputs), int64(1<<40+7))
	}
}

// Every flood frame breaks a rule of the protocol: a hello over 64 KiB, a
// hello out of bounds, or a message that does not decode.
func TestFloodFramesAreInvalid(t *testing.T) {
	for i, fr := range floodFrames() {
		f, err := protocol.Decode(fr.data, fr.binary)
		switch {
		case err != nil:
		case f.Type != protocol.TypeHello:
			t.Errorf("flood frame %d decodes as a %s frame", i, f.Type)
		case len(fr.data) <= 64<<10 && f.Hello.Slots <= 256:
			t.Errorf("flood frame %d is a hello of %d bytes and %d slots, within the bounds", i, len(fr.data), f.Hello.Slots)
		}
	}
}

// The honest workflow is one the server accepts.
func TestHostileWorkflowParses(t *testing.T) {
	b := &bench{}
	data := b.hostileWorkflow("hostile", "sha256:"+string(bytes.Repeat([]byte("ab"), 32)), 2000, 10)
	spec, err := workflow.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Tasks []struct {
			Args []string `json:"args"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	if len(spec.Tasks) != 2000 || len(raw.Tasks) != 2000 || len(raw.Tasks[0].Args) != 2 || raw.Tasks[0].Args[1] != "10" {
		t.Errorf("%d tasks (%+v first), want 2000 of one 10 ms step", len(spec.Tasks), raw.Tasks[0])
	}
}

// The peak of this process's memory is at least what it uses now.
func TestSamplePeak(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	now, err := procStatusKiB(os.Getpid(), "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := procStatusKiB(os.Getpid(), "NoSuchField"); err == nil {
		t.Error("procStatusKiB found a field /proc/PID/status does not have")
	}
	if peak := samplePeak(os.Getpid()).stop(); peak < now/2 {
		t.Errorf("peak %d KiB, with %d KiB resident before", peak, now)
	}
}
