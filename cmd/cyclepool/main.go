// Command cyclepool is the one binary of cyclepool: it runs the server
// (serve), a headless worker (worker), manages owner tokens (token), and
// gives owners their commands: module push, submit, status, wait, results,
// cancel and list. docs/CLI.md describes the owner commands.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/wasmworker/headless"
)

// command is one subcommand of the binary.
type command struct {
	name    string
	usage   string // the synopsis after "cyclepool "
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands returns every subcommand, in the order help lists them.
func commands() []command {
	return []command{
		{"serve", "serve [--addr :8080] [--database-url URL] [--data-dir DIR]", "run the server", runServe},
		{"worker", "worker --server URL [--slots N] [--cache-dir DIR]", "run a headless worker", runWorker},
		{"token", "token create NAME [--data-dir DIR | --database-url URL]", "create an owner token", runToken},
		{"sim", "sim SCENARIO [--json] [--seed N] | --list", "run a scheduling simulation", runSim},
		{"module", "module push FILE.wasm... | module list | module rm ID...", "push WebAssembly modules (prints their ids), list or remove them", runModule},
		{"data", "data push [--archive] FILE|DIR... | data list | data rm ID...", "push data files and directories tasks mount (prints their ids), list or remove them", runData},
		{"submit", "submit WORKFLOW.json [--wait D]", "push the workflow's module and data paths and submit it (prints the workflow id); with --wait, wait for its end as wait does", runSubmit},
		{"status", "status ID [--watch] [--json]", "show a workflow's tasks, once or live", runStatus},
		{"wait", "wait ID [--timeout 10m]", "wait until a workflow ends (exit 0 done, 1 failed, 2 cancelled, 3 timed out)", runWait},
		{"results", "results ID -o DIR", "download every done task's outputs to DIR/<task>/<output>", runResults},
		{"logs", "logs ID TASK", "print a task's log (its stderr)", runLogs},
		{"attempts", "attempts ID TASK [--json]", "list a task's attempts: worker, times, reason", runAttempts},
		{"cancel", "cancel ID [--task NAME]", "cancel a workflow's unfinished tasks, or one task", runCancel},
		{"delete", "delete ID...", "delete workflows that have ended, with their outputs (cancel a running one first)", runDelete},
		{"list", "list [--state S] [--limit N] [--offset N] [-q TEXT] [--json]", "list recent workflows, newest first", runList},
		{"workers", "workers [--json]", "list the connected workers: stability class, reasons, reputation, tasks done", runWorkers},
		{"version", "version", "print this build's version", runVersion},
	}
}

func main() {
	headless.ServeSlotIfChild() // a worker's slot process runs here and exits
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// dispatch runs the command named by args[0] and returns the exit status.
func dispatch(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return 1
	}
	name := args[0]
	switch name {
	case "--version", "-version":
		name, args = "version", []string{"version"}
	}
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c, ok := lookup(args[1]); ok {
				return dispatch(ctx, []string{c.name, "-h"}, stderr)
			}
			fmt.Fprintf(stderr, "cyclepool: unknown command %q\n", args[1])
			printUsage(stderr)
			return 1
		}
		printUsage(stderr)
		return 0
	}
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "cyclepool: unknown command %q (run \"cyclepool help\" for the list)\n", name)
		return 1
	}
	err := c.run(ctx, args[1:])
	var ee *exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintln(stderr, "cyclepool: "+ee.msg)
		}
		return ee.code
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "cyclepool: interrupted")
		return 130
	default:
		msg := err.Error()
		if ae := (*client.APIError)(nil); errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
			msg += "\n  an owner command needs an owner token: --token TOKEN or CYCLEPOOL_TOKEN " +
				"(cyclepool serve prints one at its first start; cyclepool token create NAME makes more)"
		}
		fmt.Fprintln(stderr, "cyclepool: "+msg)
		return 1
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// printUsage lists every command.
func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: cyclepool COMMAND [ARGS] [FLAGS]")
	fmt.Fprintln(w)
	printCommands(w)
	fmt.Fprintln(w)
	fmt.Fprintln(w, `Run "cyclepool COMMAND -h" for a command's flags. Owner commands read`)
	fmt.Fprintln(w, "--server (or CYCLEPOOL_SERVER, default "+defaultServer+") and --token (or CYCLEPOOL_TOKEN).")
}

