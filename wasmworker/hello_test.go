//go:build !js

package wasmworker

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// A hello says its list of attempts is complete (running_complete) only
// when the process was welcomed under its identity before and cut nothing
// from the list: the server then ends the earlier attempts it does not
// list charged to nobody, as assignments that never reached the worker.
// A process resuming an identity from an earlier run (Config.ID) cannot
// know what that run held.
func TestHelloSaysWhetherItListsEverything(t *testing.T) {
	for _, tc := range []struct {
		name   string
		id     string                     // Config.ID
		first  []*protocol.Frame          // what the first connection assigns, a frame at a time, before it breaks
		ends   int64                      // an attempt that fails at once; the others run until stopped
		want   []bool                     // running_complete of the first two hellos
		listed func(running []int64) bool // what the second hello lists
	}{
		{name: "a new identity", first: []*protocol.Frame{assign(1, 1)}, want: []bool{false, true},
			listed: func(r []int64) bool { return slices.Equal(r, []int64{1}) }},
		{name: "an identity kept from an earlier run", id: "w", first: []*protocol.Frame{assign(1, 1)}, want: []bool{false, true},
			listed: func(r []int64) bool { return slices.Equal(r, []int64{1}) }},
		// Attempt 2 ends at once, its outcome unacknowledged, while 1 runs
		// in the one slot: two attempts for a slot and no queue, so the
		// list is cut.
		{name: "a list cut to the worker's slots", first: []*protocol.Frame{assign(2, 2), assign(1, 1)},
			ends: 2, want: []bool{false, false}, listed: func(r []int64) bool { return len(r) == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hellos := make(chan *protocol.Hello, 4)
			var conns atomic.Int32
			started := make(chan int64, 4)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ws, err := websocket.Accept(w, r, nil)
				if err != nil {
					return
				}
				defer ws.CloseNow()
				ctx := r.Context()
				typ, data, err := ws.Read(ctx)
				if err != nil {
					return
				}
				f, err := protocol.Decode(data, typ == websocket.MessageBinary)
				if err != nil || f.Hello == nil {
					t.Errorf("first frame %v: %v", f, err)
					return
				}
				hellos <- f.Hello
				n := conns.Add(1)
				frames := []*protocol.Frame{{Type: protocol.TypeWelcome, Welcome: &protocol.Welcome{WorkerID: "w", ReconnectToken: "t",
					HeartbeatMS: 60000, LeaseMS: 60000}}}
				if n == 1 {
					frames = append(frames, tc.first...)
				}
				for i, f := range frames {
					data, bin, _ := protocol.Encode(f)
					mt := websocket.MessageText
					if bin {
						mt = websocket.MessageBinary
					}
					if ws.Write(ctx, mt, data) != nil {
						return
					}
					if n > 1 || i == 0 {
						continue
					}
					// The next assignment once this one started (or,
					// if it fails at once, reported, unacknowledged).
					select {
					case <-started:
					case <-time.After(10 * time.Second):
						t.Error("the worker did not start its attempt")
						return
					}
					for f.Assign[0].Attempt == tc.ends {
						typ, data, err := ws.Read(ctx)
						if err != nil {
							return
						}
						if f, err := protocol.Decode(data, typ == websocket.MessageBinary); err == nil && f.Type == protocol.TypeFail {
							break
						}
					}
				}
				if n == 1 {
					return // the connection breaks
				}
				for {
					if _, _, err := ws.Read(ctx); err != nil {
						return
					}
				}
			}))
			defer srv.Close()
			run := runnerFunc(func(ctx context.Context, job *Job) *Outcome {
				started <- job.Assign.Attempt
				if job.Assign.Attempt == tc.ends {
					return &Outcome{Reason: protocol.ReasonExit, Message: "exit 1"}
				}
				<-ctx.Done()
				return &Outcome{Reason: protocol.ReasonCancelled, Message: "stopped"}
			})
			w := New(Config{Servers: []string{srv.URL}, Slots: 1, Kind: protocol.KindHeadless, ID: tc.id, Token: "t", Runner: run,
				Logger: slog.New(slog.DiscardHandler)})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go w.Run(ctx)
			var got []*protocol.Hello
			for len(got) < 2 {
				select {
				case h := <-hellos:
					got = append(got, h)
				case <-time.After(20 * time.Second):
					t.Fatalf("%d hellos, want 2", len(got))
				}
			}
			for i, h := range got {
				if h.RunningComplete != tc.want[i] {
					t.Errorf("hello %d: running_complete %v, want %v (running %v)", i+1, h.RunningComplete, tc.want[i], h.Running)
				}
			}
			if !tc.listed(got[1].Running) {
				t.Errorf("the second hello lists %v", got[1].Running)
			}
		})
	}
}
