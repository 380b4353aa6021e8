package workflow

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The file as written. Optional fields are pointers so that Marshal gives back
// what the owner wrote, not the resolved defaults.
type fileJSON struct {
	Name     string     `json:"name"`
	Priority *string    `json:"priority,omitempty"`
	Replicas *int       `json:"replicas,omitempty"`
	Quorum   *int       `json:"quorum,omitempty"`
	Tasks    []taskJSON `json:"tasks"`
}

type taskJSON struct {
	Name               string                     `json:"name"`
	Module             string                     `json:"module"`
	Args               []string                   `json:"args,omitempty"`
	Inputs             map[string]refJSON         `json:"inputs,omitempty"`
	Stdin              *stdinJSON                 `json:"stdin,omitempty"`
	Timeout            *string                    `json:"timeout,omitempty"`
	MaxAttempts        *int                       `json:"max_attempts,omitempty"`
	Limits             *limitsJSON                `json:"limits,omitempty"`
	CheckpointInterval *string                    `json:"checkpoint_interval,omitempty"`
	Env                map[string]string          `json:"env,omitempty"`
	Cwd                *string                    `json:"cwd,omitempty"`
	Files              map[string]*fileSourceJSON `json:"files,omitempty"`
	Outputs            []string                   `json:"outputs,omitempty"`
}

// fileSourceJSON is what a path of a task's file system holds.
type fileSourceJSON struct {
	Blob     *string `json:"blob,omitempty"`
	Archive  *bool   `json:"archive,omitempty"`
	Writable *bool   `json:"writable,omitempty"`
	Data     *string `json:"data,omitempty"`
	From     *string `json:"from,omitempty"`
	Output   *string `json:"output,omitempty"`
}

type refJSON struct {
	From   *string `json:"from,omitempty"`
	Output *string `json:"output,omitempty"`
}

type stdinJSON struct {
	From   *string `json:"from,omitempty"`
	Output *string `json:"output,omitempty"`
	Data   *string `json:"data,omitempty"`
}

type limitsJSON struct {
	MemoryMiB  *int `json:"memory_mib,omitempty"`
	OutputMiB  *int `json:"output_mib,omitempty"`
	LogKiB     *int `json:"log_kib,omitempty"`
	ScratchMiB *int `json:"scratch_mib,omitempty"`
}

// Parse parses and validates a workflow file. A refused file gives an *Error
// for the first problem in file order: first the structure (JSON syntax,
// unknown fields, duplicate keys, nulls, types), then each task's fields in
// turn, then cycles.
func Parse(data []byte) (*Spec, error) {
	if len(data) > MaxFileSize {
		return nil, &Error{Msg: fmt.Sprintf("file is %d bytes, more than the limit of %d (8 MiB)", len(data), MaxFileSize)}
	}
	if !utf8.Valid(data) {
		return nil, &Error{Msg: "file is not valid UTF-8"}
	}
	if f, ok := fastDecode(data); ok {
		return build(f)
	}
	if err := scan(data); err != nil {
		return nil, err
	}
	f, err := decode(data)
	if err != nil {
		// scan accepted the file, so this should not happen.
		return nil, &Error{Msg: fmt.Sprintf("invalid workflow file: %v", err)}
	}
	return build(f)
}

// decode decodes a file that scan accepted.
func decode(data []byte) (fileJSON, error) {
	var f fileJSON
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	err := dec.Decode(&f)
	return f, err
}

// build validates a decoded file and resolves it into a Spec.
func build(f fileJSON) (*Spec, error) {
	s := &Spec{Name: f.Name, Priority: Batch, file: f}
	if f.Name == "" {
		return nil, &Error{Field: "name", Msg: "is required"}
	}
	if n := utf8.RuneCountInString(f.Name); n > MaxNameLen {
		return nil, &Error{Field: "name", Msg: fmt.Sprintf("is %d characters long, more than %d", n, MaxNameLen)}
	}
	if strings.IndexFunc(f.Name, unicode.IsControl) >= 0 {
		return nil, &Error{Field: "name", Msg: "must not contain control characters"}
	}
	if f.Priority != nil {
		switch p := Priority(*f.Priority); p {
		case Interactive, Batch:
			s.Priority = p
		default:
			return nil, &Error{Field: "priority", Msg: fmt.Sprintf("must be %q or %q, not %q", Interactive, Batch, *f.Priority)}
		}
	}
	s.Replicas, s.Quorum = 1, 1
	if f.Replicas != nil {
		if *f.Replicas < 1 || *f.Replicas > MaxReplicas {
			return nil, &Error{Field: "replicas", Msg: fmt.Sprintf("must be 1 to %d, not %d", MaxReplicas, *f.Replicas)}
		}
		s.Replicas = *f.Replicas
		s.Quorum = s.Replicas/2 + 1
	}
	if f.Quorum != nil {
		if *f.Quorum < 1 || *f.Quorum > s.Replicas {
			return nil, &Error{Field: "quorum", Msg: fmt.Sprintf("must be 1 to replicas (%d), not %d", s.Replicas, *f.Quorum)}
		}
		s.Quorum = *f.Quorum
	}
	if len(f.Tasks) == 0 {
		return nil, &Error{Field: "tasks", Msg: "must hold at least one task"}
	}
	if len(f.Tasks) > MaxTasks {
		return nil, &Error{Field: "tasks", Msg: fmt.Sprintf("%d tasks, more than the limit of %d", len(f.Tasks), MaxTasks)}
	}

	// Index the names first so that inputs may name tasks further down.
	s.byName = make(map[string]int, len(f.Tasks))
	for i, t := range f.Tasks {
		if _, dup := s.byName[t.Name]; !dup {
			s.byName[t.Name] = i
		}
	}
	s.Tasks = make([]TaskSpec, len(f.Tasks))
	s.deps = make([][]int, len(f.Tasks))
	for i := range f.Tasks {
		if err := s.buildTask(i, &f.Tasks[i]); err != nil {
			return nil, err
		}
	}
	if err := s.sort(); err != nil {
		return nil, err
	}
	return s, nil
}

