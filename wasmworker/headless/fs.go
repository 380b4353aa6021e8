package headless

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// inputTime is the time of every file a task finds (fsView), so that a task
// that looks at it sees the same value on every runner.
var inputTime = time.Unix(epochSeconds, 0)

// badInputError is an assignment whose inputs cannot be laid out as files.
type badInputError struct{ msg string }

func (e *badInputError) Error() string { return e.msg }

// prepareDirs creates the attempt's directory with in/ (one file per input)
// and an empty out/.
func (a *attempt) prepareDirs() error {
	seen := map[string]bool{}
	for _, in := range a.job.Assign.Inputs {
		if err := checkInputName(in.Name); err != nil {
			return err
		}
		if seen[in.Name] {
			return &badInputError{fmt.Sprintf("input %q appears twice", in.Name)}
		}
		seen[in.Name] = true
	}
	slot := a.e.slot
	if slot != nil {
		// A slot process reuses its directories, emptied after each attempt.
		dir, err := slot.attemptDir()
		if err != nil {
			return err
		}
		a.dir = dir
	} else {
		dir, err := makeAttemptDir(a.e.tmpDir)
		if err != nil {
			return err
		}
		a.dir = dir
	}
	inDir := filepath.Join(a.dir, "in")
	for _, in := range a.job.Assign.Inputs {
		p := filepath.Join(inDir, in.Name)
		if slot != nil {
			slot.inFiles = append(slot.inFiles, in.Name) // before writing: tidy removes what may exist
		}
		if err := os.WriteFile(p, in.Data, 0o444); err != nil {
			return err
		}
	}
	return nil
}

// makeAttemptDir makes a directory under parent holding empty in/ and out/.
func makeAttemptDir(parent string) (string, error) {
	dir, err := os.MkdirTemp(parent, "cyclepool-attempt-")
	if err != nil {
		return "", err
	}
	for _, sub := range []string{"in", "out"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// emptyDir removes everything in dir, touching nothing when it is already
// empty.
func emptyDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// defaultTempDir is where attempt directories go by default: /dev/shm when
// it is a writable directory with at least minShmFree bytes free (a tmpfs:
// making and removing directories there costs no disk I/O; Docker's default
// /dev/shm of 64 MiB is too small for outputs), else os.TempDir().
func defaultTempDir() string {
	const shm = "/dev/shm"
	if fi, err := os.Stat(shm); err == nil && fi.IsDir() && freeBytes(shm) >= minShmFree {
		if d, err := os.MkdirTemp(shm, "cyclepool-probe-"); err == nil {
			os.Remove(d)
			return shm
		}
	}
	return os.TempDir()
}

// minShmFree is the free space /dev/shm needs to hold attempt directories.
const minShmFree = 1 << 30

// checkInputName accepts a plain file name: not empty, not . or .., no
// slash, backslash or NUL.
func checkInputName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") {
		return &badInputError{fmt.Sprintf("input name %q is not a plain file name", name)}
	}
	return nil
}

