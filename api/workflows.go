package api

import (
	"encoding/json"
	"fmt"
	"time"
)

// Workflow states, as reported in Status.State.
const (
	WorkflowRunning   = "running"
	WorkflowDone      = "done"
	WorkflowFailed    = "failed"
	WorkflowCancelled = "cancelled"
)

// Task states, as reported in Task.State.
const (
	TaskBlocked        = "blocked"
	TaskReady          = "ready"
	TaskRunning        = "running"
	TaskDone           = "done"
	TaskFailed         = "failed"
	TaskUpstreamFailed = "upstream_failed"
	TaskCancelled      = "cancelled"
)

// TaskStates lists every task state in lifecycle order.
var TaskStates = []string{TaskBlocked, TaskReady, TaskRunning, TaskDone, TaskFailed, TaskUpstreamFailed, TaskCancelled}

// Submitted is the answer to a workflow submission (POST
// /api/v1/workflows).
type Submitted struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Tasks int    `json:"tasks"`
}

// Counts is the number of tasks of a workflow in each task state.
type Counts struct {
	Blocked        int `json:"blocked"`
	Ready          int `json:"ready"`
	Running        int `json:"running"`
	Done           int `json:"done"`
	Failed         int `json:"failed"`
	UpstreamFailed int `json:"upstream_failed"`
	Cancelled      int `json:"cancelled"`
}

// Get returns the count for a task state (0 for an unknown state).
func (c Counts) Get(state string) int {
	if p := c.field(state); p != nil {
		return *p
	}
	return 0
}

// Total is the sum of all counts.
func (c Counts) Total() int {
	return c.Blocked + c.Ready + c.Running + c.Done + c.Failed + c.UpstreamFailed + c.Cancelled
}

// Add adds n to the count of a task state; an unknown state is ignored.
func (c *Counts) Add(state string, n int) {
	if p := c.field(state); p != nil {
		*p += n
	}
}

// CountTasks counts tasks by state.
func CountTasks(tasks []Task) Counts {
	var c Counts
	for _, t := range tasks {
		c.Add(t.State, 1)
	}
	return c
}

func (c *Counts) field(state string) *int {
	switch state {
	case TaskBlocked:
		return &c.Blocked
	case TaskReady:
		return &c.Ready
	case TaskRunning:
		return &c.Running
	case TaskDone:
		return &c.Done
	case TaskFailed:
		return &c.Failed
	case TaskUpstreamFailed:
		return &c.UpstreamFailed
	case TaskCancelled:
		return &c.Cancelled
	}
	return nil
}

// Output names one output of a done task and its size in bytes.
type Output struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// Task is one task of a workflow as shown in the status object.
type Task struct {
	Name        string  `json:"name"`
	State       string  `json:"state"`
	Attempts    int     `json:"attempts"`
	MaxAttempts int     `json:"max_attempts"`
	Progress    float64 `json:"progress"`
	Module      string  `json:"module"`
	Checkpoints int     `json:"checkpoints"`
	// CheckpointAt is when the latest checkpoint was saved (nil: none).
	CheckpointAt *time.Time `json:"checkpoint_at"`
	// Worker is the id of the worker running the task now ("" if none).
	Worker     string     `json:"worker"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Error      string     `json:"error"`
	// Disputed is true when the task's result was accepted alone from a
	// trusted worker that later lost a quorum, after the workflow had
	// finished, so it could not be re-checked (docs/WORKFLOW.md).
	Disputed bool     `json:"disputed,omitempty"`
	Outputs  []Output `json:"outputs"`
}

// Status is a workflow's status object (GET /api/v1/workflows/{id}). In
// listings (List) Tasks is empty: a summary is a status without tasks.
type Status struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Priority   string     `json:"priority"`
	State      string     `json:"state"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at"`
	TaskCount  int        `json:"task_count"`
	// Replicas and Quorum are the workflow's result verification: replicas
	// of each task started at first, identical results that accept it.
	Replicas int `json:"replicas"`
	Quorum   int `json:"quorum"`
	// Efficiency is the workflow's resource efficiency (Heymann et al.):
	// the time its successful attempts ran over the time its workers were
	// held, from 0 to 1. Nil until an attempt succeeded, and in listings.
	Efficiency *float64 `json:"efficiency,omitempty"`
	// SuggestedParallelism is the number of workers that keeps the
	// efficiency at 80% or more for the run times seen so far. Nil when
	// Efficiency is.
	SuggestedParallelism *int `json:"suggested_parallelism,omitempty"`
	// Notice is what the server says of itself that holds the workflow
	// up, such as "the server cannot store results now (…): finished
	// results wait at the workers, and nothing is charged to your tasks";
	// empty when all is well.
	Notice string `json:"notice,omitempty"`
	Counts Counts `json:"counts"`
	Tasks  []Task `json:"tasks,omitempty"`
}

// Finished reports whether the workflow has reached a final state
// (done, failed or cancelled).
func (s *Status) Finished() bool { return Finished(s.State) }

