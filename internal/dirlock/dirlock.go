// Package dirlock lets one process at a time take a directory it keeps
// files in (a cache, a spool), so that two processes given the same
// directory do not clear or evict each other's files: the second one is
// told, and keeps a directory of its own.
package dirlock
