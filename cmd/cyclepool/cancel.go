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

// runDelete is "cyclepool delete ID...": it deletes workflows that have
// ended, with their outputs, and prints each id deleted.
func runDelete(ctx context.Context, args []string) error {
	fs := newFlagSet("delete")
	own := addOwnerFlags(fs)
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usageError("delete", "expected at least one workflow ID")
	}
	c := own.client()
	for _, arg := range rest {
		id, err := c.ResolveID(ctx, arg)
		if err != nil {
			return err
		}
		if err := c.Delete(ctx, id); err != nil {
			return err
		}
		fmt.Printf("workflow %s deleted\n", id)
	}
	return nil
}
