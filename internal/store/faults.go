package store

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ServerFault reports whether err says that PostgreSQL could not do the
// work for a reason of its own, not because of what was asked of it: it is
// down or unreachable, its disk is full, it is read-only (a standby, a
// volume remounted read-only) or shutting down. Work refused this way must
// be tried again later and charged to nobody; an error about the data (a
// value PostgreSQL cannot store) is the item's own. A cancelled context is
// neither: the caller gave up. docs/RATIONALE.md says why these classes.
func ServerFault(err error) bool {
	var refused *RefusedError
	if err == nil || errors.Is(err, context.Canceled) || errors.As(err, &refused) {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true // no answer from PostgreSQL at all: the connection failed
	}
	switch {
	case pgErr.Code == "53200": // out_of_memory: a value too large to handle, the item's own
		return false
	case pgErr.Code == "25006", // read_only_sql_transaction
		strings.HasPrefix(pgErr.Code, "08"), // connection exception
		strings.HasPrefix(pgErr.Code, "53"), // insufficient resources: disk full, too many connections
		strings.HasPrefix(pgErr.Code, "57"), // operator intervention: shutdown, cannot connect now
		strings.HasPrefix(pgErr.Code, "58"): // system error: I/O error
		return true
	}
	return false
}

// FaultCause is a short text naming why PostgreSQL could not do the work
// (for a log line, a metric label or /readyz): its message, or the
// connection's error.
func FaultCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	}
	return err.Error()
}

// FaultSummary says in a few plain words what a server fault is, for
// owners and for /readyz, which anyone may read: nothing of the database's
// own message (paths, names, addresses).
func FaultSummary(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return "the database does not answer"
	}
	switch {
	case pgErr.Code == "53100":
		return "the server's storage is full"
	case pgErr.Code == "25006":
		return "the database is read-only"
	case strings.HasPrefix(pgErr.Code, "57"):
		return "the database is shutting down or starting up"
	case strings.HasPrefix(pgErr.Code, "53"):
		return "the database is out of resources"
	}
	return "the database is unavailable"
}

// FaultCode is the SQLSTATE of a server fault, or "connection" when
// PostgreSQL gave no answer.
func FaultCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return "connection"
}