var nameChar = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	t['.'], t['_'], t['-'] = true, true, true
	return
}()

// checkTaskName returns "" or what is wrong with a task name.
func checkTaskName(n string) string {
	if n == "" {
		return "is required"
	}
	if len(n) > MaxTaskNameLen {
		return fmt.Sprintf("is %d bytes long, more than %d", len(n), MaxTaskNameLen)
	}
	for i := 0; i < len(n); i++ {
		if !nameChar[n[i]] {
			return fmt.Sprintf("%q may hold only letters, digits, '.', '_' and '-'", n)
		}
	}
	return ""
}

// checkModule returns "" or what is wrong with a module reference.
func checkModule(m string) string {
	switch {
	case m == "":
		return "is required"
	case strings.HasPrefix(m, "sha256:") && !IsModuleID(m):
		return fmt.Sprintf("%q is not a module id (sha256: and 64 lower-case hex digits)", m)
	case len(m) > MaxModulePathLen:
		return fmt.Sprintf("path is %d bytes long, more than %d", len(m), MaxModulePathLen)
	case strings.ContainsRune(m, 0):
		return "path must not contain NUL"
	}
	return ""
}

func checkInputName(n string) string {
	switch {
	case n == "":
		return "input file name must not be empty"
	case n == "." || n == "..":
		return fmt.Sprintf("input file name must not be %q", n)
	case strings.ContainsAny(n, "/\\\x00"):
		return fmt.Sprintf("input file name %q must not contain '/', '\\' or NUL", n)
	case len(n) > MaxInputNameLen:
		return fmt.Sprintf("input file name is %d bytes long, more than %d", len(n), MaxInputNameLen)
	}
	return ""
}

// CheckOutputName says what is wrong with an output name ("" when
// nothing): the rule the workflow file's "output" fields follow, which the
// server also applies to the outputs a worker reports. A name is a clean
// relative path (a file under /out, or "stdout"), or a clean absolute one
// outside /in and /out (a file of the task's "outputs").
func CheckOutputName(o string) string { return checkOutputName(o) }

func checkOutputName(o string) string {
	if rel, ok := strings.CutPrefix(o, "/"); ok {
		// An output declared by its path outside /out ("outputs").
		if msg := checkPath(o); msg != "" || rel == "" {
			return fmt.Sprintf("output name %q: an absolute output name must be a clean path outside /in and /out", o)
		}
		o = rel
	}
	switch {
	case o == "":
		return "output name must not be empty"
	case len(o) > MaxOutputNameLen:
		return fmt.Sprintf("output name is %d bytes long, more than %d", len(o), MaxOutputNameLen)
	case strings.ContainsAny(o, "\\\x00"):
		return fmt.Sprintf("output name %q must not contain '\\' or NUL", o)
	case path.IsAbs(o) || path.Clean(o) != o || o == "." || o == ".." || strings.HasPrefix(o, "../"):
		return fmt.Sprintf("output name %q must be a clean relative path (like \"stdout\" or \"dir/file\")", o)
	}
	for _, part := range strings.Split(o, "/") {
		if len(part) > MaxInputNameLen {
			return fmt.Sprintf("output name %q has a path element longer than %d bytes", o, MaxInputNameLen)
		}
	}
	return ""
}

