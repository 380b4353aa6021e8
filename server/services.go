package server

import (
	"context"
	"time"
)

// every runs fn every d until ctx ends: the shape of the replica's
// background services (Run starts them, and their end is ctx's). fn is
// given ctx, and a run that takes longer than d delays the next rather
// than overlapping it.
func every(ctx context.Context, d time.Duration, fn func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}