func printCommands(w io.Writer) {
	fmt.Fprintln(w, "commands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.usage, c.summary)
	}
	fmt.Fprintln(tw, "  help [COMMAND]\tshow this list or a command's flags")
	tw.Flush()
}

// exitError ends the program with a given status, printing msg (if any)
// as "cyclepool: msg".
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.msg
}

// usageError is a mistake in a command's arguments; it names the synopsis.
func usageError(name, format string, a ...any) error {
	c, _ := lookup(name)
	return fmt.Errorf("%s: %s (usage: cyclepool %s)", name, fmt.Sprintf(format, a...), c.usage)
}

// newFlagSet returns a FlagSet whose -h output shows the command's synopsis
// and its flags.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		w := fs.Output()
		c, _ := lookup(name)
		fmt.Fprintf(w, "usage: cyclepool %s\n\n%s.\n", c.usage, c.summary)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
		fmt.Fprintln(w, "\nEvery command: cyclepool help.")
	}
	return fs
}

// flagInError finds the flag a flag package error names.
var flagInError = regexp.MustCompile(`flag:? -(\S+?):? `)

// parseFlags parses args with flags allowed before and after positional
// arguments and returns the positional ones. A mistake is an error of the
// command's, with "cyclepool: " in front as every error, not the usage
// the flag package prints; -h prints the usage (flag.ErrHelp).
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var buf bytes.Buffer
	out := fs.Output()
	fs.SetOutput(&buf)
	err := fs.Parse(reorderArgs(fs, args))
	fs.SetOutput(out)
	if err == nil {
		return fs.Args(), nil
	}
	if errors.Is(err, flag.ErrHelp) {
		out.Write(buf.Bytes())
		return nil, err
	}
	msg := err.Error()
	if m := flagInError.FindStringSubmatch(msg + " "); m != nil {
		if f := fs.Lookup(m[1]); f != nil {
			if g, ok := f.Value.(flag.Getter); ok {
				if _, ok := g.Get().(time.Duration); ok {
					msg += ": a duration takes its unit, as in 30s, 5m or 1h"
				}
			}
		}
	}
	cmd, _, _ := strings.Cut(fs.Name(), " ")
	return nil, &exitError{code: 1, msg: fmt.Sprintf("%s: %s (its flags: cyclepool help %s)", fs.Name(), msg, cmd)}
}

// reorderArgs moves flags (and the values of non-boolean flags given as a
// separate argument) in front of the positional arguments, so that
// "status ID --watch" parses like "status --watch ID". Everything after
// "--" stays positional.
func reorderArgs(fs *flag.FlagSet, args []string) []string {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // unknown: Parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	if len(positional) == 0 {
		return flags
	}
	return append(append(flags, "--"), positional...)
}

// defaultServer is the server owner commands talk to when neither --server
// nor CYCLEPOOL_SERVER says otherwise.
const defaultServer = "http://localhost:8080"

// ownerFlags are the connection flags every owner command takes.
type ownerFlags struct {
	server, token string
}

func addOwnerFlags(fs *flag.FlagSet) *ownerFlags {
	o := &ownerFlags{}
	fs.StringVar(&o.server, "server", "", "server URL (default $CYCLEPOOL_SERVER or "+defaultServer+")")
	fs.StringVar(&o.token, "token", "", "owner token (default $CYCLEPOOL_TOKEN)")
	return o
}

// client returns a client for the chosen server and token.
func (o *ownerFlags) client() *client.Client {
	server := firstNonEmpty(o.server, os.Getenv("CYCLEPOOL_SERVER"), defaultServer)
	token := firstNonEmpty(o.token, os.Getenv("CYCLEPOOL_TOKEN"))
	return client.New(server, token, client.WithUserAgent("cyclepool-cli/1"))
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// oneID checks that exactly one positional argument, a workflow id or a
// unique start of one, was given, and returns the workflow's whole id.
func oneID(ctx context.Context, c *client.Client, name string, args []string) (string, error) {
	if len(args) != 1 || args[0] == "" {
		return "", usageError(name, "expected one workflow ID, got %d arguments", len(args))
	}
	return c.ResolveID(ctx, args[0])
}
