package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"
)

// runModule is "cyclepool module push FILE.wasm... | module list | module rm ID...".
func runModule(ctx context.Context, args []string) error {
	fs := newFlagSet("module")
	own := addOwnerFlags(fs)
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usageError("module", "expected push, list or rm")
	}
	c := own.client()
	switch rest[0] {
	case "push":
		if len(rest) < 2 {
			return usageError("module", "push needs at least one .wasm file")
		}
		for _, path := range rest[1:] {
			wasm, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("module push: %w", err)
			}
			m, err := c.PushModuleNamed(ctx, filepath.Base(path), wasm)
			if err != nil {
				return fmt.Errorf("module push %s: %w", path, err)
			}
			fmt.Println(m.ID)
		}
		return nil
	case "list":
		if len(rest) != 1 {
			return usageError("module", "list takes no arguments")
		}
		mods, err := c.Modules(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tSIZE\tCREATED")
		for _, m := range mods {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", m.ID, m.Name, m.Size, m.CreatedAt.Local().Format(time.DateTime))
		}
		return tw.Flush()
	case "rm":
		if len(rest) < 2 {
			return usageError("module", "rm needs at least one module id")
		}
		for _, id := range rest[1:] {
			if err := c.RemoveModule(ctx, id); err != nil {
				return err
			}
		}
		return nil
	}
	return usageError("module", "unknown subcommand %q", rest[0])
}