// collectOutputs returns "stdout" and then every regular file under out/,
// named by its slash-separated path relative to out/, sorted by name. It
// fails with a limitError when the total passes the output limit.
func (a *attempt) collectOutputs() ([]protocol.Blob, error) {
	stdout := a.stdout.bytes()
	outputs := []protocol.Blob{{Name: "stdout", Size: len(stdout), Data: stdout}}
	a.inline = 0
	if len(stdout) < protocol.UploadMinBytes {
		a.inline = int64(len(stdout)) // (a larger stdout is uploaded)
	}
	total := int64(len(stdout))
	if !a.touched.out {
		// The task never used /out, which was empty when it started.
		if a.e.slot != nil {
			a.e.slot.outEmpty = true
		}
		return outputs, nil
	}
	outDir := filepath.Join(a.dir, "out")
	if empty, err := dirEmpty(outDir); err != nil {
		return nil, err
	} else if empty {
		// Most tasks write no files: one look, no walk.
		if a.e.slot != nil {
			a.e.slot.outEmpty = true
		}
		return outputs, nil
	}
	type file struct {
		name, path string
		size       int64
	}
	var files []file
	err := filepath.WalkDir(outDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil // directories are walked; anything else is ignored
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(outDir, p)
		if err != nil {
			return err
		}
		if rel == "stdout" {
			return &limitError{protocol.ReasonOutput, "the task wrote /out/stdout: that output name is reserved for standard output"}
		}
		total += info.Size()
		if total > a.limits.OutputBytes {
			return &limitError{protocol.ReasonOutput, fmt.Sprintf(
				"output limit of %d bytes exceeded: stdout and files under /out add up to more (at /out/%s)",
				a.limits.OutputBytes, filepath.ToSlash(rel))}
		}
		files = append(files, file{filepath.ToSlash(rel), p, info.Size()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	for _, f := range files {
		if a.spills(f.size) {
			if err := a.spill(f.name, f.path); err != nil {
				return nil, err
			}
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, err
		}
		if int64(len(b)) != f.size {
			return nil, fmt.Errorf("/out/%s changed size while being read", f.name)
		}
		outputs = append(outputs, protocol.Blob{Name: f.name, Size: len(b), Data: b})
	}
	return outputs, nil
}

// spill moves the output file p out of the attempt's tree into a file of
// its own in the engine's spool directory, for the worker to upload
// (wasmworker.Outcome.Files), instead of reading it into memory. In a slot
// process the file's name starts with the attempt's spillPrefix.
func (a *attempt) spill(name, p string) error {
	dir := a.e.spoolDir
	if dir == "" {
		dir = a.e.tmpDir
	}
	prefix := "cyclepool-output-"
	if a.e.slot != nil {
		prefix = spillPrefix(a.e.slot.dir, a.e.slot.seq)
	}
	f, err := os.CreateTemp(dir, prefix+"*")
	if err != nil {
		return err
	}
	spool := f.Name()
	f.Close()
	if err := os.Rename(p, spool); err != nil {
		err = copyFile(p, spool)
		if err != nil {
			os.Remove(spool)
			return err
		}
	}
	info, err := os.Stat(spool)
	if err != nil {
		os.Remove(spool)
		return err
	}
	a.files = append(a.files, wasmworker.OutputFile{Name: name, Path: spool, Size: info.Size()})
	return nil
}

// spillPrefix is how the names of the files spilled by one attempt of a
// slot process begin, in the pool's directory (the parent of slotDir, the
// slot process's own): slotDir's name and seq, the Seq of the attempt's run
// request. The parent finds an attempt's files by it, when the attempt
// ends without its outcome taking them (slotPool.dropSpills). No two
// attempts of a pool share a prefix: the pool numbers its slot processes'
// directories without ever reusing a number (a replacement process gets a
// new one), and each slot process numbers its run requests from 1.
func spillPrefix(slotDir string, seq uint32) string {
	return filepath.Base(slotDir) + "." + strconv.FormatUint(uint64(seq), 10) + ".output-"
}

// spills reports whether an output file of size bytes is left for the
// worker to upload rather than read: when the attempt uploads, a file of
// protocol.UploadMinBytes or more, or one that would take the outputs
// kept in the result frame past protocol.InlineOutputBudget. It counts
// the ones kept.
func (a *attempt) spills(size int64) bool {
	if !a.job.Upload {
		return false
	}
	if size >= protocol.UploadMinBytes || a.inline+size > protocol.InlineOutputBudget {
		return true
	}
	a.inline += size
	return false
}

// dropSpilled removes the files spill made, for an attempt that failed
// after all.
func (a *attempt) dropSpilled() {
	for _, f := range a.files {
		os.Remove(f.Path)
	}
	a.files = nil
}

// downLinkFS is a tree the task may write (/out, a setup's root) whose
// symbolic links lead only down from where they are (Symlink).
type downLinkFS struct{ experimentalsys.FS }

// touchFS is a file system that records whether the task used it at all:
// every access to /in or /out by a task goes through one of these methods
// (wazero opens a preopened directory lazily, through OpenFile, on its
// first use). A task that never touched /out left it empty, so its outputs
// need no look at the directory; a task that never touched /in did not
// move its access time. Most small tasks touch neither, and so cost no
// system call on either directory.
type touchFS struct {
	experimentalsys.FS
	touched *bool // set by every call; read once the module has returned
}

func (f touchFS) OpenFile(path string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	*f.touched = true
	return f.FS.OpenFile(path, flag, perm)
}

func (f touchFS) Lstat(path string) (sys.Stat_t, experimentalsys.Errno) {
	*f.touched = true
	return f.FS.Lstat(path)
}

func (f touchFS) Stat(path string) (sys.Stat_t, experimentalsys.Errno) {
	*f.touched = true
	return f.FS.Stat(path)
}

func (f touchFS) Mkdir(path string, perm fs.FileMode) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Mkdir(path, perm)
}

func (f touchFS) Chmod(path string, perm fs.FileMode) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Chmod(path, perm)
}

func (f touchFS) Rename(from, to string) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Rename(from, to)
}