func parseDuration(v *string, def, min, max time.Duration) (time.Duration, string) {
	if v == nil {
		return def, ""
	}
	d, err := time.ParseDuration(*v)
	if err != nil {
		return 0, fmt.Sprintf("%q is not a duration (like \"90s\", \"10m\" or \"1h30m\")", *v)
	}
	if d < min || d > max {
		return 0, fmt.Sprintf("%s is out of range (%s to %s)", *v, fmtDur(min), fmtDur(max))
	}
	return d, ""
}

func fmtDur(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	return strings.TrimSuffix(s, "0m")
}

func intField(v *int, def, min, max int) (int, string) {
	if v == nil {
		return def, ""
	}
	if *v < min || *v > max {
		return 0, fmt.Sprintf("%d is out of range (%d to %d)", *v, min, max)
	}
	return *v, ""
}

// source resolves a reference to an upstream output of task i.
func (s *Spec) source(i int, from, output *string) (*Source, *Error) {
	self := s.file.Tasks[i].Name
	if from == nil || *from == "" {
		return nil, &Error{Msg: "\"from\" is required"}
	}
	j, ok := s.byName[*from]
	if !ok {
		return nil, &Error{Msg: fmt.Sprintf("names unknown task %q", *from)}
	}
	if *from == self {
		return nil, &Error{Msg: "takes input from its own task"}
	}
	out := DefaultOutput
	if output != nil {
		if msg := checkOutputName(*output); msg != "" {
			return nil, &Error{Msg: msg}
		}
		out = *output
	}
	if strings.HasPrefix(out, "/") && !slices.ContainsFunc(s.file.Tasks[j].Outputs, func(o string) bool {
		return out == o || strings.HasPrefix(out, o+"/")
	}) {
		return nil, &Error{Msg: fmt.Sprintf("output %q is not under a path of task %q's \"outputs\"", out, *from)}
	}
	return &Source{From: *from, Task: j, Output: out}, nil
}

func (s *Spec) buildTask(i int, tj *taskJSON) error {
	fail := func(field, msg string) error {
		e := &Error{Task: tj.Name, Field: field, Msg: msg}
		if checkTaskName(tj.Name) != "" {
			e.Task = ""
			e.Field = fmt.Sprintf("tasks[%d]", i)
			if field != "" {
				e.Field += "." + field
			}
		}
		return e
	}
	if msg := checkTaskName(tj.Name); msg != "" {
		return fail("name", msg)
	}
	if first := s.byName[tj.Name]; first != i {
		return fail("name", fmt.Sprintf("duplicate task name: tasks[%d] and tasks[%d] are both called %q", first, i, tj.Name))
	}
	if msg := checkModule(tj.Module); msg != "" {
		return fail("module", msg)
	}
	for j, a := range tj.Args {
		// argv strings are C strings: a NUL would end one early (and
		// PostgreSQL's text cannot hold it).
		if strings.IndexByte(a, 0) >= 0 {
			return fail("args", fmt.Sprintf("argument %d contains a NUL character, which a program's arguments cannot hold", j))
		}
		if !utf8.ValidString(a) {
			return fail("args", fmt.Sprintf("argument %d is not valid UTF-8", j))
		}
	}
	if msg := checkAssignHeader(tj.Args, tj.Inputs); msg != "" {
		return fail("args", msg)
	}
	t := &s.Tasks[i]
	t.Name, t.Module = tj.Name, tj.Module
	t.Args = append([]string(nil), tj.Args...)

	files := make([]string, 0, len(tj.Inputs))
	for f := range tj.Inputs {
		files = append(files, f)
	}
	sort.Strings(files)
	deps := map[int]bool{}
	for _, f := range files {
		field := "inputs." + f
		if msg := checkInputName(f); msg != "" {
			return fail(field, msg)
		}
		r := tj.Inputs[f]
		src, err := s.source(i, r.From, r.Output)
		if err != nil {
			return fail(field, err.Msg)
		}
		t.Inputs = append(t.Inputs, Input{File: f, Source: *src})
		deps[src.Task] = true
	}
	if in := tj.Stdin; in != nil {
		switch {
		case in.Data != nil && (in.From != nil || in.Output != nil):
			return fail("stdin", "takes either \"from\" (and \"output\") or \"data\", not both")
		case in.Data != nil:
			t.Stdin = &Stdin{Data: *in.Data}
		default:
			src, err := s.source(i, in.From, in.Output)
			if err != nil {
				return fail("stdin", err.Msg)
			}
			t.Stdin = &Stdin{Source: src}
			deps[src.Task] = true
		}
	}
	for j := range deps {
		s.deps[i] = append(s.deps[i], j)
	}
	sort.Ints(s.deps[i])

	var msg string
	if t.Timeout, msg = parseDuration(tj.Timeout, DefaultTimeout, time.Second, MaxTimeout); msg != "" {
		return fail("timeout", msg)
	}
	if t.MaxAttempts, msg = intField(tj.MaxAttempts, DefaultMaxAttempts, 1, MaxAttemptsLimit); msg != "" {
		return fail("max_attempts", msg)
	}
	var l limitsJSON
	if tj.Limits != nil {
		l = *tj.Limits
	}
	var n int
	if n, msg = intField(l.MemoryMiB, DefaultMemoryMiB, 1, MaxMemoryMiB); msg != "" {
		return fail("limits.memory_mib", msg)
	}
	t.MemoryBytes = int64(n) << 20
	outDefault, outMax := DefaultOutputMiB, MaxOutputMiB
	if s.Replicas > 1 || s.Quorum > 1 {
		outDefault, outMax = MaxReplicatedOutputMiB, MaxReplicatedOutputMiB
	}
	if n, msg = intField(l.OutputMiB, outDefault, 1, outMax); msg != "" {
		if outMax == MaxReplicatedOutputMiB {
			msg += " (a replicated task's outputs travel in its result frame)"
		}
		return fail("limits.output_mib", msg)
	}
	t.OutputBytes = int64(n) << 20
	if n, msg = intField(l.LogKiB, DefaultLogKiB, 1, MaxLogKiB); msg != "" {
		return fail("limits.log_kib", msg)
	}
	t.LogBytes = int64(n) << 10
	if t.CheckpointInterval, msg = parseDuration(tj.CheckpointInterval, DefaultCheckpointInterval, MinCheckpointTime, MaxTimeout); msg != "" {
		return fail("checkpoint_interval", msg)
	}
	if n, msg = intField(l.ScratchMiB, DefaultScratchMiB, 1, MaxScratchMiB); msg != "" {
		return fail("limits.scratch_mib", msg)
	}
	t.ScratchBytes = int64(n) << 20
	if field, msg := s.buildSetup(i, tj, t); msg != "" {
		return fail(field, msg)
	}
	for _, f := range t.Files {
		if f.Source != nil && !slices.Contains(s.deps[i], f.Source.Task) {
			s.deps[i] = append(s.deps[i], f.Source.Task)
		}
	}
	sort.Ints(s.deps[i])
	return nil
}

