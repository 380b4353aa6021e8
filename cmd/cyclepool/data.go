package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"
)

// runData is "cyclepool data push PATH... | data list | data rm ID...".
func runData(ctx context.Context, args []string) error {
	fs := newFlagSet("data")
	own := addOwnerFlags(fs)
	archive := fs.Bool("archive", false, "push: the files are tar archives, to be mounted as directory trees")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usageError("data", "expected push, list or rm")
	}
	c := own.client()
	switch rest[0] {
	case "push":
		if len(rest) < 2 {
			return usageError("data", "push needs at least one file or directory")
		}
		for _, path := range rest[1:] {
			b, err := c.PushData(ctx, path, *archive)
			if err != nil {
				return err
			}
			if b.Skipped {
				fmt.Fprintf(os.Stderr, "%s: the server has it already\n", path)
			}
			fmt.Println(b.ID)
		}
		return nil
	case "list", "ls":
		if len(rest) != 1 {
			return usageError("data", "list takes no arguments")
		}
		bs, err := c.DataList(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSIZE\tKIND\tCREATED")
		for _, b := range bs {
			kind := "file"
			if b.Archive {
				kind = "archive"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", b.ID, b.Name, b.Size, kind, b.CreatedAt.Local().Format(time.DateTime))
		}
		return tw.Flush()
	case "rm":
		if len(rest) < 2 {
			return usageError("data", "rm needs at least one data id")
		}
		for _, id := range rest[1:] {
			if err := c.RemoveData(ctx, id); err != nil {
				return err
			}
		}
		return nil
	}
	return usageError("data", "unknown subcommand %q", rest[0])
}