func (f touchFS) Rmdir(path string) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Rmdir(path)
}

func (f touchFS) Unlink(path string) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Unlink(path)
}

func (f touchFS) Link(oldPath, newPath string) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Link(oldPath, newPath)
}

func (f touchFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Symlink(oldPath, linkName)
}

func (f touchFS) Readlink(path string) (string, experimentalsys.Errno) {
	*f.touched = true
	return f.FS.Readlink(path)
}

func (f touchFS) Utimens(path string, atim, mtim int64) experimentalsys.Errno {
	*f.touched = true
	return f.FS.Utimens(path, atim, mtim)
}

// Symlink implements experimentalsys.FS: a link whose target is relative
// and has no ".." component, so that it leads only down from where it is.
// The host resolves links, and no chain of such links can lead outside the
// tree (each one takes a path at least as deep as the link itself). Any
// other target is refused with EPERM, on every runner: plain wazero makes
// the link, and the host then follows it out of the sandbox.
func (f downLinkFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	if !safeLinkTarget(oldPath) {
		return experimentalsys.EPERM
	}
	return f.FS.Symlink(oldPath, linkName)
}

// safeLinkTarget reports whether a task may make a symbolic link to
// target (downLinkFS.Symlink).
func safeLinkTarget(target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || strings.ContainsAny(target, "\\\x00") {
		return false
	}
	for _, c := range strings.Split(target, "/") {
		if c == ".." {
			return false
		}
	}
	return true
}

// MaxOutEntries bounds the files and directories a task may make under
// /out: each output's name travels in the header of the result frame,
// which is bounded (protocol.MaxHeaderBytes), and each entry costs the
// worker memory when /out is a tmpfs.
const MaxOutEntries = 1000

// errOutFull is the panic that ends a module that broke its output limit
// through /out (see cappedWriter: the panic ends the host call at once).
var errOutFull = errors.New("output limit exceeded under /out")

// outCount keeps an attempt's /out within its limits as the task writes:
// at most limit bytes (stdout included) and MaxOutEntries files and
// directories. A write, truncation, creation or link that would cross a
// limit is not done: the attempt is stopped with limit_output at once
// (stop, then a panic that ends the host call), so that /out never holds
// much more than the limit, where it used to be measured only once the
// task had exited (a task with a limit of 1 MiB wrote 3,000 MiB to
// /dev/shm first).
//
// bytes and entries never count less than /out holds: every operation
// that can add to it adds at least what it adds, and nothing is taken
// off when the task truncates or removes (cheap and safe). When a count
// would pass its limit, it is first made exact by walking /out (recount),
// so that a task that rewrites or removes files is not stopped for bytes
// it no longer holds. The module calls into one goroutine at a time: no
// locking.
type outCount struct {
	dir     string            // the host directory of /out
	limit   int64             // bytes, stdout included
	stdout  func() int64      // bytes written to stdout so far
	stop    func(*limitError) // stops the attempt with that cause
	bytes   int64
	entries int
	// maxEntries bounds entries (0: MaxOutEntries); what, when set, names
	// the space counted in messages ("scratch": a task's own tree).
	maxEntries int
	what       string
}

// max is the bound on entries.
func (c *outCount) max() int {
	if c.maxEntries > 0 {
		return c.maxEntries
	}
	return MaxOutEntries
}

// bytesMsg is the message of a write of name that passes the limit.
func (c *outCount) bytesMsg(verb, name string) string {
	if c.what != "" {
		return fmt.Sprintf("%s limit of %d bytes exceeded: the task's files outside /out would add up to more (%s /%s)",
			c.what, c.limit, verb, name)
	}
	return fmt.Sprintf("output limit of %d bytes exceeded: stdout and files under /out would add up to more (%s /out/%s)",
		c.limit, verb, name)
}

// room reports whether growth more bytes fit.
func (c *outCount) room(growth int64) bool {
	return c.bytes+growth+c.stdout() <= c.limit
}

