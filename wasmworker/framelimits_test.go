//go:build !js

package wasmworker

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// limitServer is a fake server that, like the real one, closes the
// connection on a frame over its bounds (maxFrame, 0 for the default, and
// protocol.MaxHeaderBytes); it welcomes every connection, sends first on
// the first one only, acknowledges outcomes and checkpoints, and passes on
// every frame it could read.
type limitServer struct {
	url   string
	conns atomic.Int32 // connections made
	bad   atomic.Int32 // frames over its bounds
	got   chan *protocol.Frame
	// results and fails are the outcomes outcome read, by attempt.
	results map[int64]*protocol.Result
	fails   map[int64]*protocol.Fail
}

func newLimitServer(t *testing.T, maxFrame int, first ...*protocol.Frame) *limitServer {
	t.Helper()
	s := &limitServer{got: make(chan *protocol.Frame, 1024), results: map[int64]*protocol.Result{}, fails: map[int64]*protocol.Fail{}}
	limit := maxFrame
	if limit <= 0 {
		limit = protocol.DefaultMaxFrameBytes
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ws.SetReadLimit(int64(limit))
		n := s.conns.Add(1)
		ctx := r.Context()
		send := func(fs ...*protocol.Frame) error {
			for _, f := range fs {
				data, bin, err := protocol.Encode(f)
				if err != nil {
					return err
				}
				typ := websocket.MessageText
				if bin {
					typ = websocket.MessageBinary
				}
				if err := ws.Write(ctx, typ, data); err != nil {
					return err
				}
			}
			return nil
		}
		if _, _, err := ws.Read(ctx); err != nil { // hello
			return
		}
		if send(&protocol.Frame{Type: protocol.TypeWelcome, Welcome: &protocol.Welcome{WorkerID: "w",
			HeartbeatMS: 60000, LeaseMS: 60000, MaxFrameBytes: maxFrame}}) != nil {
			return
		}
		if n == 1 && send(first...) != nil {
			return
		}
		for {
			typ, data, err := ws.Read(ctx)
			if err != nil {
				if strings.Contains(err.Error(), "read limited") {
					s.bad.Add(1)
				}
				return
			}
			f, err := protocol.Decode(data, typ == websocket.MessageBinary)
			if err != nil {
				s.bad.Add(1)
				ws.Close(websocket.StatusPolicyViolation, "bad frame")
				return
			}
			s.got <- f
			ack := &protocol.Frame{Type: protocol.TypeAck}
			for _, r := range f.Results {
				ack.Acks = append(ack.Acks, protocol.Ack{Attempt: r.Attempt, Of: protocol.AckResult, OK: true})
			}
			for _, fl := range f.Fails {
				ack.Acks = append(ack.Acks, protocol.Ack{Attempt: fl.Attempt, Of: protocol.AckFail, OK: true})
			}
			if c := f.Checkpoint; c != nil {
				ack.Acks = append(ack.Acks, protocol.Ack{Attempt: c.Attempt, Of: protocol.AckCheckpoint, Seq: c.Seq, OK: true})
			}
			if len(ack.Acks) > 0 && send(ack) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// outcome waits for the outcome of attempt, result or failure (from the
// test's goroutine).
func (s *limitServer) outcome(t *testing.T, attempt int64) (res *protocol.Result, fail *protocol.Fail) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		if r, f := s.results[attempt], s.fails[attempt]; r != nil || f != nil {
			return r, f
		}
		select {
		case f := <-s.got:
			for i := range f.Results {
				s.results[f.Results[i].Attempt] = &f.Results[i]
			}
			for i := range f.Fails {
				s.fails[f.Fails[i].Attempt] = &f.Fails[i]
			}
		case <-timeout:
			t.Fatalf("no outcome of attempt %d after 20 s; %d connections, %d frames over the bounds",
				attempt, s.conns.Load(), s.bad.Load())
			return nil, nil
		}
	}
}

// runWorker runs a worker of one slot with runner against s until the test
// ends.
func runWorker(t *testing.T, s *limitServer, runner Runner) *Worker {
	w := New(Config{Servers: []string{s.url}, Slots: 1, Kind: protocol.KindHeadless, Runner: runner,
		Logger: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// checkOneConnection fails the test unless the worker connected once and
// sent nothing over the server's bounds.
func (s *limitServer) checkOneConnection(t *testing.T) {
	t.Helper()
	if n, bad := s.conns.Load(), s.bad.Load(); n != 1 || bad != 0 {
		t.Errorf("%d connections, %d frames over the server's bounds; want 1 and 0", n, bad)
	}
}

// A result whose output names make a header over protocol.MaxHeaderBytes
// (60,000 files under /out made 5.4 MB) fails at the worker with
// limit_output, naming that limit, instead of making the server close the
// connection after every reconnection while the attempt's lease is renewed.
func TestResultOverTheHeaderLimitFailsAtTheWorker(t *testing.T) {
	s := newLimitServer(t, 0, assign(1, 1))
	runWorker(t, s, runnerFunc(func(ctx context.Context, job *Job) *Outcome {
		outs := []protocol.Blob{{Name: "stdout"}}
		for i := range 60000 {
			outs = append(outs, protocol.Blob{Name: fmt.Sprintf("f%05d", i), Data: []byte("x")})
		}
		return &Outcome{Outputs: outs, Log: []byte("the log"), Duration: time.Millisecond}
	}))
	res, fail := s.outcome(t, 1)
	if res != nil {
		t.Fatalf("a result of %d outputs arrived", len(res.Outputs))
	}
	if fail.Reason != protocol.ReasonOutput || !strings.Contains(fail.Message, "1048576 bytes a frame header") {
		t.Errorf("fail %s: %q, want %s naming the header limit", fail.Reason, fail.Message, protocol.ReasonOutput)
	}
	if string(fail.Log.Data) != "the log" {
		t.Errorf("log %q, want the task's", fail.Log.Data)
	}
	s.checkOneConnection(t)
}

// A result larger than the frame bound the server announced fails at the
// worker with limit_output, naming that bound.
func TestResultOverTheFrameLimitFailsAtTheWorker(t *testing.T) {
	s := newLimitServer(t, 1<<20, assign(1, 2))
	runWorker(t, s, runnerFunc(func(ctx context.Context, job *Job) *Outcome {
		size := 2 << 20
		if job.Assign.Attempt == 2 {
			size = 1000 // well within: goes as a result
		}
		return &Outcome{Outputs: []protocol.Blob{{Name: "stdout", Data: make([]byte, size)}}, Duration: time.Millisecond}
	}))
	res, fail := s.outcome(t, 1)
	if res != nil {
		t.Fatalf("a result of %d bytes arrived", len(res.Outputs[0].Data))
	}
	if fail.Reason != protocol.ReasonOutput || !strings.Contains(fail.Message, "max_frame_bytes") || !strings.Contains(fail.Message, "1048576") {
		t.Errorf("fail %s: %q, want %s naming max_frame_bytes", fail.Reason, fail.Message, protocol.ReasonOutput)
	}
	if res, fail := s.outcome(t, 2); res == nil {
		t.Errorf("a small result failed: %s: %s", fail.Reason, fail.Message)
	}
	s.checkOneConnection(t)
}

// A checkpoint larger than a frame may carry is refused at the worker,
// without being sent: a 100 MiB one made the worker reconnect 17 times in
// a minute before the task heard it was refused.
func TestCheckpointOverTheFrameLimitIsRefusedAtOnce(t *testing.T) {
	s := newLimitServer(t, 0, assign(1, 1))
	errc := make(chan error, 2)
	runWorker(t, s, runnerFunc(func(ctx context.Context, job *Job) *Outcome {
		errc <- job.Host.Checkpoint(ctx, make([]byte, 100<<20))
		errc <- job.Host.Checkpoint(ctx, []byte("small")) // still saved
		return &Outcome{Outputs: []protocol.Blob{{Name: "stdout"}}, Duration: time.Millisecond}
	}))
	err := <-errc
	if err == nil || !strings.Contains(err.Error(), "max_frame_bytes") {
		t.Errorf("Checkpoint of 100 MiB: %v, want refused naming max_frame_bytes", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Checkpoint of 5 bytes: %v", err)
	}
	if res, fail := s.outcome(t, 1); res == nil {
		t.Fatalf("attempt failed: %s: %s", fail.Reason, fail.Message)
	}
	s.checkOneConnection(t)
}

// An assignment whose arguments make a frame header over
// protocol.MaxHeaderBytes (2,000 of 1,000 bytes) fails at once with a
// message that says so, and the attempt that came in the same frame runs:
// the worker used to drop the connection, again after each reconnection
// and at each worker, until the task's attempts were lost.
func TestAssignOverTheHeaderLimitFailsTheAttempt(t *testing.T) {
	f := assign(1, 2)
	for range 2000 {
		f.Assign[0].Args = append(f.Assign[0].Args, strings.Repeat("a", 1000))
	}
	f.Assign[1].Stdin.Data = []byte("stdin of 2")
	f.Assign[1].Inputs = []protocol.Blob{{Name: "in", Data: []byte("input of 2")}}
	s := newLimitServer(t, 0, f)
	ran := make(chan *protocol.Assign, 2)
	w := runWorker(t, s, runnerFunc(func(ctx context.Context, job *Job) *Outcome {
		ran <- job.Assign
		return &Outcome{Outputs: []protocol.Blob{{Name: "stdout"}}, Duration: time.Millisecond}
	}))
	res, fail := s.outcome(t, 1)
	if res != nil {
		t.Fatal("the oversized assignment ran")
	}
	if fail.Reason != protocol.ReasonModule || !strings.Contains(fail.Message, "cannot be delivered") ||
		!strings.Contains(fail.Message, "1048576 bytes a frame header") {
		t.Errorf("fail %s: %q, want %s saying the header is over its limit", fail.Reason, fail.Message, protocol.ReasonModule)
	}
	if res, fail := s.outcome(t, 2); res == nil {
		t.Fatalf("attempt 2 failed: %s: %s", fail.Reason, fail.Message)
	}
	a := <-ran
	if a.Attempt != 2 || string(a.Stdin.Data) != "stdin of 2" || len(a.Inputs) != 1 || string(a.Inputs[0].Data) != "input of 2" {
		t.Errorf("ran attempt %d with stdin %q, inputs %v", a.Attempt, a.Stdin.Data, a.Inputs)
	}
	if st := w.Stats(); st.Failed != 1 || st.Done != 1 {
		t.Errorf("stats %+v, want 1 failed and 1 done", st)
	}
	s.checkOneConnection(t)
}
