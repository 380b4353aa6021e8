package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// redrawEvery bounds how often the live view is redrawn.
const redrawEvery = 100 * time.Millisecond

// runStatus is "cyclepool status ID [--watch] [--json]".
func runStatus(ctx context.Context, args []string) error {
	fs := newFlagSet("status")
	own := addOwnerFlags(fs)
	watch := fs.Bool("watch", false, "follow the workflow live until it ends")
	asJSON := fs.Bool("json", false, "print the status object as JSON (with --watch: one object per line and change)")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	id, err := oneID(ctx, own.client(), "status", rest)
	if err != nil {
		return err
	}
	c := own.client()
	width, height, tty := termSize(os.Stdout)
	if *watch {
		// Fail fast, before touching the screen, on an unknown workflow.
		if _, err := c.Status(ctx, id); err != nil {
			return err
		}
	}
	switch {
	case *asJSON && !*watch:
		raw, err := c.StatusJSON(ctx, id)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return fmt.Errorf("status of workflow %s: %w", id, err)
		}
		buf.WriteByte('\n')
		_, err = os.Stdout.Write(buf.Bytes())
		return err
	case *asJSON:
		return watchJSON(ctx, c, id, os.Stdout)
	case !*watch:
		st, err := c.Status(ctx, id)
		if err != nil {
			return err
		}
		_, err = io.WriteString(os.Stdout, strings.Join(renderStatus(st, width, 0, time.Now()), "\n")+"\n")
		return err
	case tty && height > 0:
		return watchLive(ctx, c, id, os.Stdout)
	default:
		return watchLines(ctx, c, id, os.Stdout)
	}
}

// watchJSON prints the status object, one compact line, at the start and
// whenever a task or the workflow changes state.
func watchJSON(ctx context.Context, c *client.Client, id string, w io.Writer) error {
	var prev *client.Status
	var werr error
	enc := json.NewEncoder(w)
	_, err := c.Watch(ctx, id, func(st *client.Status) {
		if prev != nil && len(changeLines(prev, st, time.Time{})) == 0 {
			return
		}
		if err := enc.Encode(st); err != nil && werr == nil {
			werr = err
		}
		prev = st.Clone()
	})
	if err != nil {
		return err
	}
	return werr
}

// watchLines prints one line per state change: the view for logs and pipes.
func watchLines(ctx context.Context, c *client.Client, id string, w io.Writer) error {
	var prev *client.Status
	var werr error
	_, err := c.Watch(ctx, id, func(st *client.Status) {
		for _, l := range changeLines(prev, st, time.Now()) {
			if _, err := fmt.Fprintln(w, l); err != nil && werr == nil {
				werr = err
			}
		}
		prev = st.Clone()
	})
	if err != nil {
		return err
	}
	return werr
}

// watchLive redraws the status view in place on a terminal, at most every
// redrawEvery, fitted to the terminal's current size, until the workflow
// ends; the last frame stays on screen.
func watchLive(ctx context.Context, c *client.Client, id string, out *os.File) error {
	var (
		mu     sync.Mutex
		latest *client.Status
		dirty  bool
	)
	done := make(chan struct{})
	var final *client.Status
	var werr error
	go func() {
		defer close(done)
		final, werr = c.Watch(ctx, id, func(st *client.Status) {
			cp := st.Clone()
			mu.Lock()
			latest, dirty = cp, true
			mu.Unlock()
		})
	}()

	io.WriteString(out, "\x1b[?25l\x1b[2J") // hide the cursor, clear the screen
	defer io.WriteString(out, "\x1b[?25h")  // show it again
	draw := func(st *client.Status) {
		width, height, _ := termSize(out)
		lines := renderStatus(st, width, height-1, time.Now())
		var b strings.Builder
		b.WriteString("\x1b[H")
		for _, l := range lines {
			b.WriteString(l)
			b.WriteString("\x1b[K\n")
		}
		b.WriteString("\x1b[J")
		io.WriteString(out, b.String())
	}
	tick := time.NewTicker(redrawEvery)
	defer tick.Stop()
	var shown *client.Status
	var drawn time.Time
	for {
		select {
		case <-done:
			if final != nil {
				draw(final)
			} else if shown != nil {
				draw(shown)
			}
			return werr
		case <-tick.C:
			mu.Lock()
			st, d := latest, dirty
			dirty = false
			mu.Unlock()
			if d {
				shown = st
			}
			// Redraw on a change, and every second for the elapsed time.
			if shown != nil && (d || time.Since(drawn) >= time.Second) {
				draw(shown)
				drawn = time.Now()
			}
		}
	}
}
