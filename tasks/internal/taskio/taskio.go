// Package taskio holds the small file helpers shared by the example tasks:
// where the task's inputs (/in) and outputs (/out) live, and reading and
// writing them.
//
// Under the platform (GOOS=wasip1) inputs are the read-only directory /in and
// outputs go to /out. Run natively, the environment variables
// CYCLEPOOL_IN_DIR and CYCLEPOOL_OUT_DIR may point those at other
// directories; the platform never sets them, so a task's behaviour under
// wasm does not depend on them.
package taskio

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
)

// InDir is the directory holding the task's inputs.
func InDir() string {
	if d := os.Getenv("CYCLEPOOL_IN_DIR"); d != "" {
		return d
	}
	return "/in"
}

// OutDir is the directory whose files become the task's outputs.
func OutDir() string {
	if d := os.Getenv("CYCLEPOOL_OUT_DIR"); d != "" {
		return d
	}
	return "/out"
}

// ReadInput reads the input file name (a slash-separated path under /in).
func ReadInput(name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(InDir(), filepath.FromSlash(name)))
	if err != nil {
		return nil, fmt.Errorf("input %s: %w", name, err)
	}
	return b, nil
}

// ListInputs returns the names (slash-separated, relative to /in) of every
// regular file under /in, sorted. A missing /in means no inputs.
func ListInputs() ([]string, error) {
	root := InDir()
	var names []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root && os.IsNotExist(err) {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing inputs: %w", err)
	}
	sort.Strings(names)
	return names, nil
}

// WriteOutput writes the output file name (a slash-separated path under /out).
func WriteOutput(name string, data []byte) error {
	p := filepath.Join(OutDir(), filepath.FromSlash(path.Clean(name)))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("output %s: %w", name, err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		return fmt.Errorf("output %s: %w", name, err)
	}
	return nil
}

// Fatal prints a message to stderr (the task's log) and exits with status 1.
func Fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
