package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
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

// A worker that has said nothing for longer than the hub's silent limit
// (two and a half heartbeat intervals) gives back at once the attempts
// waiting in its queue, charged to nobody, while the one it may be running
// keeps its lease (a minute here). It is told to cancel the three; a
// heartbeat that still lists them renews none, its reports of them
// cancelled do not count against it (fencedReport), and its running one
// still reports. Over a real WebSocket, with a real database.
func TestSilentWorkerGivesBackItsQueue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := newFixture(t)
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Heartbeat: 100 * time.Millisecond, Poll: time.Minute, NewWorkerEvery: -1,
		Logger: slog.New(slog.DiscardHandler)})
	go s.Run(ctx)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	s.operatorKeys.Store("operator-key", true) // all its slots and queue may fill from the start
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(ts.URL, "http")+"/ws/worker",
		http.Header{"Authorization": {"Bearer operator-key"}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	var wmu sync.Mutex
	send := func(fr *protocol.Frame) error {
		data, bin, err := protocol.Encode(fr)
		if err != nil {
			return err
		}
		typ := websocket.TextMessage
		if bin {
			typ = websocket.BinaryMessage
		}
		wmu.Lock()
		defer wmu.Unlock()
		return ws.WriteMessage(typ, data)
	}
	frames := make(chan *protocol.Frame, 64)
	go func() {
		defer close(frames)
		for {
			mt, data, err := ws.ReadMessage()
			if err != nil {
				return
			}
			if fr, err := protocol.Decode(data, mt == websocket.BinaryMessage); err == nil {
				frames <- fr
			}
		}
	}()
	next := func(typ string) *protocol.Frame {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case fr, ok := <-frames:
				if !ok {
					t.Fatalf("socket closed while waiting for %s", typ)
				}
				if fr.Type == typ {
					return fr
				}
			case <-timeout:
				t.Fatalf("no %s frame", typ)
			}
		}
	}
	if err := send(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{Version: protocol.Version,
		Kind: protocol.KindHeadless, Slots: 1, Queue: 3}}); err != nil {
		t.Fatal(err)
	}
	next(protocol.TypeWelcome)
	// Heard from until it holds four attempts, then silent.
	speaking, quiet := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(quiet)
		tick := time.NewTicker(30 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-speaking:
				return
			case <-tick.C:
				if send(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{}}) != nil {
					return
				}
			}
		}
	}()
	f.submitMany(t, 4)
	var held []int64
	for len(held) < 4 {
		for _, a := range next(protocol.TypeAssign).Assign {
			held = append(held, a.Attempt)
		}
	}
	close(speaking)
	<-quiet
	slices.Sort(held)
	db, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	states := func() map[int64]string {
		t.Helper()
		out := map[int64]string{}
		for _, a := range held {
			var st string
			if err := db.QueryRow(ctx, `SELECT state FROM attempts WHERE id = $1`, a).Scan(&st); err != nil {
				t.Fatal(err)
			}
			out[a] = st
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for st := states(); st[held[1]] == "running" || st[held[2]] == "running" || st[held[3]] == "running"; st = states() {
		if time.Now().After(deadline) {
			t.Fatalf("attempts %v: %v; want the three queued ones given back", held, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := states()
	if st[held[0]] != "running" {
		t.Errorf("the attempt it may be running is %s, want running until its lease lapses", st[held[0]])
	}
	for _, a := range held[1:] {
		if st[a] != "lost" {
			t.Errorf("queued attempt %d is %s, want lost (never started)", a, st[a])
		}
	}
	var charged int
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(attempts), 0) FROM tasks`).Scan(&charged); err != nil || charged != 1 {
		t.Errorf("%d attempts charged to the tasks (%v), want 1: the running one's", charged, err)
	}
	// It is told to cancel the three, reports them cancelled, as a worker
	// does, and the one it ran: neither counts against it.
	cancelled := map[int64]bool{}
	for len(cancelled) < 3 {
		for _, a := range next(protocol.TypeCancel).Cancel.Attempts {
			cancelled[a] = true
		}
	}
	for _, a := range held[1:] {
		if !cancelled[a] {
			t.Errorf("queued attempt %d not cancelled (cancelled: %v)", a, cancelled)
		}
	}
	// Awake, it heartbeats first, listing all four, as a worker does
	// before it has handled the cancel: that renews none of the three,
	// nor takes them from the connection.
	var running []protocol.Progress
	for _, a := range held {
		running = append(running, protocol.Progress{Attempt: a})
	}
	if err := send(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Running: running}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // for a renewal, were one made, to come back
	var fails []protocol.Fail
	for _, a := range held[1:] {
		fails = append(fails, protocol.Fail{Attempt: a, Reason: protocol.ReasonCancelled, Message: "cancelled by the server"})
	}
	if err := send(&protocol.Frame{Type: protocol.TypeFail, Fails: fails}); err != nil {
		t.Fatal(err)
	}
	if err := send(&protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{Attempt: held[0],
		Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("out\n")}}}}}); err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		for _, ack := range next(protocol.TypeAck).Acks {
			switch {
			case ack.Attempt == held[0]:
				done = true
				if !ack.OK {
					t.Errorf("ack %+v, want the running attempt's result accepted", ack)
				}
			case strings.Contains(ack.Error, "does not hold"):
				t.Errorf("ack %+v: the cancelled attempt's report was fenced", ack)
			}
		}
	}
}
