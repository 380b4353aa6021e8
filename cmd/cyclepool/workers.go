package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/cyclepool/cyclepool/client"
)

// runWorkers is "cyclepool workers": the connected workers, with the
// stability class the dispatcher gives them, its reasons, their reputation
// and the tasks they did, for operators.
func runWorkers(ctx context.Context, args []string) error {
	fs := newFlagSet("workers")
	own := addOwnerFlags(fs)
	asJSON := fs.Bool("json", false, "print the server's answer as JSON")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return usageError("workers", "unexpected arguments %q", rest)
	}
	l, err := own.client().Workers(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	}
	return writeWorkers(os.Stdout, l)
}

// writeWorkers prints the workers as a table and the fairness metric
// below it. Values known only to another server replica print as "-".
func writeWorkers(w io.Writer, l client.WorkerList) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tSLOTS\tRUNNING\tDONE\tLOST\tSTABILITY\tREPUTATION\tREASONS")
	for _, wk := range l.Workers {
		class, reasons := "-", "-"
		if wk.Stability != nil {
			class = wk.Stability.Class
			if len(wk.Stability.Reasons) > 0 {
				reasons = strings.Join(wk.Stability.Reasons, "; ")
			}
		}
		rep := fmt.Sprintf("%.2f (%d valid, %d invalid)", wk.Reputation.Score, wk.Reputation.Valid, wk.Reputation.Invalid)
		if wk.Reputation.Trusted {
			rep += " trusted"
		}
		switch {
		case wk.Operator:
			rep += ", operator's"
		case wk.Strikes >= 0.05:
			rep += fmt.Sprintf(", %.1f strikes", wk.Strikes)
		}
		if wk.Allowed != nil && *wk.Allowed < wk.Slots {
			rep += fmt.Sprintf(", held to %d", *wk.Allowed)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", wk.ID, wk.Kind, wk.Slots, optInt(wk.Running), optInt(wk.TasksDone),
			wk.TasksLost, wk.Attempts, class, rep, reasons)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	noun := "workers"
	if len(l.Workers) == 1 {
		noun = "worker"
	}
	_, err := fmt.Fprintf(w, "%d %s; fairness %s, variance of tasks done %.2f\n", len(l.Workers), noun, l.Fairness.Strategy,
		l.Fairness.VarianceTasksDone)
	return err
}

// optInt prints an optional count, "-" when unknown.
func optInt(n *int) string {
	if n == nil {
		return "-"
	}
	return fmt.Sprint(*n)
}
