package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/cyclepool/cyclepool/internal/sim"
)

// runSim runs one scheduling simulation scenario (internal/sim) and prints
// its table, our figures beside the paper's, or JSON; --svg also writes its
// plot.
func runSim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	list := fs.Bool("list", false, "list the scenarios")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	seed := fs.Uint64("seed", 1, "random seed (same seed, same output)")
	svg := fs.String("svg", "", "also write the scenario's plot to this SVG file")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *list {
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		for _, s := range sim.Scenarios() {
			fmt.Fprintf(tw, "%s\t%s\n", s.Name, s.Summary)
		}
		return tw.Flush()
	}
	if len(rest) != 1 {
		return &exitError{code: 1, msg: "usage: cyclepool sim SCENARIO [--json] [--seed N] [--svg FILE] | --list"}
	}
	sc, ok := sim.Lookup(rest[0])
	if !ok {
		return &exitError{code: 1, msg: fmt.Sprintf("unknown scenario %q (run \"cyclepool sim --list\")", rest[0])}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	res := sc.Run(*seed)
	if *svg != "" {
		f, err := os.Create(*svg)
		if err != nil {
			return err
		}
		if err := sim.SVG(f, res.Plot); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if *asJSON {
		return sim.WriteJSON(os.Stdout, res)
	}
	return sim.WriteTable(os.Stdout, res)
}
