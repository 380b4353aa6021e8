package api

import "time"

// Module is a pushed WebAssembly module (POST and GET /api/v1/modules).
type Module struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"` // the file name it was pushed with ("" when not given)
	Size      int64     `json:"size"`
	Imports   []string  `json:"imports"`
	CreatedAt time.Time `json:"created_at"`
}

// Blob is a data blob the owner pushed (PUT and GET /api/v1/blobs): a
// file, or an archive that tasks may mount as a directory tree.
type Blob struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Size      int64     `json:"size"`
	Archive   bool      `json:"archive"`
	CreatedAt time.Time `json:"created_at"`
}
