package main

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cyclepool/cyclepool/client"
)

// The status view: a pure rendering of a status object into lines of at
// most a given width, used by "status" (once), "status --watch" (redrawn
// live on a terminal) and, for one line per change, when stdout is not a
// terminal.

// defaultWidth is the width used when neither COLUMNS nor the terminal
// says otherwise.
const defaultWidth = 100

// termSize returns the width and height to render for on f: COLUMNS and
// LINES when set, else the terminal's size, else defaultWidth and 0 (no
// height limit). tty says whether f is a terminal.
func termSize(f *os.File) (width, height int, tty bool) {
	cols, rows, tty := ttySize(f)
	width, height = defaultWidth, 0
	if tty {
		width, height = cols, rows
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		width = n
	}
	if n, err := strconv.Atoi(os.Getenv("LINES")); err == nil && n > 0 && tty {
		height = n
	}
	return width, height, tty
}

// elapsed is how long the workflow has run: until it finished, or until now.
func elapsed(st *client.Status, now time.Time) string {
	if st.CreatedAt.IsZero() {
		return "-"
	}
	end := now
	if st.FinishedAt != nil {
		end = *st.FinishedAt
	}
	d := end.Sub(st.CreatedAt)
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String()
}

// countsText lists the non-zero task counts: "3 tasks: 1 done, 2 running".
func countsText(st *client.Status) string {
	c := st.Counts
	total := c.Total()
	if total == 0 && len(st.Tasks) > 0 {
		c = client.CountTasks(st.Tasks)
		total = c.Total()
	}
	var parts []string
	for _, s := range client.TaskStates {
		if n := c.Get(s); n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	noun := "tasks"
	if total == 1 {
		noun = "task"
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d %s", total, noun)
	}
	return fmt.Sprintf("%d %s: %s", total, noun, strings.Join(parts, ", "))
}

// schedText is the header line on verification and efficiency, when there
// is something to say: "replicas 2, quorum 2; efficiency 83%, suggested
// parallelism 12 workers; 1 disputed result". "" otherwise.
func schedText(st *client.Status) string {
	var parts []string
	if st.Replicas > 1 || st.Quorum > 1 {
		parts = append(parts, fmt.Sprintf("replicas %d, quorum %d", st.Replicas, st.Quorum))
	}
	if st.Efficiency != nil {
		e := fmt.Sprintf("efficiency %.0f%%", *st.Efficiency*100)
		if p := st.SuggestedParallelism; p != nil {
			noun := "workers"
			if *p == 1 {
				noun = "worker"
			}
			e += fmt.Sprintf(", suggested parallelism %d %s", *p, noun)
		}
		parts = append(parts, e)
	}
	disputed := 0
	for _, t := range st.Tasks {
		if t.Disputed {
			disputed++
		}
	}
	if disputed > 0 {
		noun := "results"
		if disputed == 1 {
			noun = "result"
		}
		parts = append(parts, fmt.Sprintf("%d disputed %s", disputed, noun))
	}
	return strings.Join(parts, "; ")
}

// bar draws progress (0 to 1) as "[#####.....]  50%" with inner width w.
func bar(progress float64, w int) string {
	if math.IsNaN(progress) || progress < 0 {
		progress = 0
	}
	progress = min(progress, 1)
	n := int(progress * float64(w))
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", w-n) + "]" + fmt.Sprintf(" %3d%%", int(progress*100))
}

// fit cuts s to at most w columns, ending with "…" when cut.
func fit(s string, w int) string {
	if w <= 0 {
		return ""
	}
	if utf8.RuneCountInString(s) <= w {
		return s
	}
	r := []rune(s)
	return string(r[:w-1]) + "…"
}

// pad fits s to exactly w columns.
func pad(s string, w int) string {
	s = fit(s, w)
	return s + strings.Repeat(" ", w-utf8.RuneCountInString(s))
}

// rowPriority orders which tasks to show when they do not all fit: running
// first, then failed, ready, and the rest.
var rowPriority = map[string]int{
	client.TaskRunning: 0, client.TaskFailed: 1, client.TaskReady: 2, client.TaskBlocked: 3,
	client.TaskUpstreamFailed: 4, client.TaskCancelled: 5, client.TaskDone: 6,
}

