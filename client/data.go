package client

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"

	"github.com/cyclepool/cyclepool/api"
)

// Blob is a data blob the owner pushed (api.Blob), and whether PushData
// skipped it.
type Blob struct {
	api.Blob
	// Skipped is set by PushData when the server had the blob already
	// (nothing was uploaded).
	Skipped bool `json:"-"`
}

// PushData pushes the file or directory at path as a data blob and
// returns it. A directory becomes a tar archive (docs/DATA.md, "Archives":
// entries sorted by name, times and owners left out, so that the same tree
// gives the same id); a file is pushed as it is, checked as a tar archive
// when archive is true. When the owner has the blob already, nothing is
// uploaded (Blob.Skipped).
func (c *Client) PushData(ctx context.Context, path string, archive bool) (Blob, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Blob{}, fmt.Errorf("push data: %w", err)
	}
	name := filepath.Base(path)
	file := path
	if fi.IsDir() {
		archive = true
		name += ".tar"
		tmp, err := os.CreateTemp("", "cyclepool-data-*.tar")
		if err != nil {
			return Blob{}, fmt.Errorf("push data %s: %w", path, err)
		}
		defer os.Remove(tmp.Name())
		err = WriteArchive(tmp, path)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return Blob{}, fmt.Errorf("push data %s: %w", path, err)
		}
		file = tmp.Name()
	} else if !fi.Mode().IsRegular() {
		return Blob{}, fmt.Errorf("push data %s: not a regular file or a directory", path)
	}
	b, err := c.pushFile(ctx, file, name, archive)
	if err != nil {
		return Blob{}, fmt.Errorf("push data %s: %w", path, err)
	}
	return b, nil
}

// pushFile hashes a file, asks whether the server has it, and uploads it
// when not.
func (c *Client) pushFile(ctx context.Context, file, name string, archive bool) (Blob, error) {
	f, err := os.Open(file)
	if err != nil {
		return Blob{}, err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return Blob{}, err
	}
	id := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if b, err := c.Data(ctx, id); err == nil && (b.Archive || !archive) {
		b.Skipped = true
		return b, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Blob{}, err
	}
	q := url.Values{"name": {name}}
	if archive {
		q.Set("archive", "1")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+pathOf("blobs", id)+"?"+q.Encode(), f)
	if err != nil {
		return Blob{}, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return Blob{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return Blob{}, decodeError(resp)
	}
	var b Blob
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		return Blob{}, fmt.Errorf("decode the answer: %w", err)
	}
	return b, nil
}

// Data returns the owner's blob id, or an *APIError with status 404.
func (c *Client) Data(ctx context.Context, id string) (Blob, error) {
	resp, err := c.do(ctx, http.MethodHead, pathOf("blobs", id), nil, "", "")
	if err != nil {
		return Blob{}, err
	}
	resp.Body.Close()
	return Blob{Blob: api.Blob{ID: id, Name: resp.Header.Get("X-Cyclepool-Name"), Size: resp.ContentLength,
		Archive: resp.Header.Get("X-Cyclepool-Archive") == "true"}}, nil
}

// DataList lists the owner's blobs, newest first.
func (c *Client) DataList(ctx context.Context) ([]Blob, error) {
	var doc struct {
		Blobs []Blob `json:"blobs"`
	}
	if _, err := c.doJSON(ctx, http.MethodGet, pathOf("blobs"), nil, "", &doc); err != nil {
		return nil, fmt.Errorf("list data: %w", err)
	}
	return doc.Blobs, nil
}

// RemoveData takes a blob off the owner's list; workflows that read it
// keep it until they are deleted.
func (c *Client) RemoveData(ctx context.Context, id string) error {
	resp, err := c.do(ctx, http.MethodDelete, pathOf("blobs", id), nil, "", "")
	if err != nil {
		return fmt.Errorf("remove data %s: %w", id, err)
	}
	resp.Body.Close()
	return nil
}

