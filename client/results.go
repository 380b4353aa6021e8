package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Results downloads every output of every done task of a workflow to
// dir/<task>/<output>, creating directories as needed (an output named
// "plots/a.png" becomes dir/<task>/plots/a.png). A file there already
// with the output's bytes is left as it is, another replaced; a download
// cut off (its temporary file, <output>.part, is kept) goes on from where
// it stopped when Results runs again, and every file's bytes are checked
// against the hash the server gives as its ETag before it takes its
// place. Task and output names that would leave dir (absolute paths,
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
// file tmp renamed into place once complete and checked. A file at rel
// with the output's bytes is kept (If-None-Match with its hash: no body
// comes). A tmp left by a download cut off is resumed (Range), and kept
// when the download is cut off again (an error reading the answer), so
// that the next call goes on from there.
func (c *Client) download(ctx context.Context, root *os.Root, id, task, output, rel, tmp string) error {
	fail := func(err error) error { return fmt.Errorf("task %q output %q: %w", task, output, err) }
	if d := filepath.Dir(rel); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fail(err)
		}
	}
	h := http.Header{}
	var from int64 // bytes of tmp to go on from
	if sum, err := hashFile(root, rel); err == nil {
		h.Set("If-None-Match", `"`+sum+`"`)
	} else if fi, err := root.Stat(tmp); err == nil && fi.Mode().IsRegular() && fi.Size() > 0 {
		from = fi.Size()
		h.Set("Range", fmt.Sprintf("bytes=%d-", from))
	}
	p := pathOf("workflows", id, "tasks", task, "outputs", output)
	resp, err := c.send(ctx, http.MethodGet, p, nil, h)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotModified:
		return nil // rel has its bytes
	case http.StatusPartialContent:
		if start, ok := rangeStart(resp.Header.Get("Content-Range")); !ok || start != from {
			return fail(fmt.Errorf("the server answered bytes=%d- with %q", from, resp.Header.Get("Content-Range")))
		}
	case http.StatusRequestedRangeNotSatisfiable:
		// tmp is as long as the output, or longer: it was not this
		// output's. Start again.
		resp.Body.Close()
		if err := root.Remove(tmp); err != nil {
			return fail(err)
		}
		return c.download(ctx, root, id, task, output, rel, tmp)
	case http.StatusOK:
		from = 0
	default:
		return fail(decodeError(resp))
	}
	sum := sha256.New()
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if from > 0 {
		// The bytes kept count towards the hash.
		kept, err := root.Open(tmp)
		if err != nil {
			return fail(err)
		}
		n, err := io.Copy(sum, io.LimitReader(kept, from))
		kept.Close()
		if err == nil && n != from {
			err = fmt.Errorf("%s shrank while it was read", tmp)
		}
		if err != nil {
			return fail(err)
		}
		flags = os.O_WRONLY | os.O_APPEND
	}
	f, err := root.OpenFile(tmp, flags, 0o644)
	if err != nil {
		return fail(err)
	}
	_, err = io.Copy(io.MultiWriter(f, sum), resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(fmt.Errorf("%w (%s is kept: run again to go on from there)", err, filepath.Join(root.Name(), tmp)))
	}
	if etag := strings.Trim(resp.Header.Get("ETag"), `"`); strings.HasPrefix(etag, "sha256:") {
		if got := "sha256:" + hex.EncodeToString(sum.Sum(nil)); got != etag {
			_ = root.Remove(tmp)
			if from > 0 {
				// The bytes kept were of another version of the output
				// (its task ran again): download it whole.
				return c.download(ctx, root, id, task, output, rel, tmp)
			}
			return fail(fmt.Errorf("the bytes downloaded hash to %s, not %s", got, etag))
		}
	}
	if err := root.Rename(tmp, rel); err != nil {
		_ = root.Remove(tmp)
		return fail(err)
	}
	return nil
}

// hashFile returns "sha256:<hex>" of the regular file rel under root.
func hashFile(root *os.Root, rel string) (string, error) {
	f, err := root.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", rel)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// rangeStart returns the first byte of a Content-Range "bytes a-b/n".
func rangeStart(cr string) (int64, bool) {
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, false
	}
	a, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(a, 10, 64)
	return n, err == nil
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
