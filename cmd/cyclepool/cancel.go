package main

import (
	"context"
	"fmt"
)

// runCancel is "cyclepool cancel ID [--task NAME]": it cancels the
// workflow, or only one of its tasks, and prints the workflow's state
// after the cancel.
func runCancel(ctx context.Context, args []string) error {
	fs := newFlagSet("cancel")
	own := addOwnerFlags(fs)
	task := fs.String("task", "", "cancel only this task (its dependents end upstream_failed; the others run on)")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	id, err := oneID(ctx, own.client(), "cancel", rest)
	if err != nil {
		return err
	}
	if *task != "" {
		st, err := own.client().CancelTask(ctx, id, *task)
		if err != nil {
			return err
		}
		fmt.Printf("task %s cancelled; workflow %s: %s (%s)\n", *task, st.ID, st.State, countsText(st))
		return nil
	}
	st, err := own.client().Cancel(ctx, id)
	if err != nil {
		return err
	}
	fmt.Printf("workflow %s: %s (%s)\n", st.ID, st.State, countsText(st))
	return nil
}
