package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// Exit statuses of "cyclepool wait".
const (
	exitDone      = 0
	exitFailed    = 1
	exitCancelled = 2
	exitTimedOut  = 3
)

// runWait is "cyclepool wait ID [--timeout 10m]": it prints the final state
// on stderr and exits 0 when the workflow is done, 1 when it failed (or the
// command itself failed), 2 when it was cancelled and 3 on timeout.
func runWait(ctx context.Context, args []string) error {
	fs := newFlagSet("wait")
	own := addOwnerFlags(fs)
	timeout := fs.Duration("timeout", 0, "give up after this long (0 waits forever)")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	id, err := oneID(ctx, own.client(), "wait", rest)
	if err != nil {
		return err
	}
	if *timeout < 0 {
		return usageError("wait", "--timeout must not be negative")
	}
	wctx := ctx
	if *timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	st, err := own.client().Wait(wctx, id)
	if err != nil {
		return waitTimedOut(ctx, id, *timeout, st, err)
	}
	return waitEnded(st)
}

// waitTimedOut reports a wait for workflow id that ended with err after
// timeout (st: the status last seen, if any): a timeout when the wait's
// own deadline passed (exit status 3), err otherwise.
func waitTimedOut(ctx context.Context, id string, timeout time.Duration, st *client.Status, err error) error {
	if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return err
	}
	state := "in an unknown state"
	if st != nil {
		state = st.State + " (" + countsText(st) + ")"
	}
	fmt.Fprintf(os.Stderr, "workflow %s timed out after %s: still %s\n", id, timeout, state)
	return &exitError{code: exitTimedOut}
}

// waitEnded prints a finished workflow's final line and returns its exit
// status: nil when done, 2 when cancelled, 1 when failed.
func waitEnded(st *client.Status) error {
	fmt.Fprintln(os.Stderr, finalText(st, time.Now()))
	switch st.State {
	case client.WorkflowDone:
		return nil
	case client.WorkflowCancelled:
		return &exitError{code: exitCancelled}
	default:
		return &exitError{code: exitFailed}
	}
}

// finalText describes a finished workflow in one line, naming the first
// failed task and its error.
func finalText(st *client.Status, now time.Time) string {
	s := fmt.Sprintf("workflow %s %s after %s (%s)", st.ID, st.State, elapsed(st, now), countsText(st))
	for _, t := range st.Tasks {
		if t.State == client.TaskFailed {
			s += fmt.Sprintf("; task %q failed", t.Name)
			if t.Error != "" {
				s += ": " + oneLine(t.Error)
			}
			break
		}
	}
	return s
}
