package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// runSubmit is "cyclepool submit WORKFLOW.json [--wait D]": it prints the
// workflow id on stdout and the modules it pushed on stderr. With --wait,
// it then waits for the workflow's end, at most D, as "cyclepool wait"
// does (its final line and exit status), the first minute in the
// submission's own request.
func runSubmit(ctx context.Context, args []string) error {
	fs := newFlagSet("submit")
	own := addOwnerFlags(fs)
	wait := fs.Duration("wait", 0, "wait this long for the workflow's end, as cyclepool wait --timeout does (0: do not wait)")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usageError("submit", "expected one workflow file, got %d arguments", len(rest))
	}
	if *wait < 0 {
		return usageError("submit", "--wait must not be negative")
	}
	var sub client.Submitted
	var st *client.Status
	began := time.Now()
	if *wait > 0 {
		sub, st, err = own.client().SubmitFileAndWait(ctx, rest[0], min(*wait, time.Minute))
	} else {
		sub, err = own.client().SubmitFile(ctx, rest[0])
	}
	if err != nil {
		return err
	}
	paths := make([]string, 0, len(sub.Modules))
	for p := range sub.Modules {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		fmt.Fprintf(os.Stderr, "pushed %s as %s\n", p, sub.Modules[p])
	}
	paths = paths[:0]
	for p := range sub.Data {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		fmt.Fprintf(os.Stderr, "pushed data %s as %s\n", p, sub.Data[p])
	}
	fmt.Println(sub.ID)
	if *wait == 0 {
		return nil
	}
	if client.Finished(st.State) {
		return waitEnded(st)
	}
	left := *wait - time.Since(began)
	if left <= 0 {
		return waitTimedOut(ctx, sub.ID, *wait, st, context.DeadlineExceeded)
	}
	wctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	st, err = own.client().Wait(wctx, sub.ID)
	if err != nil {
		return waitTimedOut(ctx, sub.ID, *wait, st, err)
	}
	return waitEnded(st)
}
