// Package api holds the types of cyclepool's REST API (docs/API.md): the
// requests and answers of /api/v1/, as they travel in JSON. The server
// writes them and the client package reads them; nothing else defines the
// wire format, and server/testdata/api pins its shape (TestWireFormat).
package api

import "time"

// Error is an error answer (4xx or 5xx). Task and Field are set when the
// error points into a workflow file.
type Error struct {
	Error string `json:"error"`
	Task  string `json:"task,omitempty"`
	Field string `json:"field,omitempty"`
}

// ModuleList is GET /api/v1/modules.
type ModuleList struct {
	Modules []Module `json:"modules"`
}

// BlobList is GET /api/v1/blobs: the owner's data, newest first.
type BlobList struct {
	Blobs []Blob `json:"blobs"`
}

// AttemptList is GET /api/v1/workflows/{id}/tasks/{task}/attempts.
type AttemptList struct {
	Attempts []Attempt `json:"attempts"`
}

// ActivityMinute is one minute of GET /api/v1/activity.
type ActivityMinute struct {
	Minute    time.Time `json:"minute"`     // its start
	TasksDone int       `json:"tasks_done"` // tasks of every owner that ended done in it
	Workers   int       `json:"workers"`    // workers connected at any time in it
}

// Activity is GET /api/v1/activity: the last hour, a minute at a time.
type Activity struct {
	Minutes []ActivityMinute `json:"minutes"`
}
