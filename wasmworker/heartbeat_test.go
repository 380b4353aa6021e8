//go:build !js

package wasmworker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// beatServer welcomes one worker with the given intervals and passes on
// the device state of every heartbeat it sends (beats must have room).
func beatServer(t *testing.T, every, idle time.Duration, beats chan<- protocol.Device) string {
	t.Helper()
	return fakeServerWelcome(t, &protocol.Welcome{WorkerID: "w", HeartbeatMS: int(every.Milliseconds()),
		IdleHeartbeatMS: int(idle.Milliseconds()), LeaseMS: 60000}, nil, func(f *protocol.Frame) []*protocol.Frame {
		if f.Type == protocol.TypeHeartbeat && f.Heartbeat.Device != nil {
			select {
			case beats <- *f.Heartbeat.Device:
			default:
				t.Error("more heartbeats than the test has room for")
			}
		}
		return nil
	})
}

// A paused worker that holds nothing heartbeats at the welcome's idle
// interval (here an hour: once, then no more), and at once and at the
// normal interval again when it resumes; without an idle interval (an
// older server) it keeps the normal one throughout.
func TestPausedIdleWorkerHeartbeatsAtTheIdleInterval(t *testing.T) {
	const every = 10 * time.Millisecond
	tests := []struct {
		name string
		idle time.Duration
	}{
		{"idle interval", time.Hour},
		{"no idle interval", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			beats := make(chan protocol.Device, 1000)
			url := beatServer(t, every, tc.idle, beats)
			var paused atomic.Bool
			paused.Store(true)
			w := New(Config{Servers: []string{url}, Slots: 1, Kind: protocol.KindHeadless, Runner: sleepRunner{},
				Logger: slog.New(slog.DiscardHandler),
				Device: func() protocol.Device { return protocol.Device{Paused: paused.Load()} }})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { defer close(done); w.Run(ctx) }()
			defer func() { cancel(); <-done }()
			next := func() protocol.Device {
				t.Helper()
				select {
				case d := <-beats:
					return d
				case <-time.After(30 * time.Second):
					t.Fatal("no heartbeat in 30 s")
					return protocol.Device{}
				}
			}
			if d := next(); !d.Paused {
				t.Fatal("the first heartbeat says not paused")
			}
			if tc.idle > 0 {
				// Thirty normal intervals: a busy machine only makes them fewer.
				time.Sleep(30 * every)
				if n := len(beats); n > 0 {
					t.Fatalf("%d more heartbeats while paused and idle, want none before the idle interval", n)
				}
			} else if d := next(); !d.Paused { // the normal interval goes on
				t.Fatal("the second heartbeat says not paused")
			}
			for len(beats) > 0 {
				<-beats
			}
			paused.Store(false)
			w.DeviceChanged()
			for d := next(); d.Paused; d = next() {
			}
			for range 5 { // at the normal interval: an hour's wait would fail the test
				if d := next(); d.Paused {
					t.Fatal("a heartbeat after resuming says paused")
				}
			}
		})
	}
}
