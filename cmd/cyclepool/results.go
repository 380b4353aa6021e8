package main

import (
	"context"
	"fmt"
	"os"
)

// runResults is "cyclepool results ID -o DIR".
func runResults(ctx context.Context, args []string) error {
	fs := newFlagSet("results")
	own := addOwnerFlags(fs)
	dir := fs.String("o", "", "directory to write DIR/<task>/<output> into (required)")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	id, err := oneID(ctx, own.client(), "results", rest)
	if err != nil {
		return err
	}
	if *dir == "" {
		return usageError("results", "-o DIR is required")
	}
	c := own.client()
	st, err := c.Status(ctx, id)
	if err != nil {
		return err
	}
	if err := c.Results(ctx, id, *dir); err != nil {
		return err
	}
	files := 0
	for _, t := range st.Tasks {
		if t.State == "done" {
			files += len(t.Outputs)
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %d outputs of %d done tasks to %s\n", files, st.Counts.Done, *dir)
	if !st.Finished() {
		fmt.Fprintf(os.Stderr, "workflow %s is still %s: only the tasks done so far are there\n", id, st.State)
	}
	return nil
}
