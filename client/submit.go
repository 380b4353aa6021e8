package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/cyclepool/cyclepool/internal/workflow"
)

// moduleID matches a module id: "sha256:" and 64 lowercase hex digits.
var moduleID = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// IsModuleID reports whether s is a module id ("sha256:" and 64 lowercase
// hex digits) rather than a path.
func IsModuleID(s string) bool { return moduleID.MatchString(s) }

// SubmitFile submits the workflow file at path. Every task "module" that is
// not a module id is taken as the path of a .wasm file, looked up relative to
// the current directory first and then to the workflow file's directory
// (an absolute path is used as it is), pushed, and replaced by the id the
// server gives it. Nothing else in the file changes: the other bytes, the
// order of fields and fields this client does not know reach the server as
// they were written. The file is checked first with the server's own
// parser (workflow.Parse), so that a mistake in it is told before anything
// is pushed. Submitted.Modules lists the
// paths that were pushed. Data paths in the tasks' "files" are pushed the
// same way (a directory as an archive) and listed in Submitted.Data.
func (c *Client) SubmitFile(ctx context.Context, path string) (Submitted, error) {
	s, _, err := c.submitFile(ctx, path, 0)
	return s, err
}

// SubmitFileAndWait is SubmitFile, then waits for the workflow's end in
// the same request, as SubmitAndWait does: it also returns the workflow's
// status once it has reached a final state, or after wait (at most a
// minute) with it still running.
func (c *Client) SubmitFileAndWait(ctx context.Context, path string, wait time.Duration) (Submitted, *Status, error) {
	if wait <= 0 {
		return Submitted{}, nil, fmt.Errorf("submit %s: wait must be positive, got %v", path, wait)
	}
	return c.submitFile(ctx, path, wait)
}

// submitFile is SubmitFile, and with wait > 0 SubmitFileAndWait.
func (c *Client) submitFile(ctx context.Context, path string, wait time.Duration) (Submitted, *Status, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Submitted{}, nil, fmt.Errorf("submit %s: %w", path, err)
	}
	// The server's own parser, before anything is pushed: a mistake in
	// the file is told at once, not after gigabytes of data went up.
	if _, err := workflow.Parse(data); err != nil {
		return Submitted{}, nil, fmt.Errorf("submit %s: %w", path, err)
	}
	out, pushed, err := c.rewriteModules(ctx, data, filepath.Dir(path))
	if err != nil {
		return Submitted{}, nil, fmt.Errorf("submit %s: %w", path, err)
	}
	out, data2, err := c.pushBlobs(ctx, out, filepath.Dir(path))
	if err != nil {
		return Submitted{}, nil, fmt.Errorf("submit %s: %w", path, err)
	}
	var s Submitted
	var st *Status
	if wait > 0 {
		if st, err = c.submitAndWait(ctx, out, wait); err == nil {
			s.ID, s.Name, s.Tasks = st.ID, st.Name, st.TaskCount
		}
	} else {
		s, err = c.submit(ctx, out)
	}
	if err != nil {
		return Submitted{}, nil, fmt.Errorf("submit %s: %w", path, err)
	}
	s.Modules, s.Data = pushed, data2
	return s, st, nil
}

// moduleRef is the "module" value of one task: its byte span in the file.
type moduleRef struct {
	start, end int    // the JSON string, quotes included
	task       string // the task's name, for messages ("" if none yet)
	index      int    // the task's index in "tasks"
	value      string
}

// rewriteModules pushes every module path of the workflow file data and
// returns data with each replaced by its module id.
func (c *Client) rewriteModules(ctx context.Context, data []byte, wfDir string) ([]byte, map[string]string, error) {
	refs, err := findModules(data)
	if err != nil {
		return nil, nil, err
	}
	pushed := map[string]string{} // as written -> id
	byFile := map[string]string{} // absolute file -> id
	var edits []edit
	for _, r := range refs {
		if IsModuleID(r.value) || r.value == "" {
			continue // an id, or nothing to push: the server judges it
		}
		where := "task " + strconv.Quote(r.task)
		if r.task == "" {
			where = "task " + strconv.Itoa(r.index)
		}
		id, ok := pushed[r.value]
		if !ok {
			file, err := resolveModule(r.value, wfDir)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", where, err)
			}
			abs, err := filepath.Abs(file)
			if err != nil {
				abs = file
			}
			if id, ok = byFile[abs]; !ok {
				wasm, err := os.ReadFile(file)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: module %s: %w", where, r.value, err)
				}
				m, err := c.pushModule(ctx, filepath.Base(file), wasm)
				if err != nil {
					return nil, nil, fmt.Errorf("%s: push module %s: %w", where, file, err)
				}
				if !IsModuleID(m.ID) {
					return nil, nil, fmt.Errorf("%s: push module %s: server answered id %q", where, file, m.ID)
				}
				id = m.ID
				byFile[abs] = id
			}
			pushed[r.value] = id
		}
		edits = append(edits, edit{r.start, r.end, id})
	}
	return applyEdits(data, edits), pushed, nil
}