// renderStatus draws the status view: a header with the workflow's state,
// counts and elapsed time, then one row per task (name, state, attempts,
// progress bar, checkpoints, error). No line is wider than width. When
// height > 0 and the tasks do not fit, it shows running tasks first (then
// failed, ready, ...) and a summary line for the rest.
func renderStatus(st *client.Status, width, height int, now time.Time) []string {
	width = max(width, 40)
	lines := []string{
		fit(fmt.Sprintf("workflow %s %q  %s  %s  elapsed %s", st.ID, st.Name, strings.ToUpper(st.State), st.Priority, elapsed(st, now)), width),
		fit(countsText(st), width),
	}
	if l := schedText(st); l != "" {
		lines = append(lines, fit(l, width))
	}
	if st.Notice != "" {
		lines = append(lines, fit("note: "+st.Notice, width))
	}
	if len(st.Tasks) == 0 {
		return lines
	}
	lines = append(lines, "")

	// Choose the rows.
	show := make([]bool, len(st.Tasks))
	room := len(st.Tasks)
	if height > 0 && len(lines)+1+len(st.Tasks) > height {
		room = max(height-len(lines)-2, 1) // the column header and the summary line
	}
	if room >= len(st.Tasks) {
		for i := range show {
			show[i] = true
		}
	} else {
		picked := 0
		for p := 0; p <= 6 && picked < room; p++ {
			for i, t := range st.Tasks {
				if picked < room && !show[i] && priorityOf(t.State) == p {
					show[i] = true
					picked++
				}
			}
		}
	}

	// Column widths.
	nameW, stateW, attW, ckW := len("TASK"), len("STATE"), len("ATT"), len("CKPT")
	for i, t := range st.Tasks {
		if show[i] {
			nameW = max(nameW, utf8.RuneCountInString(t.Name))
			stateW = max(stateW, len(t.State))
			attW = max(attW, len(attempts(t)))
			ckW = max(ckW, len(strconv.Itoa(t.Checkpoints)))
		}
	}
	nameW = min(nameW, max(12, width/4))
	const gap = 2
	fixed := nameW + gap + stateW + gap + attW + gap + 2 + 5 + gap + ckW // bar brackets and " 100%"
	// Room is kept for the error column only when a shown task has an error.
	errReserve := 0
	for i, t := range st.Tasks {
		if show[i] && t.Error != "" {
			errReserve = gap + 20
		}
	}
	barW := min(max(width-fixed-errReserve, 10), 30)
	errW := width - fixed - barW - gap
	if errW < 8 {
		barW = max(barW+errW-8, 5)
		errW = width - fixed - barW - gap
	}
	row := func(name, state, att, prog, ck, errText string) string {
		s := pad(name, nameW) + "  " + pad(state, stateW) + "  " + pad(att, attW) + "  " +
			pad(prog, barW+2+5) + "  " + strings.Repeat(" ", ckW-len(ck)) + ck
		if errText != "" && errW > 0 {
			s += "  " + fit(errText, errW)
		}
		return fit(s, width)
	}
	errHead := ""
	if errReserve > 0 {
		errHead = "ERROR"
	}
	lines = append(lines, strings.TrimRight(row("TASK", "STATE", "ATT", "PROGRESS", "CKPT", errHead), " "))
	hidden := client.Counts{}
	nHidden := 0
	for i, t := range st.Tasks {
		if !show[i] {
			nHidden++
			hidden.Add(t.State, 1)
			continue
		}
		p := t.Progress
		if t.State == client.TaskDone {
			p = 1
		}
		lines = append(lines, strings.TrimRight(row(t.Name, t.State, attempts(t), bar(p, barW), strconv.Itoa(t.Checkpoints), tableError(t.Error)), " "))
	}
	if nHidden > 0 {
		var parts []string
		for _, s := range client.TaskStates {
			if n := hidden.Get(s); n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, s))
			}
		}
		lines = append(lines, fit(fmt.Sprintf("… %d more: %s", nHidden, strings.Join(parts, ", ")), width))
	}
	return lines
}

func priorityOf(state string) int {
	if p, ok := rowPriority[state]; ok {
		return p
	}
	return 6
}

// attempts shows "attempts/max_attempts", or just attempts when the max is
// unknown.
func attempts(t client.Task) string {
	if t.MaxAttempts > 0 {
		return fmt.Sprintf("%d/%d", t.Attempts, t.MaxAttempts)
	}
	return strconv.Itoa(t.Attempts)
}

// failedAfter is how the server begins the error of a task that used up
// its attempts: "failed after 3 attempts; last: exit: exit code 1: …".
var failedAfter = regexp.MustCompile(`^failed after [0-9]+ attempts?; last: `)

// tableError is the error of a task as the table's ERROR column shows it:
// its first line, without the "failed after N attempts; last: " the ATT
// column says already, so that the reason itself fits in the few columns
// the table has left for it.
func tableError(s string) string {
	return failedAfter.ReplaceAllLiteralString(oneLine(s), "")
}

// oneLine keeps the first line of an error message.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// changeLines describes what changed from prev to cur, one line each,
// stamped with now: the workflow's first sight (prev == nil), task state
// changes, new attempts, and the workflow's state change. Progress alone
// prints nothing.
func changeLines(prev, cur *client.Status, now time.Time) []string {
	stamp := now.Format("15:04:05") + " "
	if prev == nil {
		out := []string{stamp + fmt.Sprintf("workflow %s %q: %s (%s)", cur.ID, cur.Name, cur.State, countsText(cur))}
		for _, t := range cur.Tasks {
			if t.State != client.TaskBlocked && t.State != client.TaskReady {
				out = append(out, stamp+taskLine(t, ""))
			}
		}
		if cur.Finished() {
			out = append(out, stamp+finalText(cur, now))
		}
		return out
	}
	var out []string
	for _, t := range cur.Tasks {
		old := prev.Task(t.Name)
		switch {
		case old == nil:
			out = append(out, stamp+taskLine(t, ""))
		case old.State != t.State:
			out = append(out, stamp+taskLine(t, old.State))
		case old.Attempts != t.Attempts && t.Attempts > 0:
			out = append(out, stamp+fmt.Sprintf("task %s: attempt %s", t.Name, attempts(t)))
		}
	}
	if prev.State != cur.State {
		if cur.Finished() {
			out = append(out, stamp+finalText(cur, now))
		} else {
			out = append(out, stamp+fmt.Sprintf("workflow %s: %s -> %s", cur.ID, prev.State, cur.State))
		}
	}
	return out
}

// taskLine describes a task's (new) state.
func taskLine(t client.Task, from string) string {
	s := "task " + t.Name + ": "
	if from != "" {
		s += from + " -> "
	}
	s += t.State
	switch t.State {
	case client.TaskRunning:
		s += " (attempt " + attempts(t) + ")"
	case client.TaskFailed:
		if t.Error != "" {
			s += ": " + oneLine(t.Error)
		}
	}
	return s
}
