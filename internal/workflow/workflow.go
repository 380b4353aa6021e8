// Package workflow parses and validates workflow files: the JSON documents in
// which an owner describes a DAG of tasks (docs/WORKFLOW.md).
//
// Parse is strict: a file is accepted whole or refused whole with an *Error
// naming the first problem in file order. An accepted file comes back as a
// *Spec with every default filled in, its tasks' dependencies resolved to
// indexes and a topological order computed.
package workflow

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Limits of a workflow file.
const (
	MaxFileSize      = 8 << 20 // bytes of JSON
	MaxTasks         = 100000
	MaxNameLen       = 200 // characters of the workflow name
	MaxTaskNameLen   = 128 // bytes of a task name
	MaxInputNameLen  = 255 // bytes of an input file name
	MaxOutputNameLen = 1024
	MaxModulePathLen = 4096
	MaxAttemptsLimit = 100
	MaxTimeout       = 24 * time.Hour
	MaxMemoryMiB     = 4096
	MaxOutputMiB     = 64 << 10 // large outputs are uploaded over HTTP
	// MaxReplicatedOutputMiB bounds the outputs of a replicated task:
	// they travel in its result frame (compared by hash), of at most
	// protocol.DefaultMaxFrameBytes.
	MaxReplicatedOutputMiB = 64
	MaxLogKiB              = 8192
	MinCheckpointTime      = time.Second
	MaxReplicas            = 16 // replicas of a task started at first (result verification)
	MaxEnv                 = 256
	MaxEnvBytes            = 64 << 10 // names and values of one task together
	MaxFiles               = 1000     // entries of one task's files
	MaxDataBytes           = 1 << 20  // inline data of one task's files together
	// MaxPathLen and MaxPathNameLen bound a path of a task's file system
	// and each name in it: a worker lays the path out under a directory of
	// its own, and a host refuses a path over 4,096 bytes or a name over
	// 255 (PATH_MAX, NAME_MAX), which would fail every attempt on every
	// worker as the worker's fault, charged to nobody, for ever.
	MaxPathLen     = 3072
	MaxPathNameLen = 255
	MaxOutputPaths = 100
	MaxScratchMiB  = 64 << 10
)

// Defaults applied to fields left out of a task.
const (
	DefaultTimeout            = time.Hour
	DefaultMaxAttempts        = 3
	DefaultMemoryMiB          = 256
	DefaultOutputMiB          = 1024
	DefaultLogKiB             = 1024
	DefaultCheckpointInterval = 30 * time.Second
	DefaultOutput             = "stdout"
	DefaultScratchMiB         = 1024
)

// WasmPageSize is the size of a WebAssembly memory page in bytes.
const WasmPageSize = 65536

// Priority is a workflow's scheduling class.
type Priority string

// Priorities. Interactive work is scheduled first; waiting batch work ages so
// that it never starves.
const (
	Interactive Priority = "interactive"
	Batch       Priority = "batch"
)

// Error is a refusal of a workflow file. Task is the name of the task the
// problem is in and Field the path of the field inside that task (for example
// "inputs.a" or "limits.memory_mib"); both are empty when they do not apply.
// When a task has no usable name, Task is empty and Field starts with
// "tasks[i]" (i counting from 0).
type Error struct {
	Task  string `json:"task,omitempty"`
	Field string `json:"field,omitempty"`
	Msg   string `json:"error"`
}

// Error formats the refusal as `task "sum": field "inputs.a": names unknown
// task "count-9"`, leaving out the parts that are empty.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Task != "" {
		b.WriteString("task ")
		b.WriteString(strconv.Quote(e.Task))
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString("field ")
		b.WriteString(strconv.Quote(e.Field))
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Spec is a parsed, valid workflow file with its defaults resolved.
type Spec struct {
	Name     string
	Priority Priority
	// Replicas is how many replicas of every task run at first and Quorum
	// how many identical results (by hash) accept a task (1 and 1: no
	// verification). Quorum defaults to a majority of Replicas.
	Replicas int
	Quorum   int
	Tasks    []TaskSpec

	byName map[string]int
	deps   [][]int
	order  []int
	file   fileJSON // the file as written, for Marshal
}