// edit replaces the bytes [start, end) of a workflow file (a JSON string)
// by the JSON string of value.
type edit struct {
	start, end int
	value      string
}

// applyEdits returns data with edits, in file order, applied; data itself
// when there are none. Nothing else in the file changes.
func applyEdits(data []byte, edits []edit) []byte {
	if len(edits) == 0 {
		return data
	}
	var out bytes.Buffer
	prev := 0
	for _, e := range edits {
		quoted, _ := json.Marshal(e.value)
		out.Write(data[prev:e.start])
		out.Write(quoted)
		prev = e.end
	}
	out.Write(data[prev:])
	return out.Bytes()
}

// resolveModule finds the file a module path names: relative to the current
// directory first, then to the workflow file's directory.
func resolveModule(p, wfDir string) (string, error) {
	candidates := []string{p}
	if !filepath.IsAbs(p) {
		if alt := filepath.Join(wfDir, p); filepath.Clean(alt) != filepath.Clean(p) {
			candidates = append(candidates, alt)
		}
	}
	for _, f := range candidates {
		fi, err := os.Stat(f)
		if err == nil && fi.Mode().IsRegular() {
			return f, nil
		}
		if err == nil {
			return "", fmt.Errorf("module %s: %s is not a regular file", p, f)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("module %s: %w", p, err)
		}
	}
	if len(candidates) == 1 {
		return "", fmt.Errorf("module %q is neither a module id (sha256:<64 hex>) nor an existing file", p)
	}
	return "", fmt.Errorf("module %q is neither a module id (sha256:<64 hex>) nor an existing file (looked in the current directory and in %s)", p, wfDir)
}

// findModules returns, in file order, the string "module" values of the
// objects in the top-level "tasks" array. A file that is not JSON is an
// error; a file of another shape yields what it can and is left for the
// server to judge.
func findModules(data []byte) ([]moduleRef, error) {
	if !json.Valid(data) {
		var v any
		err := json.Unmarshal(data, &v)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line, col := position(data, int(se.Offset)-1) // Offset counts the bad byte
			return nil, fmt.Errorf("not valid JSON: line %d, column %d: %v", line, col, err)
		}
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	var refs []moduleRef
	err := eachMember(data, 0, func(key string, val []byte, start int) error {
		if key != "tasks" || val[0] != '[' {
			return nil
		}
		return eachElement(val, start, func(i int, task []byte, tstart int) error {
			name := ""
			first := len(refs) // this task's refs: those of a module given before its name get it now
			return eachMember(task, tstart, func(k string, v []byte, vstart int) error {
				switch {
				case k == "name" && v[0] == '"':
					_ = json.Unmarshal(v, &name)
					for j := first; j < len(refs); j++ {
						if refs[j].task == "" {
							refs[j].task = name
						}
					}
				case k == "module" && v[0] == '"':
					var s string
					if err := json.Unmarshal(v, &s); err != nil {
						return err
					}
					refs = append(refs, moduleRef{start: vstart, end: vstart + len(v), task: name, index: i, value: s})
				}
				return nil
			})
		})
	})
	return refs, err
}

// eachMember calls fn for every member of the JSON object obj (found at
// offset base of the file) with the member's raw value and its offset. A
// value that is not an object yields nothing.
func eachMember(obj []byte, base int, fn func(key string, val []byte, start int) error) error {
	if len(obj) == 0 || obj[0] != '{' {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		end := int(dec.InputOffset())
		if err := fn(key, raw, base+end-len(raw)); err != nil {
			return err
		}
	}
	return nil
}

// eachElement calls fn for every element of the JSON array arr (found at
// offset base of the file).
func eachElement(arr []byte, base int, fn func(i int, val []byte, start int) error) error {
	dec := json.NewDecoder(bytes.NewReader(arr))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for i := 0; dec.More(); i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		end := int(dec.InputOffset())
		if err := fn(i, raw, base+end-len(raw)); err != nil {
			return err
		}
	}
	return nil
}

// position converts a byte offset into a 1-based line and column.
func position(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = off - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}
