package workflow

import (
	"fmt"
	"path"
	"sort"
	"strings"
	"unicode/utf8"
)

// reservedDirs are the directories the runners make themselves: a task's
// files may not be put there.
var reservedDirs = []string{"/in", "/out"}

// checkPath returns "" or what is wrong with an absolute path of a task's
// file system.
func checkPath(p string) string {
	switch {
	case p == "":
		return "must not be empty"
	case len(p) > MaxPathLen:
		return fmt.Sprintf("is %d bytes long, more than %d", len(p), MaxPathLen)
	case !utf8.ValidString(p) || strings.ContainsAny(p, "\\\x00"):
		return fmt.Sprintf("%q must be UTF-8 without '\\' or NUL", p)
	case !strings.HasPrefix(p, "/"):
		return fmt.Sprintf("%q must be an absolute path (starting with /)", p)
	case path.Clean(p) != p:
		return fmt.Sprintf("%q must be a clean path (no .., . or // in it, no / at the end): %q", p, path.Clean(p))
	}
	for _, name := range strings.Split(p[1:], "/") {
		if len(name) > MaxPathNameLen {
			return fmt.Sprintf("has a name of %d bytes (%.20q…), more than %d", len(name), name, MaxPathNameLen)
		}
	}
	for _, r := range reservedDirs {
		if p == r || strings.HasPrefix(p, r+"/") {
			return fmt.Sprintf("%q is under %s, which the runner makes itself (use \"inputs\" for /in; write outputs to /out)", p, r)
		}
	}
	return ""
}