// WriteArchive writes the directory dir as a tar archive in the form
// docs/DATA.md describes: entries in byte order of their slash-separated
// names, directories with a trailing slash, regular files with their
// permission bits, symbolic links as they are (the server refuses those
// that lead out of the tree), no times, owners or other kinds of file.
func WriteArchive(w io.Writer, dir string) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, name := range names {
		p := filepath.Join(dir, filepath.FromSlash(name))
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, name+"/", 0o755
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, target, 0o777
		case fi.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		default:
			return fmt.Errorf("%s: only files, directories and symbolic links can be archived", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
			if n != h.Size {
				return fmt.Errorf("%s changed size while being archived", p)
			}
		}
	}
	return tw.Close()
}

// blobRef is the "blob" value of one entry of a task's "files".
type blobRef struct {
	start, end int // the JSON string, quotes included
	task       string
	path       string // the file's path in the task
	value      string
	archive    bool
}

// findBlobs returns, in file order, the "blob" values of the entries of
// every task's "files".
func findBlobs(data []byte) ([]blobRef, error) {
	var refs []blobRef
	err := eachMember(data, 0, func(key string, val []byte, start int) error {
		if key != "tasks" || val[0] != '[' {
			return nil
		}
		return eachElement(val, start, func(i int, task []byte, tstart int) error {
			var t struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal(task, &t)
			return eachMember(task, tstart, func(k string, v []byte, vstart int) error {
				if k != "files" {
					return nil
				}
				return eachMember(v, vstart, func(p string, fv []byte, fstart int) error {
					var entry struct {
						Archive bool `json:"archive"`
					}
					_ = json.Unmarshal(fv, &entry)
					return eachMember(fv, fstart, func(fk string, bv []byte, bstart int) error {
						if fk != "blob" || bv[0] != '"' {
							return nil
						}
						var s string
						if err := json.Unmarshal(bv, &s); err != nil {
							return err
						}
						refs = append(refs, blobRef{start: bstart, end: bstart + len(bv), task: t.Name, path: p, value: s, archive: entry.Archive})
						return nil
					})
				})
			})
		})
	})
	return refs, err
}

// resolveData finds the file or directory a data path names: relative to
// the current directory first, then to the workflow file's directory.
func resolveData(p, wfDir string) (string, error) {
	candidates := []string{p}
	if !filepath.IsAbs(p) {
		if alt := filepath.Join(wfDir, p); filepath.Clean(alt) != filepath.Clean(p) {
			candidates = append(candidates, alt)
		}
	}
	for _, f := range candidates {
		if _, err := os.Stat(f); err == nil {
			return f, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("data %q is neither a data id (sha256:<64 hex>) nor an existing file or directory", p)
}

// pushBlobs pushes every data path of the workflow file data (a
// directory as an archive) and returns data with each replaced by its id.
func (c *Client) pushBlobs(ctx context.Context, data []byte, wfDir string) ([]byte, map[string]string, error) {
	refs, err := findBlobs(data)
	if err != nil {
		return nil, nil, err
	}
	pushed := map[string]string{}
	var edits []edit
	for _, r := range refs {
		if IsModuleID(r.value) || r.value == "" {
			continue
		}
		where := fmt.Sprintf("task %q: files.%s", r.task, r.path)
		id, ok := pushed[r.value]
		if !ok {
			file, err := resolveData(r.value, wfDir)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", where, err)
			}
			if fi, err := os.Stat(file); err == nil && fi.IsDir() && !r.archive {
				return nil, nil, fmt.Errorf("%s: %s is a directory: mount it with \"archive\": true", where, r.value)
			}
			b, err := c.PushData(ctx, file, r.archive)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", where, err)
			}
			id = b.ID
			pushed[r.value] = id
		}
		edits = append(edits, edit{r.start, r.end, id})
	}
	return applyEdits(data, edits), pushed, nil
}
