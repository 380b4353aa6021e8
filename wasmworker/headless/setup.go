package headless

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	experimentalsysfs "github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// setupFS is the file system of an attempt with a protocol.Setup: the
// task's root, a private directory (root/) holding its writable files,
// with the read-only blobs it mounts seen through it where they are
// mounted (roFiles) or mounted as trees of their own (roTrees), and /in
// and /out as for every task.
type setupFS struct {
	root    string
	roFiles map[string]string // guest path (without the leading /) -> host file in the data cache
	roTrees map[string]string // guest path (with the leading /) -> host tree in the data cache
	scratch outCount          // what the task writes under root/
}

// prepareSetup lays out the attempt's directory for a task with a setup:
// in/, out/ and root/ with the task's files. It runs in a directory of its
// own (not a slot's reused one) and is removed afterwards.
func (a *attempt) prepareSetup() error {
	su := a.job.Assign.Setup
	dir, err := makeAttemptDir(a.e.tmpDir)
	if err != nil {
		return err
	}
	a.dir, a.ownDir = dir, true
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	sfs := &setupFS{root: root, roFiles: map[string]string{}, roTrees: map[string]string{}}
	a.setup = sfs
	host := func(guest string) string { return filepath.Join(root, filepath.FromSlash(guest)) }

	inDir := filepath.Join(dir, "in")
	for _, in := range a.job.Assign.Inputs {
		p := filepath.Join(inDir, in.Name)
		if strings.HasPrefix(in.Name, "/") {
			// An upstream output at a path of the task's own.
			if msg := checkGuestPath(in.Name); msg != "" {
				return &badInputError{msg}
			}
			p = host(in.Name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
		} else if err := checkInputName(in.Name); err != nil {
			return err
		}
		if err := os.WriteFile(p, in.Data, 0o644); err != nil {
			return err
		}
	}
	files := make([]protocol.File, 0, len(su.Files))
	for _, f := range su.Files {
		name, ok := strings.CutPrefix(f.Path, "/in/")
		if !ok {
			files = append(files, f)
			continue
		}
		// An input uploaded over HTTP (by an upstream task): a file of
		// /in, read-only there, linked from the cache.
		if err := checkInputName(name); err != nil {
			return err
		}
		if f.Blob == "" || f.Archive || f.Writable {
			return &badInputError{fmt.Sprintf("file %s: only a read-only blob may be put under /in", f.Path)}
		}
		p := filepath.Join(inDir, name)
		if err := os.Link(dataPath(a.e.dataDir, f.Blob), p); err != nil {
			if err := copyFile(dataPath(a.e.dataDir, f.Blob), p); err != nil {
				return err
			}
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for k, f := range files {
		if f.Path != "/" {
			if msg := checkGuestPath(f.Path); msg != "" {
				return &badInputError{msg}
			}
		}
		p := host(f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch {
		case f.Data != nil:
			if err := os.WriteFile(p, []byte(*f.Data), 0o644); err != nil {
				return err
			}
		case f.Archive:
			tree := dataPath(a.e.dataDir, f.Blob) + ".d"
			// A tree is mounted as it is in the cache, read-only, unless
			// the task may change it, it is the root, or other files go
			// inside it: then the task gets a copy.
			inside := slices.ContainsFunc(files[k+1:], func(g protocol.File) bool { return strings.HasPrefix(g.Path, strings.TrimSuffix(f.Path, "/")+"/") })
			if f.Writable || f.Path == "/" || inside {
				if err := copyTree(tree, p); err != nil {
					return err
				}
			} else {
				if err := os.MkdirAll(p, 0o755); err != nil {
					return err
				}
				sfs.roTrees[f.Path] = tree
			}
		case f.Writable:
			if err := copyFile(dataPath(a.e.dataDir, f.Blob), p); err != nil {
				return err
			}
		default:
			// A placeholder, so that the directory lists it; the task
			// reads the cache's file through setupFS.
			if err := os.WriteFile(p, nil, 0o444); err != nil {
				return err
			}
			sfs.roFiles[strings.TrimPrefix(f.Path, "/")] = dataPath(a.e.dataDir, f.Blob)
		}
	}
	for _, d := range []string{"in", "out", strings.TrimPrefix(path.Clean("/"+su.Cwd), "/")} {
		if d != "" {
			if err := os.MkdirAll(host(d), 0o755); err != nil {
				return fmt.Errorf("the working directory %s: %w", su.Cwd, err)
			}
		}
	}
	sfs.scratch = outCount{dir: root, stdout: func() int64 { return 0 }, maxEntries: MaxScratchEntries,
		stop: func(le *limitError) { a.stop(le) }}
	sfs.scratch.recount()
	scratch := su.ScratchBytes
	if scratch <= 0 {
		scratch = DefaultScratchBytes
	}
	sfs.scratch.limit = sfs.scratch.bytes + scratch
	sfs.scratch.what = "scratch"
	return nil
}

// DefaultScratchBytes bounds what a task with a setup writes outside /out
// when the assignment does not say.
const DefaultScratchBytes = 1 << 30

// MaxScratchEntries bounds the files and directories a task makes outside
// /out.
const MaxScratchEntries = 100000

// checkGuestPath says what is wrong with an absolute path of a task's file
// system that an assignment names ("" when nothing).
func checkGuestPath(p string) string {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\\\x00") {
		return fmt.Sprintf("path %q is not a clean absolute path", p)
	}
	if p == "/in" || p == "/out" || strings.HasPrefix(p, "/in/") || strings.HasPrefix(p, "/out/") {
		return fmt.Sprintf("path %q is under /in or /out", p)
	}
	return ""
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyTree copies the unpacked tree from into to (merged with what is
// there).
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return copyFile(p, dst)
	})
}

// fsConfig mounts the task's file system: its root, the read-only trees,
// /in and /out, each shown through view's fsView.
func (s *setupFS) fsConfig(dir string, t *touched, out func() *outCount, view func() *fsView) wazero.FSConfig {
	fsc := wazero.NewFSConfig().(experimentalsysfs.FSConfig).
		WithSysFSMount(&viewFS{sortedFS{&rootFS{downLinkFS{countFS{experimentalsysfs.DirFS(s.root), func() *outCount { return &s.scratch }}}, s}}, view, mountRoot}, "/").(experimentalsysfs.FSConfig)
	trees := make([]string, 0, len(s.roTrees))
	for g := range s.roTrees {
		trees = append(trees, g)
	}
	sort.Strings(trees)
	for i, g := range trees {
		fsc = fsc.WithSysFSMount(&viewFS{sortedFS{&roTreeFS{&experimentalsysfs.ReadFS{FS: experimentalsysfs.DirFS(s.roTrees[g])}}}, view, mountTrees + i}, g).(experimentalsysfs.FSConfig)
	}
	return fsc.WithSysFSMount(&viewFS{sortedFS{touchFS{&roTreeFS{&experimentalsysfs.ReadFS{FS: experimentalsysfs.DirFS(filepath.Join(dir, "in"))}}, &t.in}}, view, mountIn}, "/in").(experimentalsysfs.FSConfig).
		WithSysFSMount(&viewFS{sortedFS{&downLinkFS{touchFS{countFS{experimentalsysfs.DirFS(filepath.Join(dir, "out")), out}, &t.out}}}, view, mountOut}, "/out")
}

// The mounts of a task, told apart in its fsView: the root, /in, /out,
// and the read-only trees in order of their paths.
const (
	mountRoot = iota
	mountIn
	mountOut
	mountTrees
)

// setupModuleConfig is moduleConfig for a task with a setup: its file
// system, and its environment with PWD set to its working directory
// (where Go programs start; docs/DATA.md says what C and Rust do).
func (a *attempt) setupModuleConfig() wazero.ModuleConfig {
	su := a.job.Assign.Setup
	cfg := moduleConfig(a.dir, a.touched, func() *outCount { return &a.out }, func() *fsView { return &a.view }, &a.stdin, a.stdout, a.stderr,
		a.clock.walltime, a.clock.nanotime, a.clock.nanosleep, &a.clock.rand).
		WithFSConfig(a.setup.fsConfig(a.dir, a.touched, func() *outCount { return &a.out }, func() *fsView { return &a.view }))
	env := append([]string(nil), su.Env...)
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PWD=") }) {
		cwd := su.Cwd
		if cwd == "" {
			cwd = "/"
		}
		env = append(env, "PWD="+cwd)
		sort.Strings(env) // as the browser's shim: sorted by name
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		cfg = cfg.WithEnv(k, v)
	}
	return cfg
}

// collectSetupOutputs adds the files at the setup's output paths (a file,
// or every file under a directory) to outputs, named by their absolute
// path, within the output limit.
func (a *attempt) collectSetupOutputs(outputs []protocol.Blob) ([]protocol.Blob, error) {
	total := int64(0)
	for _, o := range outputs {
		total += int64(o.Size)
	}
	for _, f := range a.files {
		total += f.Size
	}
	for _, guest := range a.job.Assign.Setup.Outputs {
		if msg := checkGuestPath(guest); msg != "" {
			continue
		}
		base := filepath.Join(a.setup.root, filepath.FromSlash(guest))
		err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			rel, err := filepath.Rel(a.setup.root, p)
			if err != nil {
				return err
			}
			name := "/" + filepath.ToSlash(rel)
			if _, ro := a.setup.roFiles[strings.TrimPrefix(name, "/")]; ro {
				return nil // a placeholder of a mounted blob
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
			if total > a.limits.OutputBytes {
				return &limitError{protocol.ReasonOutput, fmt.Sprintf("output limit of %d bytes exceeded: stdout, /out and the outputs add up to more (at %s)",
					a.limits.OutputBytes, name)}
			}
			if a.spills(info.Size()) {
				return a.spill(name, p)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			outputs = append(outputs, protocol.Blob{Name: name, Size: len(b), Data: b})
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
	}
	sort.Slice(outputs[1:], func(i, j int) bool { return outputs[1+i].Name < outputs[1+j].Name })
	return outputs, nil
}

// rootFS is the root of a task with a setup: its private tree, where the
// read-only blobs it mounts are read from the data cache and cannot be
// changed, moved or removed (nor can the directories that hold them).
type rootFS struct {
	experimentalsys.FS
	s *setupFS
}

// ro returns the cache file mounted at p, if any.
func (f rootFS) ro(p string) (string, bool) {
	h, ok := f.s.roFiles[strings.TrimPrefix(path.Clean("/"+p), "/")]
	return h, ok
}

// holds reports whether p is a mounted file or a directory holding one.
func (f rootFS) holds(p string) bool {
	c := strings.TrimPrefix(path.Clean("/"+p), "/")
	for g := range f.s.roFiles {
		if g == c || c == "" || strings.HasPrefix(g, c+"/") {
			return true
		}
	}
	for g := range f.s.roTrees {
		g = strings.TrimPrefix(g, "/")
		if g == c || c == "" || strings.HasPrefix(g, c+"/") {
			return true
		}
	}
	return false
}

func (f rootFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	h, ok := f.ro(p)
	if !ok {
		return f.FS.OpenFile(p, flag, perm)
	}
	if flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0 {
		return nil, experimentalsys.EROFS
	}
	if flag&experimentalsys.O_CREAT != 0 && flag&experimentalsys.O_EXCL != 0 {
		return nil, experimentalsys.EEXIST
	}
	if flag&experimentalsys.O_DIRECTORY != 0 {
		return nil, experimentalsys.ENOTDIR
	}
	ph, errno := f.FS.Lstat(p)
	if errno != 0 {
		return nil, errno
	}
	file, errno := experimentalsysfs.DirFS(filepath.Dir(h)).OpenFile(filepath.Base(h), experimentalsys.O_RDONLY, 0)
	if errno != 0 {
		return nil, errno
	}
	return roFile{file, ph.Dev, ph.Ino}, 0
}

func (f rootFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	if h, ok := f.ro(p); ok {
		return f.statRO(p, h)
	}
	return f.FS.Stat(p)
}

func (f rootFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	if h, ok := f.ro(p); ok {
		return f.statRO(p, h)
	}
	return f.FS.Lstat(p)
}

// statRO stats the cache file h mounted at p as the task sees it: as the
// placeholder at p that its directory lists (so that a listing and a stat
// name the same file), read-only.
func (f rootFS) statRO(p, h string) (sys.Stat_t, experimentalsys.Errno) {
	ph, errno := f.FS.Lstat(p)
	if errno != 0 {
		return ph, errno
	}
	st, errno := experimentalsysfs.DirFS(filepath.Dir(h)).Stat(filepath.Base(h))
	if errno != 0 {
		return st, errno
	}
	st.Dev, st.Ino = ph.Dev, ph.Ino
	st.Mode = 0o444
	return st, 0
}

func (f rootFS) Unlink(p string) experimentalsys.Errno {
	if f.holds(p) {
		return experimentalsys.EPERM
	}
	return f.FS.Unlink(p)
}

func (f rootFS) Rmdir(p string) experimentalsys.Errno {
	if f.holds(p) {
		return experimentalsys.EPERM
	}
	return f.FS.Rmdir(p)
}

func (f rootFS) Rename(from, to string) experimentalsys.Errno {
	if f.holds(from) || f.holds(to) {
		return experimentalsys.EPERM
	}
	return f.FS.Rename(from, to)
}

func (f rootFS) Link(oldPath, newPath string) experimentalsys.Errno {
	if f.holds(oldPath) || f.holds(newPath) {
		return experimentalsys.EPERM
	}
	return f.FS.Link(oldPath, newPath)
}

func (f rootFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	if _, ok := f.ro(p); ok {
		return experimentalsys.EROFS
	}
	return f.FS.Chmod(p, perm)
}

func (f rootFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	if _, ok := f.ro(p); ok {
		return experimentalsys.EROFS
	}
	return f.FS.Utimens(p, atim, mtim)
}

// roFile is a mounted blob opened by a task: read-only, and the
// placeholder its directory lists (rootFS.statRO).
type roFile struct {
	experimentalsys.File
	dev, ino uint64
}

func (f roFile) Stat() (sys.Stat_t, experimentalsys.Errno) {
	st, errno := f.File.Stat()
	if errno == 0 {
		st.Dev, st.Ino = f.dev, f.ino
		st.Mode = 0o444
	}
	return st, errno
}

func (f roFile) Utimens(atim, mtim int64) experimentalsys.Errno { return experimentalsys.EROFS }
func (f roFile) Truncate(int64) experimentalsys.Errno           { return experimentalsys.EBADF }
func (f roFile) Write([]byte) (int, experimentalsys.Errno)      { return 0, experimentalsys.EBADF }
func (f roFile) Pwrite([]byte, int64) (int, experimentalsys.Errno) {
	return 0, experimentalsys.EBADF
}

// roTreeFS is a read-only tree (a tree a task mounts, and /in): every
// change is EROFS, as in the browser's shim (wazero's ReadFS answers
// ENOSYS to some).
type roTreeFS struct{ experimentalsys.FS }

func (f *roTreeFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0 {
		return nil, experimentalsys.EROFS
	}
	if flag&experimentalsys.O_CREAT != 0 {
		if _, errno := f.FS.Lstat(p); errno == experimentalsys.ENOENT {
			return nil, experimentalsys.EROFS
		}
	}
	return f.FS.OpenFile(p, flag&^experimentalsys.O_CREAT, perm)
}

func (f *roTreeFS) Mkdir(string, fs.FileMode) experimentalsys.Errno { return experimentalsys.EROFS }
func (f *roTreeFS) Chmod(string, fs.FileMode) experimentalsys.Errno { return experimentalsys.EROFS }
func (f *roTreeFS) Rename(string, string) experimentalsys.Errno     { return experimentalsys.EROFS }
func (f *roTreeFS) Rmdir(string) experimentalsys.Errno              { return experimentalsys.EROFS }
func (f *roTreeFS) Unlink(string) experimentalsys.Errno             { return experimentalsys.EROFS }
func (f *roTreeFS) Link(string, string) experimentalsys.Errno       { return experimentalsys.EROFS }
func (f *roTreeFS) Symlink(string, string) experimentalsys.Errno    { return experimentalsys.EROFS }
func (f *roTreeFS) Utimens(string, int64, int64) experimentalsys.Errno {
	return experimentalsys.EROFS
}
