// Package archive reads the archives a task may mount as a directory tree
// (docs/DATA.md, "Archives"): POSIX tar streams (ustar, pax or GNU) of
// regular files, directories and relative symbolic links that stay inside
// the tree. Anything else (absolute or escaping names, hard links,
// devices, sparse files, the same name twice) is refused whole, so that a
// refused archive is never stored or unpacked.
package archive

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
)

// Limits of an archive.
const (
	MaxEntries   = 100000
	MaxNameBytes = 4096
)

// Error is a refusal of an archive, naming the entry at fault.
type Error struct {
	Entry string
	Msg   string
}

func (e *Error) Error() string {
	if e.Entry == "" {
		return "archive refused: " + e.Msg
	}
	return fmt.Sprintf("archive refused: entry %q: %s", e.Entry, e.Msg)
}

// Entry is one checked entry: Name is slash-separated, clean and relative
// (never "." or empty); Type is tar.TypeReg, tar.TypeDir or
// tar.TypeSymlink.
type Entry struct {
	Name     string
	Type     byte
	Size     int64
	Mode     fs.FileMode // permission bits
	Linkname string      // symbolic links' target
}

// Walk reads a tar stream and calls fn for every entry in order, with the
// entry's content for a regular file. It stops at the first entry that
// breaks the rules, with an *Error, before calling fn on it: what fn saw
// of a refused archive is only its good prefix.
func Walk(r io.Reader, fn func(e Entry, body io.Reader) error) error {
	tr := tar.NewReader(r)
	types := map[string]byte{} // the entries so far, and the directories they imply
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return &Error{Msg: fmt.Sprintf("not a tar archive, or a damaged one: %v", err)}
		}
		n++
		if n > MaxEntries {
			return &Error{Msg: fmt.Sprintf("more than %d entries", MaxEntries)}
		}
		e, err := check(h, types)
		if err != nil {
			return err
		}
		if e == nil {
			continue // the archive's own root, "./"
		}
		var body io.Reader = emptyReader{}
		if e.Type == tar.TypeReg {
			body = tr
		}
		if err := fn(*e, body); err != nil {
			return err
		}
	}
}

// emptyReader is the body of an entry that is not a file.
type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, io.EOF }

// check validates one header against the entries before it.
func check(h *tar.Header, types map[string]byte) (*Entry, error) {
	raw := h.Name
	if len(raw) > MaxNameBytes {
		return nil, &Error{Entry: raw[:64] + "...", Msg: fmt.Sprintf("name longer than %d bytes", MaxNameBytes)}
	}
	if strings.ContainsRune(raw, 0) || strings.Contains(raw, "\\") {
		return nil, &Error{Entry: raw, Msg: "name holds a NUL or a backslash"}
	}
	if strings.HasPrefix(raw, "/") {
		return nil, &Error{Entry: raw, Msg: "absolute name"}
	}
	for _, part := range strings.Split(strings.TrimSuffix(raw, "/"), "/") {
		if part == ".." {
			return nil, &Error{Entry: raw, Msg: `name goes up with ".."`}
		}
	}
	name := path.Clean(raw)
	if name == "." {
		if h.Typeflag == tar.TypeDir {
			return nil, nil
		}
		return nil, &Error{Entry: raw, Msg: "empty name"}
	}
	if sparse(h) {
		// tar reads a sparse file's holes as zeros: a few KiB would unpack
		// into a file as large as the header declares.
		return nil, &Error{Entry: raw, Msg: "sparse files are not supported: archive the file whole"}
	}
	e := &Entry{Name: name, Mode: fs.FileMode(h.Mode).Perm(), Size: h.Size}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeRegA:
		e.Type = tar.TypeReg
	case tar.TypeDir:
		e.Type, e.Size = tar.TypeDir, 0
	case tar.TypeSymlink:
		e.Type, e.Size, e.Linkname = tar.TypeSymlink, 0, h.Linkname
		if err := checkLink(name, h.Linkname); err != "" {
			return nil, &Error{Entry: raw, Msg: err}
		}
	case tar.TypeLink:
		return nil, &Error{Entry: raw, Msg: "hard links are not supported: archive the file twice or use a symbolic link"}
	default:
		return nil, &Error{Entry: raw, Msg: fmt.Sprintf("entry of type %q: only files, directories and symbolic links are allowed", h.Typeflag)}
	}
	if prev, ok := types[name]; ok && !(prev == tar.TypeDir && e.Type == tar.TypeDir) {
		return nil, &Error{Entry: raw, Msg: "the name appears twice"}
	}
	// Every parent must be a directory (written or implied), never a file
	// or a link: a name under a link would be unpacked through it.
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		t, ok := types[dir]
		if ok && t != tar.TypeDir {
			return nil, &Error{Entry: raw, Msg: fmt.Sprintf("%q is not a directory", dir)}
		}
		if !ok {
			types[dir] = tar.TypeDir
		}
	}
	types[name] = e.Type
	return e, nil
}

// sparse reports whether h is a sparse file in one of GNU's PAX formats
// (tar.Reader gives them type '0', and their logical size). The old GNU
// format's type 'S' is refused with every other type.
func sparse(h *tar.Header) bool {
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// checkLink accepts a symbolic link at name whose target is relative,
// whose ".." components all lead (they climb the real directories above
// the link) and are no more than the link is deep: then the target stays
// inside the tree whatever the other links are.
func checkLink(name, target string) string {
	if target == "" {
		return "symbolic link with an empty target"
	}
	if strings.HasPrefix(target, "/") {
		return fmt.Sprintf("symbolic link to an absolute path %q", target)
	}
	if strings.ContainsRune(target, 0) || len(target) > MaxNameBytes {
		return "symbolic link target holds a NUL or is too long"
	}
	depth := strings.Count(name, "/") // directories above the link
	ups, leading := 0, true
	for _, part := range strings.Split(target, "/") {
		switch {
		case part == "..":
			if !leading {
				return fmt.Sprintf(`symbolic link target %q has ".." after a name`, target)
			}
			ups++
		case part == "" || part == ".":
		default:
			leading = false
		}
	}
	if ups > depth {
		return fmt.Sprintf("symbolic link target %q leads out of the archive", target)
	}
	return ""
}

// Check reads a whole tar stream and reports whether it may be mounted.
func Check(r io.Reader) error {
	return Walk(r, func(Entry, io.Reader) error { return nil })
}
