package server

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	dto "github.com/prometheus/client_model/go"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// Silence counts only while the read loop waits for a frame, from when it
// began waiting.
func TestSilentFor(t *testing.T) {
	t.Parallel()
	const limit = time.Minute
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for _, tc := range []struct {
		name    string
		waiting bool          // the loop waits for a frame (else it handles one)
		since   time.Duration // the loop began waiting this long before now
		silent  bool
	}{
		{"handling a frame for longer than the limit", false, 2 * limit, false},
		{"waiting for less than the limit", true, limit - time.Second, false},
		{"waiting for the limit", true, limit, true},
		{"waiting for longer", true, 3 * limit, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &conn{}
			if tc.waiting {
				c.waiting.Store(now - int64(tc.since))
			}
			if got := silentFor(c, now, limit); got != tc.silent {
				t.Errorf("silentFor = %v, want %v", got, tc.silent)
			}
		})
	}
}

// A worker that keeps sending frames stays connected past the silence
// limit; once it says nothing for the limit, the replica closes its
// socket. Over a real WebSocket, with a real database.
func TestSilentWorkerIsDisconnected(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFixture(t)
	s := New(f.st, Config{Replica: "test", Lease: time.Second, Poll: time.Minute, NewWorkerEvery: -1, Logger: slog.New(slog.DiscardHandler)})
	limit := s.cfg.silenceLimit()
	go s.Run(t.Context())
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(ts.URL, "http")+"/ws/worker", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	send := func(fr *protocol.Frame) {
		t.Helper()
		data, bin, err := protocol.Encode(fr)
		if err != nil {
			t.Fatal(err)
		}
		typ := websocket.TextMessage
		if bin {
			typ = websocket.BinaryMessage
		}
		if err := ws.WriteMessage(typ, data); err != nil {
			t.Fatalf("write %s: %v", fr.Type, err)
		}
	}
	send(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1}})
	closed := make(chan error, 1)
	go func() {
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				closed <- err
				return
			}
		}
	}()
	// Frames every fifth of the limit, for longer than the limit.
	var lastFrame time.Time
	for talkUntil := time.Now().Add(limit + limit/2); time.Now().Before(talkUntil); {
		lastFrame = time.Now()
		send(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Free: 1}})
		select {
		case err := <-closed:
			t.Fatalf("closed while the worker sent a frame every %v (limit %v): %v", limit/5, limit, err)
		case <-time.After(limit / 5):
		}
	}
	select {
	case <-closed:
		if since := time.Since(lastFrame); since < limit {
			t.Fatalf("closed %v after the last frame, before the silence limit of %v", since, limit)
		}
	case <-time.After(10 * limit):
		t.Fatalf("still connected %v after the last frame (limit %v)", 10*limit, limit)
	}
	var m dto.Metric
	if err := s.metrics.silenceCloses.Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("cyclepool_worker_silence_closes_total = %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
}
