package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// Hellos that arrive while the registrations in hand wait for the
// database are registered together, in one batch, and each worker gets
// its own identity: a storm of reconnections costs a transaction per
// batch, not per worker.
func TestHellosAreRegisteredInBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFixture(t)
	s, wsURL := runServer(t, f)
	// The workers' table is locked: the registrations that come first
	// wait, and the hellos behind them gather.
	db, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	lock, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `LOCK TABLE workers IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	const n = 40
	hello, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{Version: protocol.Version,
		Kind: protocol.KindHeadless, Slots: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws, _, err := websocket.DefaultDialer.DialContext(ctx, wsURL, nil)
			if err != nil {
				errs[i] = err
				return
			}
			t.Cleanup(func() { ws.Close() })
			if err := ws.WriteMessage(websocket.TextMessage, hello); err != nil {
				errs[i] = err
				return
			}
			_, data, err := ws.ReadMessage()
			if err != nil {
				errs[i] = err
				return
			}
			f, err := protocol.Decode(data, false)
			if err != nil || f.Type != protocol.TypeWelcome {
				errs[i] = fmt.Errorf("%s instead of a welcome (%v)", data, err)
				return
			}
			ids[i] = f.Welcome.WorkerID
		}()
	}
	// Every hello is in: queued in the batcher, or in a flush waiting for
	// the lock.
	waiting := func() float64 {
		var m dto.Metric
		if err := s.metrics.hellosWaiting.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	for deadline := time.Now().Add(30 * time.Second); waiting() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v hellos waiting behind the lock, want %d", waiting(), n)
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range n {
		if errs[i] != nil || ids[i] == "" || seen[ids[i]] {
			t.Fatalf("worker %d: id %q, error %v", i, ids[i], errs[i])
		}
		seen[ids[i]] = true
	}
	// The last batch is counted once its welcomes are on their way: wait
	// for it.
	var m dto.Metric
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		m.Reset()
		if err := s.metrics.batchSize.WithLabelValues("hello").(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		if m.GetHistogram().GetSampleSum() >= n || time.Now().After(deadline) {
			break
		}
	}
	// The two flushes that waited, and the rest together: 3 batches, or a
	// few more if a hello counted as waiting was still on its way into the
	// queue when the lock went (batches of one would make 40). None waits
	// once all are answered.
	if h := m.GetHistogram(); h.GetSampleCount() > n/4 || h.GetSampleSum() != n {
		t.Errorf("%v hellos registered in %d batches, want %d in %d at most", h.GetSampleSum(), h.GetSampleCount(), n, n/4)
	}
	if w := waiting(); w != 0 {
		t.Errorf("%v hellos still counted as waiting after every welcome", w)
	}
}

// A hello carrying texts PostgreSQL cannot store (JSON's \u0000 decodes
// to a NUL character) is registered with them cleaned.
func TestHelloWithNULCharactersIsCleaned(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFixture(t)
	_, wsURL := runServer(t, f)
	ws, _, err := websocket.DefaultDialer.DialContext(ctx, wsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	hello := `{"t":"hello","hello":{"version":` + fmt.Sprint(protocol.Version) + `,"kind":"browser","slots":1,"volunteer":"v\u0000x",` +
		`"build":"b\u0000","device":{"user_agent":"ua\u0000","paused_because":"p\u0000"}}}`
	if err := ws.WriteMessage(websocket.TextMessage, []byte(hello)); err != nil {
		t.Fatal(err)
	}
	_, data, err := ws.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	fr, err := protocol.Decode(data, false)
	if err != nil || fr.Type != protocol.TypeWelcome {
		t.Fatalf("%s instead of a welcome (%v)", data, err)
	}
	recs, err := f.st.Workers(ctx, []string{fr.Welcome.WorkerID})
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d records (%v)", len(recs), err)
	}
	if r := recs[0]; r.Volunteer != "vx" || r.Build != "b" || strings.ContainsRune(string(r.Device), 0) || strings.Contains(string(r.Device), `\u0000`) {
		t.Errorf("stored volunteer %q, build %q, device %s", r.Volunteer, r.Build, r.Device)
	}
}

// runServer runs a replica on f's store, with no bound on new worker
// identities, until the test ends; it returns the replica and the URL of
// its workers' WebSocket.
func runServer(t *testing.T, f *fixture) (*Server, string) {
	t.Helper()
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, NewWorkerEvery: -1, Logger: slog.New(slog.DiscardHandler)})
	go s.Run(t.Context())
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, "ws" + strings.TrimPrefix(ts.URL, "http") + "/ws/worker"
}