// sort computes a topological order (Kahn's algorithm, ready tasks in file
// order) or refuses the first cycle.
func (s *Spec) sort() error {
	n := len(s.Tasks)
	indeg := make([]int, n)
	down := make([][]int, n)
	for i, ds := range s.deps {
		indeg[i] = len(ds)
		for _, d := range ds {
			down[d] = append(down[d], i)
		}
	}
	// A min-heap would keep strict file order among ready tasks; a FIFO seeded
	// in file order is deterministic and linear, which is what matters.
	queue := make([]int, 0, n)
	for i := range n {
		if indeg[i] == 0 {
			queue = append(queue, i)
		}
	}
	for k := 0; k < len(queue); k++ {
		for _, c := range down[queue[k]] {
			if indeg[c]--; indeg[c] == 0 {
				queue = append(queue, c)
			}
		}
	}
	if len(queue) == n {
		s.order = queue
		return nil
	}
	return s.cycleError(indeg)
}

// cycleError finds a cycle among the tasks left with unmet dependencies and
// spells it out in the direction data flows: "a -> b" means b takes input
// from a.
func (s *Spec) cycleError(indeg []int) error {
	// Every task left has a dependency that is also left; walk dependencies
	// from the first such task until one repeats.
	start := 0
	for indeg[start] == 0 {
		start++
	}
	pos := map[int]int{}
	var walk []int
	for v := start; ; {
		if p, ok := pos[v]; ok {
			walk = walk[p:]
			break
		}
		pos[v] = len(walk)
		walk = append(walk, v)
		for _, d := range s.deps[v] {
			if indeg[d] > 0 {
				v = d
				break
			}
		}
	}
	// walk follows consumer -> producer; reverse it and start at the task
	// that comes first in the file.
	for l, r := 0, len(walk)-1; l < r; l, r = l+1, r-1 {
		walk[l], walk[r] = walk[r], walk[l]
	}
	min := 0
	for k, v := range walk {
		if v < walk[min] {
			min = k
		}
	}
	walk = append(walk[min:], walk[:min]...)
	names := make([]string, 0, len(walk)+1)
	for _, v := range walk {
		names = append(names, s.Tasks[v].Name)
	}
	names = append(names, names[0])
	return &Error{Msg: "cycle: " + strings.Join(names, " -> ")}
}

// Marshal serialises the workflow file back to JSON: the file as written
// (optional fields that were left out stay out), with any module references
// changed by SetModule or ReplaceModule. Parse accepts the result and gives an
// equal Spec.
func (s *Spec) Marshal() ([]byte, error) {
	b, err := json.Marshal(s.file)
	if err != nil {
		return nil, fmt.Errorf("workflow: marshal: %w", err)
	}
	return b, nil
}
