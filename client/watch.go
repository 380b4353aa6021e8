package client

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// firstRetry is the pause before the first status poll after the event
// stream broke; the pause doubles up to the poll interval.
const firstRetry = 250 * time.Millisecond

// Watch follows a workflow until it reaches a final state and returns its
// final status object. fn, when not nil, is called with the current status
// after every change (from the event stream, or from a status poll while the
// stream is down); it runs on Watch's goroutine and must not keep the
// pointer after it returns (use Status.Clone).
//
// When the event stream breaks or cannot be opened, Watch polls Status,
// pausing longer each time up to the poll interval (WithPollInterval), and
// reopens the stream. It gives up on an error that retrying cannot fix: an
// APIError with a 4xx status from Status (unknown workflow, bad token), or
// ctx being done; then it returns the last status it knew (possibly nil)
// with the error.
func (c *Client) Watch(ctx context.Context, id string, fn func(*Status)) (*Status, error) {
	var last *Status
	report := func(st *Status) {
		last = st
		if fn != nil {
			fn(st)
		}
	}
	delay := firstRetry
	for {
		st, final, progressed := c.follow(ctx, id, report)
		if final {
			return st, nil
		}
		if err := ctx.Err(); err != nil {
			return last, err
		}
		if progressed {
			delay = firstRetry
		}
		st, err := c.Status(ctx, id)
		switch {
		case ctx.Err() != nil:
			return last, ctx.Err()
		case err != nil && permanent(err):
			return last, err
		case err == nil:
			report(st)
			if st.Finished() {
				return st, nil
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return last, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, c.poll)
	}
}

// Wait blocks until a workflow reaches a final state (done, failed or
// cancelled) and returns its final status. It follows the event stream and
// falls back to polling while the stream is down (see Watch). When ctx ends
// first it returns the last status it knew with ctx's error.
func (c *Client) Wait(ctx context.Context, id string) (*Status, error) {
	return c.Watch(ctx, id, nil)
}

// follow reads the event stream once. final says the workflow reached a
// final state (st is then its status); progressed says at least one event
// arrived.
func (c *Client) follow(ctx context.Context, id string, report func(*Status)) (st *Status, final, progressed bool) {
	_ = c.stream(ctx, id, func(ev Event) error {
		progressed = true
		if ev.Type == EventStatus {
			st = new(Status)
		}
		if st == nil {
			return nil // a change before the first status event: nothing to apply it to
		}
		changed, err := st.Apply(ev)
		if err != nil {
			return err // a malformed event: treat the stream as broken
		}
		if changed {
			report(st)
		}
		if st.Finished() {
			return errStopWatch
		}
		return nil
	})
	if st == nil || !st.Finished() {
		return nil, false, progressed
	}
	// The stream's view lacks what only the status object carries (finish
	// times, outputs); fetch it once, keeping the stream's view if that fails.
	if full, err := c.Status(ctx, id); err == nil && full.Finished() {
		report(full)
		return full, true, progressed
	}
	return st, true, progressed
}

// permanent reports whether retrying the request cannot help: a 4xx answer
// other than timeouts and rate limits.
func permanent(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.Status >= 400 && ae.Status < 500 &&
		ae.Status != http.StatusRequestTimeout && ae.Status != http.StatusTooManyRequests
}
