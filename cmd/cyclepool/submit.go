package main

import (
	"context"
	"fmt"
	"os"
	"sort"
)

// runSubmit is "cyclepool submit WORKFLOW.json": it prints the workflow id
// on stdout and the modules it pushed on stderr.
func runSubmit(ctx context.Context, args []string) error {
	fs := newFlagSet("submit")
	own := addOwnerFlags(fs)
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usageError("submit", "expected one workflow file, got %d arguments", len(rest))
	}
	sub, err := own.client().SubmitFile(ctx, rest[0])
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
	return nil
}