// Finished reports whether a workflow state is final.
func Finished(state string) bool {
	return state == WorkflowDone || state == WorkflowFailed || state == WorkflowCancelled
}

// Task returns the task with the given name, or nil.
func (s *Status) Task(name string) *Task {
	for i := range s.Tasks {
		if s.Tasks[i].Name == name {
			return &s.Tasks[i]
		}
	}
	return nil
}

// Clone returns a deep copy of s.
func (s *Status) Clone() *Status {
	if s == nil {
		return nil
	}
	c := *s
	c.Tasks = make([]Task, len(s.Tasks))
	copy(c.Tasks, s.Tasks)
	for i := range c.Tasks {
		c.Tasks[i].Outputs = append([]Output(nil), s.Tasks[i].Outputs...)
	}
	return &c
}

// Apply updates s with one event of the workflow's event stream: a "status"
// event replaces s, a "task" event updates the fields it carries on the named
// task (adjusting Counts when the state changes), a "workflow" event updates
// the workflow fields it carries. Other event types are ignored. Apply
// reports whether s changed.
func (s *Status) Apply(e Event) (bool, error) {
	switch e.Type {
	case EventStatus:
		var n Status
		if err := json.Unmarshal(e.Data, &n); err != nil {
			return false, fmt.Errorf("status event: %w", err)
		}
		*s = n
		return true, nil
	case EventTask:
		var head struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(e.Data, &head); err != nil {
			return false, fmt.Errorf("task event: %w", err)
		}
		if head.Name == "" {
			return false, fmt.Errorf("task event without a task name: %s", e.Data)
		}
		t := s.Task(head.Name)
		if t == nil {
			s.Tasks = append(s.Tasks, Task{Name: head.Name})
			t = &s.Tasks[len(s.Tasks)-1]
		}
		old := t.State
		// Unmarshalling onto the existing task keeps the fields the event
		// does not carry.
		if err := json.Unmarshal(e.Data, t); err != nil {
			return false, fmt.Errorf("task event: %w", err)
		}
		if t.State != old {
			if p := s.Counts.field(old); p != nil && *p > 0 {
				*p--
			}
			if p := s.Counts.field(t.State); p != nil {
				*p++
			}
		}
		return true, nil
	case EventWorkflow:
		tasks := s.Tasks
		if err := json.Unmarshal(e.Data, s); err != nil {
			return false, fmt.Errorf("workflow event: %w", err)
		}
		if s.Tasks == nil {
			s.Tasks = tasks
		}
		return true, nil
	}
	return false, nil
}

// WorkflowList is one page of the owner's workflows, newest first.
type WorkflowList struct {
	Workflows []Status `json:"workflows"`
	Total     int      `json:"total"`
}

// Attempt is one attempt at running a task.
type Attempt struct {
	ID           int64      `json:"id"`
	State        string     `json:"state"`
	Worker       string     `json:"worker"`
	Reason       string     `json:"reason"`
	StartedAt    *time.Time `json:"started_at"`
	EndedAt      *time.Time `json:"ended_at"`
	RestoredFrom int        `json:"restored_from"`
	// Verdict is set on attempts of replicated tasks once decided:
	// VerdictValid, VerdictInvalid or VerdictUnverified.
	Verdict string `json:"verdict,omitempty"`
	// Superseded is true when the attempt ran on an upstream result that
	// re-verification overturned: its task was reset and ran again.
	Superseded bool `json:"superseded,omitempty"`
}

// Verdicts of a replicated task's attempt (Attempt.Verdict).
const (
	VerdictValid      = "valid"      // agreed with the accepted quorum
	VerdictInvalid    = "invalid"    // lost the quorum
	VerdictUnverified = "unverified" // accepted alone from a trusted worker
)

// Event types of the workflow event stream.
const (
	EventStatus   = "status"
	EventTask     = "task"
	EventWorkflow = "workflow"
)

// Event is one Server-Sent Event of a workflow's event stream
// (GET /api/v1/workflows/{id}/events).
type Event struct {
	// Type is the SSE event name: EventStatus, EventTask, EventWorkflow, or
	// "message" when the server sent none.
	Type string
	// ID is the last event id seen on the stream ("" if none).
	ID string
	// Data is the event's data: the data lines joined by "\n". For the
	// documented event types it is a JSON object.
	Data json.RawMessage
}

// TaskChange is the data of a "task" event of the event stream: the fields
// of a task that change while it runs (Status.Apply lays them over the
// task's others).
type TaskChange struct {
	Name         string     `json:"name"`
	State        string     `json:"state"`
	Attempts     int        `json:"attempts"`
	Progress     float64    `json:"progress"`
	Checkpoints  int        `json:"checkpoints"`
	CheckpointAt *time.Time `json:"checkpoint_at"`
	Worker       string     `json:"worker"`
	Error        string     `json:"error"`
}

// WorkflowChange is the data of the "workflow" event that ends the stream.
type WorkflowChange struct {
	ID    string `json:"id"`
	State string `json:"state"`
}
