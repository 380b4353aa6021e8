package client

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Results downloads every output of every done task of a workflow to
// dir/<task>/<output>, creating directories as needed (an output named
// "plots/a.png" becomes dir/<task>/plots/a.png). Existing files are
// replaced. Task and output names that would leave dir (absolute paths,
// ".." elements, and so on) are refused before anything is downloaded, and
// every file is written through an os.Root on dir, so a symbolic link inside
// dir cannot lead outside it either. Tasks that are not done are skipped;
// call Results after Wait to get everything.
func (c *Client) Results(ctx context.Context, id, dir string) error {
	st, err := c.Status(ctx, id)
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	type file struct{ task, output, rel string }
	var files []file
	for _, t := range st.Tasks {
		if t.State != TaskDone {
			continue
		}
		if err := checkTaskName(t.Name); err != nil {
			return fmt.Errorf("results of workflow %s: %w", id, err)
		}
		for _, o := range t.Outputs {
			if err := checkOutputName(o.Name); err != nil {
				return fmt.Errorf("results of workflow %s: task %q: %w", id, t.Name, err)
			}
			// An output by path outside /out goes where it was in the
			// task's tree: /work/top.txt to DIR/<task>/work/top.txt.
			files = append(files, file{t.Name, o.Name, t.Name + "/" + strings.TrimPrefix(o.Name, "/")})
		}
	}
	// Two outputs of a task may name the same file once the leading / of
	// an output outside /out is dropped: the file /out/work/a.txt (output
	// "work/a.txt") and the path /work/a.txt of "outputs", or stdout and
	// the path /stdout. Written one after the other, the second would
	// silently replace the first; one may also need as a directory what
	// another writes as a file. Both are refused before anything is
	// written.
	dests := make(map[string]file, len(files))
	for _, f := range files {
		if g, ok := dests[f.rel]; ok {
			return fmt.Errorf("results of workflow %s: task %q: refusing outputs %q and %q: both would be written to %s",
				id, f.task, g.output, f.output, filepath.Join(dir, filepath.FromSlash(f.rel)))
		}
		dests[f.rel] = f
	}
	for _, f := range files {
		for d := path.Dir(f.rel); strings.Contains(d, "/"); d = path.Dir(d) {
			if g, ok := dests[d]; ok {
				return fmt.Errorf("results of workflow %s: task %q: refusing outputs %q and %q: %s would have to be both a file and a directory",
					id, f.task, g.output, f.output, filepath.Join(dir, filepath.FromSlash(d)))
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results of workflow %s: %w", id, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("results of workflow %s: %w", id, err)
	}
	defer root.Close()
	for _, f := range files {
		// The temporary file is named after the output, and must be
		// no other output's name (outputs "x" and "x.part").
		tmp := f.rel + ".part"
		for _, taken := dests[tmp]; taken; _, taken = dests[tmp] {
			tmp += "~"
		}
		if err := c.download(ctx, root, id, f.task, f.output, filepath.FromSlash(f.rel), filepath.FromSlash(tmp)); err != nil {
			return fmt.Errorf("results of workflow %s: %w", id, err)
		}
	}
	return nil
}

// download writes one output to rel under root, through the temporary
// file tmp renamed into place once complete.
func (c *Client) download(ctx context.Context, root *os.Root, id, task, output, rel, tmp string) error {
	if d := filepath.Dir(rel); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("task %q output %q: %w", task, output, err)
		}
	}
	body, err := c.Output(ctx, id, task, output)
	if err != nil {
		return err
	}
	defer body.Close()
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("task %q output %q: %w", task, output, err)
	}
	_, err = io.Copy(f, body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("task %q output %q: %w", task, output, err)
	}
	return nil
}

// checkTaskName refuses task names that cannot be one directory name.
func checkTaskName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return fmt.Errorf("refusing task name %q: not usable as a directory name", name)
	case strings.ContainsAny(name, "/\\\x00"):
		return fmt.Errorf("refusing task name %q: it contains a path separator", name)
	case !filepath.IsLocal(name):
		return fmt.Errorf("refusing task name %q: it would escape the results directory", name)
	}
	return nil
}

// checkOutputName refuses output names that are not clean relative
// slash-separated paths inside the task's directory.
func checkOutputName(name string) error {
	if rel, ok := strings.CutPrefix(name, "/"); ok && rel != "" && !strings.HasPrefix(rel, "/") {
		name = rel // an output by path outside /out
	}
	switch {
	case name == "":
		return fmt.Errorf("refusing empty output name")
	case strings.ContainsAny(name, "\\\x00"):
		return fmt.Errorf("refusing output name %q: it contains a backslash or NUL", name)
	case path.IsAbs(name), path.Clean(name) != name, name == ".", strings.HasPrefix(name, "../"), name == "..":
		return fmt.Errorf("refusing output name %q: it would escape the task's directory or is not a clean path", name)
	case !filepath.IsLocal(filepath.FromSlash(name)):
		return fmt.Errorf("refusing output name %q: it would escape the task's directory", name)
	}
	return nil
}