// grow accounts for a write of n bytes to f at off (-1: f's position) or,
// when trunc, for truncating f to n bytes, before it happens; it stops the
// attempt when that would cross the limit. What counts is how far the
// write takes the file's size, holes included, not how many bytes it
// writes: a file never stores more than its size, but one byte written a
// page past the end stores a page (counting the bytes written let a task
// fill 4,096 times its limit of /dev/shm or disk, one byte a page).
func (c *outCount) grow(f experimentalsys.File, name string, n, off int64, trunc bool) {
	growth := n // appending adds n bytes
	if trunc || !f.IsAppend() {
		growth = c.growth(f, n, off, trunc)
	}
	if !c.room(growth) {
		c.recount()
		if !c.room(growth) {
			c.exceed(c.bytesMsg("writing", name))
		}
	}
	c.bytes += growth
}

// growth returns how much a write or truncation (as grow's arguments say)
// that does not append adds to f's size. When f's size cannot be read it
// returns the end of the write, or the size it truncates to: at least what
// it adds.
func (c *outCount) growth(f experimentalsys.File, n, off int64, trunc bool) int64 {
	end := off + n
	if trunc {
		end = n
	}
	st, errno := f.Stat()
	if off < 0 && !trunc {
		pos, serr := f.Seek(0, io.SeekCurrent)
		if serr != 0 {
			if errno != 0 {
				return max(n, 0)
			}
			pos = st.Size
		}
		end = pos + n
	}
	if errno != 0 {
		return max(end, 0)
	}
	return max(end-st.Size, 0)
}

// create accounts for a new entry at name before it is made (exists
// reports whether something is there already, in which case nothing is
// made); it stops the attempt when that would cross MaxOutEntries.
func (c *outCount) create(name string, exists func() bool) {
	if c.entries < c.max() {
		c.entries++ // at most what the creation adds
		return
	}
	if exists() {
		return
	}
	c.recount()
	if c.entries >= c.max() {
		if c.what != "" {
			c.exceed(fmt.Sprintf("%s limit of %d files and directories outside /out exceeded (creating /%s)", c.what, c.max(), name))
		}
		c.exceed(fmt.Sprintf("output limit of %d files and directories under /out exceeded (creating /out/%s)", c.max(), name))
	}
	c.entries++
}

// recount sets the counts to what /out holds. On an error it keeps them:
// they stay above the truth.
func (c *outCount) recount() {
	var n int
	var total int64
	err := filepath.WalkDir(c.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == c.dir {
			return nil
		}
		n++
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	if err == nil {
		c.entries, c.bytes = n, total
	}
}

// exceed stops the attempt with limit_output and ends the host call.
func (c *outCount) exceed(msg string) {
	c.stop(&limitError{protocol.ReasonOutput, msg})
	panic(errOutFull)
}

// countFS is the /out file system of an attempt, which counts what the task
// writes (see outCount); cur returns the attempt's counts.
type countFS struct {
	experimentalsys.FS
	cur func() *outCount
}

func (f countFS) OpenFile(path string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if flag&experimentalsys.O_CREAT != 0 {
		f.cur().create(path, func() bool {
			_, errno := f.FS.Lstat(path)
			return errno == 0
		})
	}
	file, errno := f.FS.OpenFile(path, flag, perm)
	if errno != 0 || flag&(experimentalsys.O_RDWR|experimentalsys.O_WRONLY) == 0 {
		return file, errno
	}
	return &countFile{File: file, fs: f, name: path}, 0
}

func (f countFS) Mkdir(path string, perm fs.FileMode) experimentalsys.Errno {
	f.cur().create(path, func() bool {
		_, errno := f.FS.Lstat(path)
		return errno == 0
	})
	return f.FS.Mkdir(path, perm)
}

// Symlink implements experimentalsys.FS: a link is an entry.
func (f countFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	f.cur().create(linkName, func() bool {
		_, errno := f.FS.Lstat(linkName)
		return errno == 0
	})
	return f.FS.Symlink(oldPath, linkName)
}

// Link implements experimentalsys.FS: a second name of a file is a second
// output of its size.
func (f countFS) Link(oldPath, newPath string) experimentalsys.Errno {
	st, errno := f.FS.Lstat(oldPath)
	if errno != 0 {
		return errno
	}
	c := f.cur()
	c.create(newPath, func() bool {
		_, errno := f.FS.Lstat(newPath)
		return errno == 0
	})
	if !c.room(st.Size) {
		c.recount()
		if !c.room(st.Size) {
			c.exceed(c.bytesMsg("linking", newPath))
		}
	}
	c.bytes += st.Size
	return f.FS.Link(oldPath, newPath)
}

// countFile is a file opened for writing under /out.
type countFile struct {
	experimentalsys.File
	fs   countFS
	name string
}

func (f *countFile) Write(buf []byte) (int, experimentalsys.Errno) {
	f.fs.cur().grow(f.File, f.name, int64(len(buf)), -1, false)
	return f.File.Write(buf)
}

func (f *countFile) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	f.fs.cur().grow(f.File, f.name, int64(len(buf)), off, false)
	return f.File.Pwrite(buf, off)
}