// under reports whether p is dir or inside it.
func under(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// buildSetup validates a task's env, cwd, files and outputs into t. It
// returns the field at fault and what is wrong, or "", "".
func (s *Spec) buildSetup(i int, tj *taskJSON, t *TaskSpec) (string, string) {
	if len(tj.Env) > MaxEnv {
		return "env", fmt.Sprintf("%d variables, more than %d", len(tj.Env), MaxEnv)
	}
	size := 0
	for k, v := range tj.Env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return "env." + k, "a variable's name must not be empty or hold '=' or NUL"
		case strings.IndexByte(v, 0) >= 0:
			return "env." + k, "a variable's value must not hold NUL"
		}
		size += len(k) + len(v) + 2
		t.Env = append(t.Env, k+"="+v)
	}
	if size > MaxEnvBytes {
		return "env", fmt.Sprintf("names and values add up to %d bytes, more than %d", size, MaxEnvBytes)
	}
	sort.Strings(t.Env)

	t.Cwd = "/"
	if tj.Cwd != nil {
		if *tj.Cwd != "/" {
			if msg := checkPath(*tj.Cwd); msg != "" {
				return "cwd", msg
			}
		}
		t.Cwd = *tj.Cwd
	}

	if len(tj.Files) > MaxFiles {
		return "files", fmt.Sprintf("%d entries, more than %d", len(tj.Files), MaxFiles)
	}
	paths := make([]string, 0, len(tj.Files))
	for p := range tj.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	data := 0
	for _, p := range paths {
		field := "files." + p
		if p != "/" {
			if msg := checkPath(p); msg != "" {
				return field, msg
			}
		}
		f := tj.Files[p]
		if f == nil {
			return field, "must be an object"
		}
		kinds := 0
		for _, set := range []bool{f.Blob != nil, f.Data != nil, f.From != nil} {
			if set {
				kinds++
			}
		}
		if kinds != 1 {
			return field, `takes one of "blob", "data" or "from"`
		}
		file := File{Path: p}
		switch {
		case f.Blob != nil:
			if f.Output != nil {
				return field, `"output" goes with "from", not "blob"`
			}
			if msg := checkModule(*f.Blob); msg != "" {
				return field + ".blob", strings.ReplaceAll(msg, "module", "data")
			}
			file.Blob = *f.Blob
			file.Archive = f.Archive != nil && *f.Archive
			file.Writable = f.Writable != nil && *f.Writable
			if p == "/" && !file.Archive {
				return field, `"/" is a directory: only an archive ("archive": true) can be mounted there`
			}
		case f.Data != nil:
			if f.Archive != nil || f.Writable != nil || f.Output != nil {
				return field, `"data" takes no "archive", "writable" or "output" (inline data is a writable file)`
			}
			if strings.IndexByte(*f.Data, 0) >= 0 {
				return field, "inline data must not hold NUL: push binary data with `cyclepool data push` and mount it with \"blob\""
			}
			data += len(*f.Data)
			if data > MaxDataBytes {
				return field, fmt.Sprintf("inline data of the task's files adds up to more than %d bytes: push large data with `cyclepool data push`", MaxDataBytes)
			}
			file.Data = f.Data
		default:
			if f.Archive != nil || f.Writable != nil {
				return field, `"from" takes no "archive" or "writable"`
			}
			src, err := s.source(i, f.From, f.Output)
			if err != nil {
				return field, err.Msg
			}
			file.Source = src
		}
		if p == "/" && file.Blob == "" {
			return field, `"/" is a directory: only an archive ("archive": true) can be mounted there`
		}
		t.Files = append(t.Files, file)
	}
	// A file may be inside an archive's tree (the deeper entry wins), not
	// inside another file.
	for k, f := range t.Files {
		for _, g := range t.Files[:k] {
			if !g.Archive && under(f.Path, g.Path) {
				return "files." + f.Path, fmt.Sprintf("is inside %q, which is a file", g.Path)
			}
		}
	}
	if t.Cwd != "/" {
		for _, f := range t.Files {
			if !f.Archive && under(t.Cwd, f.Path) {
				return "cwd", fmt.Sprintf("%q is a file of the task (files.%s), not a directory", t.Cwd, f.Path)
			}
		}
	}

	if len(tj.Outputs) > MaxOutputPaths {
		return "outputs", fmt.Sprintf("%d paths, more than %d", len(tj.Outputs), MaxOutputPaths)
	}
	seen := map[string]bool{}
	for k, o := range tj.Outputs {
		field := fmt.Sprintf("outputs[%d]", k)
		if o == "/out" || strings.HasPrefix(o, "/out/") {
			return field, fmt.Sprintf("%q is under /out, whose files are outputs anyway", o)
		}
		if msg := checkPath(o); msg != "" {
			return field, msg
		}
		if seen[o] {
			return field, fmt.Sprintf("%q appears twice", o)
		}
		seen[o] = true
		t.Outputs = append(t.Outputs, o)
	}
	sort.Strings(t.Outputs)
	return "", ""
}

// BlobPaths returns the distinct blob references of the tasks' files that
// are paths, not ids, in file order.
func (s *Spec) BlobPaths() []string {
	var out []string
	seen := map[string]bool{}
	for _, t := range s.Tasks {
		for _, f := range t.Files {
			if f.Blob != "" && !IsModuleID(f.Blob) && !seen[f.Blob] {
				seen[f.Blob] = true
				out = append(out, f.Blob)
			}
		}
	}
	return out
}

// BlobIDs returns the distinct blob ids the tasks' files name.
func (s *Spec) BlobIDs() []string {
	var out []string
	seen := map[string]bool{}
	for _, t := range s.Tasks {
		for _, f := range t.Files {
			if IsModuleID(f.Blob) && !seen[f.Blob] {
				seen[f.Blob] = true
				out = append(out, f.Blob)
			}
		}
	}
	return out
}

// ReplaceBlob sets every file whose blob is old to new (an id, once the CLI
// pushed the path old) and returns how many files changed.
func (s *Spec) ReplaceBlob(old, new string) (int, error) {
	if !IsModuleID(new) {
		return 0, fmt.Errorf("workflow: %q is not a data id", new)
	}
	n := 0
	for i := range s.Tasks {
		for k := range s.Tasks[i].Files {
			f := &s.Tasks[i].Files[k]
			if f.Blob == old {
				f.Blob = new
				s.file.Tasks[i].Files[f.Path].Blob = &new
				n++
			}
		}
	}
	return n, nil
}
