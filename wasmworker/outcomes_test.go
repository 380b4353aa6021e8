package wasmworker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// mergeOutcomes packs outcomes into few frames, each of which stays within
// the protocol's bounds however many outputs or how long a message it
// carries, and keeps every outcome, in order.
func TestMergeOutcomes(t *testing.T) {
	result := func(id int64, outputs int, name string) *protocol.Frame {
		r := protocol.Result{Attempt: id, Log: protocol.Blob{Data: []byte("log")}}
		for i := range outputs {
			r.Outputs = append(r.Outputs, protocol.Blob{Name: fmt.Sprintf("%s-%d", name, i), Data: []byte{1}})
		}
		return &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{r}}
	}
	fail := func(id int64, msg string) *protocol.Frame {
		return &protocol.Frame{Type: protocol.TypeFail, Fails: []protocol.Fail{{Attempt: id, Reason: protocol.ReasonExit, Message: msg}}}
	}
	many := func(n int, f func(i int64) *protocol.Frame) []*protocol.Frame {
		var fs []*protocol.Frame
		for i := range n {
			fs = append(fs, f(int64(i+1)))
		}
		return fs
	}
	tests := []struct {
		name   string
		in     []*protocol.Frame
		frames int // 0: do not check the count
	}{
		{"one alone", many(1, func(i int64) *protocol.Frame { return result(i, 1, "out") }), 1},
		{"small results", many(100, func(i int64) *protocol.Frame { return result(i, 1, "out") }), 2},
		{"results and fails", append(many(10, func(i int64) *protocol.Frame { return result(i, 1, "out") }),
			many(10, func(i int64) *protocol.Frame { return fail(100+i, "exit code 1") })...), 2},
		{"many outputs with long names", many(64, func(i int64) *protocol.Frame {
			return result(i, 300, strings.Repeat("\x01", 200))
		}), 0},
		{"long messages all escaped", many(64, func(i int64) *protocol.Frame {
			return fail(i, strings.Repeat("\"\x02", 2048))
		}), 0},
		{"other frames pass through", []*protocol.Frame{result(1, 1, "a"), {Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{}}, result(2, 1, "b")}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := mergeOutcomes(tc.in)
			if tc.frames > 0 && len(out) != tc.frames {
				t.Errorf("%d frames, want %d", len(out), tc.frames)
			}
			var ids []int64
			for _, f := range out {
				data, bin, err := protocol.Encode(f)
				if err != nil {
					t.Fatal(err)
				}
				back, err := protocol.Decode(data, bin)
				if err != nil {
					t.Fatalf("a merged %s frame of %d results and %d fails does not decode: %v", f.Type, len(f.Results), len(f.Fails), err)
				}
				for _, r := range back.Results {
					ids = append(ids, r.Attempt)
				}
				for _, fl := range back.Fails {
					ids = append(ids, fl.Attempt)
				}
			}
			var want []int64
			for _, f := range tc.in {
				for _, r := range f.Results {
					want = append(want, r.Attempt)
				}
				for _, fl := range f.Fails {
					want = append(want, fl.Attempt)
				}
			}
			if fmt.Sprint(ids) != fmt.Sprint(want) {
				t.Errorf("outcomes after merging: %v, want %v", ids, want)
			}
		})
	}
}

// sendOn sends on the connection it was given, never on a later one: an
// outcome taken from the outbox while one connection was current, and
// sent after it ended, stays pending for the next connection's resend
// rather than going twice. A bufferingConn's frames go through direct.
func TestSendOn(t *testing.T) {
	w := &Worker{}
	f := &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{Attempt: 7}}}
	ended := make(chan struct{})
	close(ended)
	tests := []struct {
		name     string
		s        func(out chan outMsg, wrote *int) sender
		deadline time.Time
		sent     bool
		queued   int
		direct   int
	}{
		{"disconnected", func(chan outMsg, *int) sender { return sender{} }, time.Time{}, false, 0, 0},
		{"queued", func(out chan outMsg, _ *int) sender { return sender{out: out, done: make(chan struct{})} }, time.Time{}, true, 1, 0},
		{"connection ended", func(out chan outMsg, _ *int) sender { return sender{out: out, done: ended} }, time.Time{}, false, 0, 0},
		{"direct", func(out chan outMsg, wrote *int) sender {
			return sender{out: out, done: make(chan struct{}), direct: func(_ time.Time, m outMsg) bool { *wrote++; return len(m.data) > 0 }}
		}, time.Time{}, true, 0, 1},
		{"direct, connection ended", func(out chan outMsg, wrote *int) sender {
			return sender{out: out, done: ended, direct: func(time.Time, outMsg) bool { *wrote++; return true }}
		}, time.Time{}, false, 0, 0},
		{"queue full past the deadline", func(chan outMsg, *int) sender {
			return sender{out: make(chan outMsg), done: make(chan struct{})}
		}, time.Now().Add(-time.Second), false, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make(chan outMsg, 4)
			wrote := 0
			if got := w.sendOn(tt.s(out, &wrote), f, tt.deadline); got != tt.sent {
				t.Errorf("sendOn = %v, want %v", got, tt.sent)
			}
			if len(out) != tt.queued || wrote != tt.direct {
				t.Errorf("queued %d and wrote %d directly, want %d and %d", len(out), wrote, tt.queued, tt.direct)
			}
		})
	}
}
