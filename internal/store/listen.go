package store

import (
	"context"
	"strconv"
	"strings"
)

// Listener receives what replicas tell each other through the database
// (Store.Listen). A nil func ignores its notifications.
type Listener struct {
	// Listening is called once the connection listens: whatever was
	// notified before (while no connection listened) must be looked at.
	Listening func()
	// Ready: tasks became ready (ChannelReady).
	Ready func()
	// Finished: the workflow reached a final state (ChannelFinished).
	Finished func(workflow string)
	// Cancel: the attempts must stop where they run (ChannelCancel).
	Cancel func(attempts []int64)
}

// Listen holds a connection of its own that listens on the replicas'
// channels and calls l for each notification, until ctx is done or the
// connection breaks (the error says which); the caller listens again.
func (s *Store) Listen(ctx context.Context, l Listener) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	for _, ch := range []string{ChannelReady, ChannelCancel, ChannelFinished} {
		if _, err := c.Exec(ctx, "LISTEN "+ch); err != nil {
			c.Conn().Close(ctx)
			return err
		}
	}
	if l.Listening != nil {
		l.Listening()
	}
	for {
		n, err := c.Conn().WaitForNotification(ctx)
		if err != nil {
			// The connection may be mid-wait: it does not go back to the
			// pool.
			c.Conn().Close(context.WithoutCancel(ctx))
			return err
		}
		switch {
		case n.Channel == ChannelReady && l.Ready != nil:
			l.Ready()
		case n.Channel == ChannelFinished && l.Finished != nil:
			l.Finished(n.Payload)
		case n.Channel == ChannelCancel && l.Cancel != nil:
			var ids []int64
			for _, f := range strings.Split(n.Payload, ",") {
				if id, err := strconv.ParseInt(f, 10, 64); err == nil {
					ids = append(ids, id)
				}
			}
			l.Cancel(ids)
		}
	}
}
