package server

import (
	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/internal/store"
)

// The REST API's answers (package api) from the store's rows: the one
// place where a row becomes wire format (TestWireFormat pins its shape).

func apiModule(m store.Module) api.Module {
	return api.Module{ID: m.ID, Name: m.Name, Size: int64(m.Size), Imports: m.Imports, CreatedAt: m.CreatedAt}
}

func apiModules(ms []store.Module) api.ModuleList {
	l := api.ModuleList{Modules: make([]api.Module, len(ms))}
	for i, m := range ms {
		l.Modules[i] = apiModule(m)
	}
	return l
}

func apiBlob(b store.Blob) api.Blob {
	return api.Blob{ID: b.ID, Name: b.Name, Size: b.Size, Archive: b.Archive, CreatedAt: b.CreatedAt}
}

func apiBlobs(bs []store.Blob) api.BlobList {
	l := api.BlobList{Blobs: make([]api.Blob, len(bs))}
	for i, b := range bs {
		l.Blobs[i] = apiBlob(b)
	}
	return l
}

func apiCounts(c *store.Counts) api.Counts {
	if c == nil {
		return api.Counts{}
	}
	return api.Counts{Blocked: c.Blocked, Ready: c.Ready, Running: c.Running, Done: c.Done, Failed: c.Failed,
		UpstreamFailed: c.UpstreamFailed, Cancelled: c.Cancelled}
}

func apiTask(t *store.TaskStatus) api.Task {
	a := api.Task{Name: t.Name, State: t.State, Attempts: t.Attempts, MaxAttempts: t.MaxAttempts, Progress: t.Progress,
		Module: t.Module, Checkpoints: t.Checkpoints, CheckpointAt: t.CheckpointAt, Worker: t.Worker,
		StartedAt: t.StartedAt, FinishedAt: t.FinishedAt, Error: t.Error, Disputed: t.Disputed,
		Outputs: make([]api.Output, len(t.Outputs))}
	for i, o := range t.Outputs {
		a.Outputs[i] = api.Output{Name: o.Name, Size: int64(o.Size)}
	}
	return a
}

// apiStatus is a workflow's status; a summary (no tasks) in listings.
func apiStatus(w *store.WorkflowStatus) api.Status {
	a := api.Status{ID: w.ID, Name: w.Name, Priority: w.Priority, State: w.State, CreatedAt: w.CreatedAt,
		FinishedAt: w.FinishedAt, TaskCount: w.TaskCount, Replicas: w.Replicas, Quorum: w.Quorum,
		Efficiency: w.Efficiency, SuggestedParallelism: w.SuggestedParallelism, Notice: w.Notice,
		Counts: apiCounts(w.Counts)}
	if len(w.Tasks) > 0 {
		a.Tasks = make([]api.Task, len(w.Tasks))
		for i := range w.Tasks {
			a.Tasks[i] = apiTask(&w.Tasks[i])
		}
	}
	return a
}

func apiWorkflows(ws []store.WorkflowStatus, total int) api.WorkflowList {
	l := api.WorkflowList{Workflows: make([]api.Status, len(ws)), Total: total}
	for i := range ws {
		l.Workflows[i] = apiStatus(&ws[i])
	}
	return l
}

func apiAttempts(as []store.Attempt) api.AttemptList {
	l := api.AttemptList{Attempts: make([]api.Attempt, len(as))}
	for i, a := range as {
		l.Attempts[i] = api.Attempt{ID: a.ID, State: a.State, Worker: a.Worker, Reason: a.Reason, StartedAt: &a.StartedAt,
			EndedAt: a.EndedAt, RestoredFrom: a.RestoredFrom, Verdict: a.Verdict, Superseded: a.Superseded}
	}
	return l
}

func apiTaskChange(t *store.TaskStatus) api.TaskChange {
	return api.TaskChange{Name: t.Name, State: t.State, Attempts: t.Attempts, Progress: t.Progress,
		Checkpoints: t.Checkpoints, CheckpointAt: t.CheckpointAt, Worker: t.Worker, Error: t.Error}
}

func apiActivity(ms []store.ActivityMinute) api.Activity {
	a := api.Activity{Minutes: make([]api.ActivityMinute, len(ms))}
	for i, m := range ms {
		a.Minutes[i] = api.ActivityMinute{Minute: m.Minute, TasksDone: m.TasksDone, Workers: m.Workers}
	}
	return a
}