func (f *countFile) Truncate(size int64) experimentalsys.Errno {
	f.fs.cur().grow(f.File, f.name, size, 0, true)
	return f.File.Truncate(size)
}

// IsNonblock, SetNonblock and Poll make a countFile the PollableFile its
// file is (an os file), for fd_fdstat_set_flags and poll_oneoff.

func (f *countFile) IsNonblock() bool {
	if pf, ok := f.File.(experimentalsys.PollableFile); ok {
		return pf.IsNonblock()
	}
	return false
}

func (f *countFile) SetNonblock(enable bool) experimentalsys.Errno {
	if pf, ok := f.File.(experimentalsys.PollableFile); ok {
		return pf.SetNonblock(enable)
	}
	return experimentalsys.ENOSYS
}

func (f *countFile) Poll(flag experimentalsys.Pflag, timeoutMillis int32) (bool, experimentalsys.Errno) {
	if pf, ok := f.File.(experimentalsys.PollableFile); ok {
		return pf.Poll(flag, timeoutMillis)
	}
	return false, experimentalsys.ENOSYS
}

// sortedFS lists directories in name order (bytewise), whatever the host
// file system's order, so that a task lists the same tree the same way on
// every runner and every host (docs/DATA.md, "Conformance").
type sortedFS struct{ experimentalsys.FS }

// OpenFile implements experimentalsys.FS.
func (f sortedFS) OpenFile(path string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	file, errno := f.FS.OpenFile(path, flag, perm)
	if errno != 0 {
		return nil, errno
	}
	if dir, errno := file.IsDir(); errno == 0 && dir {
		return &sortedDir{File: file}, 0
	}
	return file, 0
}

// sortedDir is a directory whose entries are read whole and sorted on the
// first Readdir, and again after a rewind. It does not wrap Seek (whose
// experimentalsys signature go vet takes for a broken io.Seeker): it reads
// the host's directory to its end, so when the host lists more it was
// either rewound (wazero rewinds with Seek for a cookie of 0) or, on some
// file systems (tmpfs of Linux 6.6 to 6.11), lists entries made since
// after the end. A listing that repeats an entry is a rewind; new entries
// alone go at the end, so that the listing in progress stays whole.
type sortedDir struct {
	experimentalsys.File
	ents []experimentalsys.Dirent
	read bool
	pos  int
}

// Readdir implements experimentalsys.File.
func (d *sortedDir) Readdir(n int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	if d.read {
		probe, errno := d.File.Readdir(1)
		if errno != 0 {
			return nil, errno
		}
		if len(probe) > 0 {
			rest, errno := d.File.Readdir(-1)
			if errno != 0 {
				return nil, errno
			}
			more := append(probe, rest...)
			sortDirents(more)
			if d.repeats(more) {
				d.ents, d.pos = more, 0
			} else {
				d.ents = append(d.ents, more...)
			}
		}
	} else {
		all, errno := d.File.Readdir(-1)
		if errno != 0 {
			return nil, errno
		}
		sortDirents(all)
		d.ents, d.read, d.pos = all, true, 0
	}
	end := len(d.ents)
	if n > 0 {
		end = min(d.pos+n, end)
	}
	out := d.ents[d.pos:end]
	d.pos = end
	return out, 0
}

// repeats reports whether more lists an entry listed already.
func (d *sortedDir) repeats(more []experimentalsys.Dirent) bool {
	seen := make(map[string]bool, len(d.ents))
	for _, e := range d.ents {
		seen[e.Name] = true
	}
	for _, e := range more {
		if seen[e.Name] {
			return true
		}
	}
	return false
}

func sortDirents(ds []experimentalsys.Dirent) {
	sort.Slice(ds, func(i, j int) bool { return ds[i].Name < ds[j].Name })
}
