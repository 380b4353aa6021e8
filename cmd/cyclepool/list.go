package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// runList is "cyclepool list": the owner's recent workflows, newest first.
func runList(ctx context.Context, args []string) error {
	fs := newFlagSet("list")
	own := addOwnerFlags(fs)
	var opts client.ListOptions
	fs.StringVar(&opts.State, "state", "", "only workflows in this state (running, done, failed, cancelled)")
	fs.IntVar(&opts.Limit, "limit", 20, "at most this many workflows")
	fs.IntVar(&opts.Offset, "offset", 0, "skip this many workflows")
	fs.StringVar(&opts.Query, "q", "", "only workflows matching this text")
	asJSON := fs.Bool("json", false, "print the server's answer as JSON")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return usageError("list", "unexpected arguments %q", rest)
	}
	l, err := own.client().List(ctx, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	}
	return writeList(os.Stdout, l, time.Now())
}

// writeList prints workflow summaries as a table.
func writeList(w io.Writer, l client.WorkflowList, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tPRIORITY\tTASKS\tCREATED\tELAPSED")
	for i := range l.Workflows {
		s := &l.Workflows[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", s.ID, s.Name, s.State, s.Priority,
			s.Counts.Done, s.Counts.Total(), s.CreatedAt.Local().Format("2006-01-02 15:04"), elapsed(s, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n := len(l.Workflows); l.Total > n {
		fmt.Fprintf(os.Stderr, "showing %d of %d (use --limit and --offset for more)\n", n, l.Total)
	}
	return nil
}