// TaskSpec is one task of a Spec.
type TaskSpec struct {
	Name   string
	Module string // a module id ("sha256:<hex>") or a path (see IsModuleID)
	Args   []string
	// Inputs are the task's input files, sorted by file name.
	Inputs []Input
	// Stdin is what the task reads on standard input; nil means empty.
	Stdin              *Stdin
	Timeout            time.Duration
	MaxAttempts        int
	MemoryBytes        int64 // limit of the task's linear memory
	OutputBytes        int64 // limit of all outputs together
	LogBytes           int64 // stderr kept as the task's log
	CheckpointInterval time.Duration
	// Env holds the task's environment variables as "NAME=value", sorted
	// by name.
	Env []string
	// Cwd is the task's working directory, "/" by default.
	Cwd string
	// Files are the entries of the task's file system beyond /in and
	// /out, sorted by path.
	Files []File
	// Outputs are the paths outside /out whose files are outputs too.
	Outputs []string
	// ScratchBytes bounds what the task writes outside /out.
	ScratchBytes int64
}

// File is one entry of a task's file system at Path, an absolute clean
// path: inline Data, the blob Blob (an id or, before the CLI pushed it, a
// path), or an upstream task's output Source. Archive blobs are unpacked
// as a directory tree; Writable ones are copied for the task to change.
type File struct {
	Path     string
	Data     *string
	Blob     string
	Archive  bool
	Writable bool
	Source   *Source
}

// HasSetup reports whether the task has an environment or files of its own
// (its assignment then carries a protocol.Setup).
func (t *TaskSpec) HasSetup() bool {
	return len(t.Env) > 0 || t.Cwd != "/" || len(t.Files) > 0 || len(t.Outputs) > 0
}

// MemoryPages is the memory limit in 64 KiB WebAssembly pages.
func (t *TaskSpec) MemoryPages() uint32 { return uint32(t.MemoryBytes / WasmPageSize) }

// Source names an output of an upstream task.
type Source struct {
	From   string // upstream task name
	Task   int    // upstream task index in Spec.Tasks
	Output string // output name, "stdout" by default
}

// Input is an input file of a task: file /in/<File> holds the output Source.
type Input struct {
	File string
	Source
}

// Stdin is a task's standard input: either an upstream output (Source is
// non-nil) or inline data.
type Stdin struct {
	Source *Source
	Data   string
}

// Index returns the index of the task called name.
func (s *Spec) Index(name string) (int, bool) {
	i, ok := s.byName[name]
	return i, ok
}

// Order returns the task indexes in a topological order: every task comes
// after all the tasks it takes input from. Among ready tasks, file order is
// kept, so the order is deterministic.
func (s *Spec) Order() []int { return append([]int(nil), s.order...) }

// Deps returns the distinct indexes of the tasks task i takes input from
// (inputs and stdin), ascending.
func (s *Spec) Deps(i int) []int { return append([]int(nil), s.deps[i]...) }

// IsModuleID reports whether a module reference is a module id,
// "sha256:" followed by 64 lower-case hex digits. Any other reference is a
// path to a .wasm file, which the CLI pushes first.
func IsModuleID(m string) bool {
	const p = "sha256:"
	if len(m) != len(p)+64 || !strings.HasPrefix(m, p) {
		return false
	}
	for _, c := range m[len(p):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ModulePaths returns the distinct module references that are paths, not ids,
// in file order.
func (s *Spec) ModulePaths() []string {
	var out []string
	seen := map[string]bool{}
	for _, t := range s.Tasks {
		if !IsModuleID(t.Module) && !seen[t.Module] {
			seen[t.Module] = true
			out = append(out, t.Module)
		}
	}
	return out
}

// SetModule replaces the module reference of task i, for example a path by
// the id the module got when pushed. The new reference is validated.
func (s *Spec) SetModule(i int, module string) error {
	if i < 0 || i >= len(s.Tasks) {
		return fmt.Errorf("workflow: task index %d out of range", i)
	}
	if msg := checkModule(module); msg != "" {
		return &Error{Task: s.Tasks[i].Name, Field: "module", Msg: msg}
	}
	s.Tasks[i].Module = module
	s.file.Tasks[i].Module = module
	return nil
}

// ReplaceModule sets the module of every task whose module is old to new and
// returns how many tasks changed.
func (s *Spec) ReplaceModule(old, new string) (int, error) {
	n := 0
	for i := range s.Tasks {
		if s.Tasks[i].Module == old {
			if err := s.SetModule(i, new); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}
