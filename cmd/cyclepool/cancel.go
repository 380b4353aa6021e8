package main

import (
	"context"
	"fmt"
)

// runCancel is "cyclepool cancel ID": it prints the workflow's state after
// the cancel.
func runCancel(ctx context.Context, args []string) error {
	fs := newFlagSet("cancel")
	own := addOwnerFlags(fs)
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	id, err := oneID("cancel", rest)
	if err != nil {
		return err
	}
	st, err := own.client().Cancel(ctx, id)
	if err != nil {
		return err
	}
	fmt.Printf("workflow %s: %s (%s)\n", st.ID, st.State, countsText(st))
	return nil
}
