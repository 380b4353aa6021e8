package store

import (
	"context"
	"slices"
	"testing"
	"time"
)

// Listen tells the listener it listens, then each notification of the
// replicas' channels, the cancel list parsed, and returns when ctx ends.
func TestListen(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 8)
	var cancelled []int64
	done := make(chan error, 1)
	go func() {
		done <- f.s.Listen(ctx, Listener{
			Listening: func() { got <- "listening" },
			Ready:     func() { got <- "ready" },
			Finished:  func(id string) { got <- "finished " + id },
			Cancel:    func(ids []int64) { cancelled = ids; got <- "cancel" },
		})
	}()
	next := func() string {
		t.Helper()
		select {
		case s := <-got:
			return s
		case err := <-done:
			t.Fatalf("Listen returned: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("no notification")
		}
		return ""
	}
	if s := next(); s != "listening" {
		t.Fatalf("first %q, want listening", s)
	}
	for _, n := range []struct{ channel, payload, want string }{
		{ChannelReady, "", "ready"},
		{ChannelFinished, "wf-1", "finished wf-1"},
		{ChannelCancel, "7,x,9", "cancel"},
	} {
		if _, err := f.s.pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, n.channel, n.payload); err != nil {
			t.Fatal(err)
		}
		if s := next(); s != n.want {
			t.Errorf("notified %s: got %q, want %q", n.channel, s, n.want)
		}
	}
	if !slices.Equal(cancelled, []int64{7, 9}) {
		t.Errorf("cancelled %v, want [7 9] (the garbage dropped)", cancelled)
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("Listen returned nil after its context ended")
	}
}
