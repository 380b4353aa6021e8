package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/version"
)

// idAndTask checks that a workflow id (or a unique start of one) and a
// task name were given, and returns the workflow's whole id and the task.
func idAndTask(ctx context.Context, c *client.Client, name string, args []string) (string, string, error) {
	if len(args) != 2 || args[0] == "" || args[1] == "" {
		return "", "", usageError(name, "expected a workflow ID and a task name, got %d arguments", len(args))
	}
	id, err := c.ResolveID(ctx, args[0])
	return id, args[1], err
}

// runLogs is "cyclepool logs ID TASK": the task's log (its stderr, as the
// latest attempt left it) on standard output.
func runLogs(ctx context.Context, args []string) error {
	fs := newFlagSet("logs")
	own := addOwnerFlags(fs)
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	c := own.client()
	id, task, err := idAndTask(ctx, c, "logs", rest)
	if err != nil {
		return err
	}
	log, err := c.Log(ctx, id, task)
	if err != nil {
		return err
	}
	_, err = io.WriteString(os.Stdout, log)
	return err
}

// runAttempts is "cyclepool attempts ID TASK [--json]": every attempt of
// the task, oldest first, with its worker, times and reason.
func runAttempts(ctx context.Context, args []string) error {
	fs := newFlagSet("attempts")
	own := addOwnerFlags(fs)
	asJSON := fs.Bool("json", false, "print the API's JSON")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	c := own.client()
	id, task, err := idAndTask(ctx, c, "attempts", rest)
	if err != nil {
		return err
	}
	as, err := c.Attempts(ctx, id, task)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"attempts": as})
	}
	return writeAttempts(os.Stdout, as)
}

// writeAttempts prints attempts as a table.
func writeAttempts(w io.Writer, as []client.Attempt) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tSTATE\tWORKER\tSTARTED\tTOOK\tREASON")
	for _, a := range as {
		started, took := "-", "-"
		if a.StartedAt != nil {
			started = a.StartedAt.Local().Format(time.DateTime)
			if a.EndedAt != nil {
				took = a.EndedAt.Sub(*a.StartedAt).Round(time.Millisecond).String()
			}
		}
		state := a.State
		if a.Verdict != "" {
			state += " (" + a.Verdict + ")"
		}
		reason := strings.ReplaceAll(a.Reason, "\n", " ")
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", a.ID, state, a.Worker[:min(8, len(a.Worker))], started, took, reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(as) == 0 {
		_, err := fmt.Fprintln(w, "no attempts yet")
		return err
	}
	return nil
}

// runVersion is "cyclepool version": this build's version.
func runVersion(_ context.Context, args []string) error {
	fs := newFlagSet("version")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Println("cyclepool", version.String())
	return nil
}
