// Package migrations holds cyclepool's SQL schema as numbered goose
// migrations, embedded in the binary and applied at start by internal/store.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
