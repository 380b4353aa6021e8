package client

import "github.com/cyclepool/cyclepool/api"

// Workflow states, as reported in Status.State.
const (
	WorkflowRunning   = api.WorkflowRunning
	WorkflowDone      = api.WorkflowDone
	WorkflowFailed    = api.WorkflowFailed
	WorkflowCancelled = api.WorkflowCancelled
)

// Task states, as reported in Task.State.
const (
	TaskBlocked        = api.TaskBlocked
	TaskReady          = api.TaskReady
	TaskRunning        = api.TaskRunning
	TaskDone           = api.TaskDone
	TaskFailed         = api.TaskFailed
	TaskUpstreamFailed = api.TaskUpstreamFailed
	TaskCancelled      = api.TaskCancelled
)

// TaskStates lists every task state in lifecycle order.
var TaskStates = api.TaskStates

// Verdicts of a replicated task's attempt (Attempt.Verdict).
const (
	VerdictValid      = api.VerdictValid
	VerdictInvalid    = api.VerdictInvalid
	VerdictUnverified = api.VerdictUnverified
)

// Event types of the workflow event stream.
const (
	EventStatus   = api.EventStatus
	EventTask     = api.EventTask
	EventWorkflow = api.EventWorkflow
)

// The API's types (package api, the wire format), under the names this
// package has always used.
type (
	Module       = api.Module
	Counts       = api.Counts
	Output       = api.Output
	Task         = api.Task
	Status       = api.Status
	WorkflowList = api.WorkflowList
	Attempt      = api.Attempt
	Event        = api.Event
)

// CountTasks counts tasks by state.
func CountTasks(tasks []Task) Counts { return api.CountTasks(tasks) }

// Finished reports whether a workflow state is final.
func Finished(state string) bool { return api.Finished(state) }

// Submitted is the server's answer to a workflow submission, with what
// SubmitFile pushed.
type Submitted struct {
	api.Submitted

	// Modules maps every module path that SubmitFile pushed, as written in
	// the workflow file, to the module id it was rewritten to. It is not
	// part of the server's answer.
	Modules map[string]string `json:"-"`
	// Data maps every data path that SubmitFile pushed (a file, or a
	// directory as an archive) to its id, as Modules does for modules.
	Data map[string]string `json:"-"`
}

// ListOptions filters and pages List. Zero values are left out of the query.
type ListOptions struct {
	State  string // only workflows in this state
	Limit  int    // at most this many
	Offset int    // skip this many
	Query  string // the server's free-text filter (q)
	// IDPrefix keeps the workflows whose id starts with it (id_prefix).
	IDPrefix string
}
