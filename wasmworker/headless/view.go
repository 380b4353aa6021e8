package headless

import (
	"io/fs"
	"path"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"
)

// fsView is what one attempt's task sees of its files' identity and times,
// whatever the host: inode numbers from 1 in the order the task first sees
// its files, no device, times from the task's own clock (docs/DATA.md,
// "Conformance"), as the browser's shim gives them:
//   - every file the task did not make or change is at inputTime;
//   - a file or directory the task makes, a file it writes, truncates or
//     opens with O_TRUNC, and a directory it makes a file in take the
//     task's wall clock at that moment, without advancing it;
//   - times the task sets are kept; the access time follows the
//     modification time until the task sets it (reads do not move it), and
//     the change time is the modification time.
//
// A task "sees" a file when it stats it (by path or descriptor) or lists
// its directory; a file the task makes is new when first seen, even where
// the host reuses the inode of one it removed. The module calls into one
// goroutine at a time: no locking.
type fsView struct {
	clock *deterministicClock
	inos  map[nodeKey]uint64
	last  uint64 // the last inode number given
	times map[nodeKey]nodeTimes
}

// nodeKey is a host file within one mount of the task (the same host tree
// mounted twice is two trees to the task, as in the browser).
type nodeKey struct {
	mount    int
	dev, ino uint64
}

// nodeTimes are the times of a file the task made or changed.
type nodeTimes struct {
	atim, mtim int64
	atimSet    bool
}

// now is the time a file changes at: the task's wall clock, not advanced.
func (v *fsView) now() int64 { return epochSeconds*1e9 + v.clock.counter }

// number returns the inode number of k, giving it the next one when the
// task sees it for the first time.
func (v *fsView) number(k nodeKey) uint64 {
	if n, ok := v.inos[k]; ok {
		return n
	}
	if v.inos == nil {
		v.inos = map[nodeKey]uint64{}
	}
	v.last++
	v.inos[k] = v.last
	return v.last
}

func (v *fsView) set(k nodeKey, t nodeTimes) {
	if v.times == nil {
		v.times = map[nodeKey]nodeTimes{}
	}
	v.times[k] = t
}

// made records a file the task made just now.
func (v *fsView) made(k nodeKey) {
	delete(v.inos, k)
	v.set(k, nodeTimes{mtim: v.now()})
}

// changed records that the task changed the contents of k just now.
func (v *fsView) changed(k nodeKey) {
	t, ok := v.times[k]
	if ok && t.mtim == v.now() {
		return // (most writes after the first)
	}
	t.mtim = v.now()
	v.set(k, t)
}

// setTimes records times the task set; UTIME_OMIT leaves one as it is.
func (v *fsView) setTimes(k nodeKey, atim, mtim int64) {
	t, ok := v.times[k]
	if !ok {
		t.mtim = inputTime.UnixNano()
	}
	if atim != experimentalsys.UTIME_OMIT {
		t.atim, t.atimSet = atim, true
	}
	if mtim != experimentalsys.UTIME_OMIT {
		t.mtim = mtim
	}
	v.set(k, t)
}

// stat turns the host's view of a file of mount into the task's.
func (v *fsView) stat(mount int, st sys.Stat_t) sys.Stat_t {
	k := nodeKey{mount, st.Dev, st.Ino}
	st.Dev, st.Ino = 0, v.number(k)
	t, ok := v.times[k]
	if !ok {
		t.mtim = inputTime.UnixNano()
	}
	st.Mtim, st.Ctim, st.Atim = t.mtim, t.mtim, t.mtim
	if t.atimSet {
		st.Atim = t.atim
	}
	if st.Mode.IsDir() {
		st.Size = 0 // (the host's depends on its file system)
	}
	return st
}

// viewFS shows a mounted tree through the attempt's fsView. It is used by
// pointer: wazero compares the file systems of a rename's two directories.
type viewFS struct {
	experimentalsys.FS
	view  func() *fsView // the current attempt's
	mount int
}

// key returns the node st describes.
func (f *viewFS) key(st sys.Stat_t) nodeKey { return nodeKey{f.mount, st.Dev, st.Ino} }

// OpenFile implements experimentalsys.FS.
func (f *viewFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	created := false
	if flag&experimentalsys.O_CREAT != 0 {
		_, errno := f.FS.Lstat(p)
		created = errno == experimentalsys.ENOENT
	}
	file, errno := f.FS.OpenFile(p, flag, perm)
	if errno != 0 {
		return nil, errno
	}
	vf := &viewFile{File: file, fs: f}
	if created || flag&experimentalsys.O_TRUNC != 0 {
		if k, ok := vf.key(); ok {
			if created {
				f.view().made(k)
			} else {
				f.view().changed(k)
			}
		}
	}
	if created {
		if st, errno := f.FS.Stat(path.Dir(p)); errno == 0 {
			f.view().changed(f.key(st))
		}
	}
	if _, ok := file.(experimentalsys.PollableFile); ok {
		return &viewPollFile{vf}, 0
	}
	return vf, 0
}

// Stat implements experimentalsys.FS.
func (f *viewFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	st, errno := f.FS.Stat(p)
	if errno != 0 {
		return st, errno
	}
	return f.view().stat(f.mount, st), 0
}

// Lstat implements experimentalsys.FS.
func (f *viewFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	st, errno := f.FS.Lstat(p)
	if errno != 0 {
		return st, errno
	}
	return f.view().stat(f.mount, st), 0
}

// Mkdir implements experimentalsys.FS.
func (f *viewFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if errno := f.FS.Mkdir(p, perm); errno != 0 {
		return errno
	}
	if st, errno := f.FS.Lstat(p); errno == 0 {
		f.view().made(f.key(st))
	}
	return 0
}

// Symlink implements experimentalsys.FS.
func (f *viewFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	if errno := f.FS.Symlink(oldPath, linkName); errno != 0 {
		return errno
	}
	if st, errno := f.FS.Lstat(linkName); errno == 0 {
		f.view().made(f.key(st))
	}
	return 0
}

// Utimens implements experimentalsys.FS.
func (f *viewFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	if errno := f.FS.Utimens(p, atim, mtim); errno != 0 {
		return errno
	}
	if st, errno := f.FS.Stat(p); errno == 0 {
		f.view().setTimes(f.key(st), atim, mtim)
	}
	return 0
}

// viewFile is a file or directory opened through a viewFS.
type viewFile struct {
	experimentalsys.File
	fs    *viewFS
	k     nodeKey
	known bool // k is set
}

// key returns the node the file is.
func (f *viewFile) key() (nodeKey, bool) {
	if !f.known {
		st, errno := f.File.Stat()
		if errno != 0 {
			return nodeKey{}, false
		}
		f.k, f.known = f.fs.key(st), true
	}
	return f.k, true
}

// changed records a change of the file's contents.
func (f *viewFile) changed() {
	if k, ok := f.key(); ok {
		f.fs.view().changed(k)
	}
}

// Stat implements experimentalsys.File.
func (f *viewFile) Stat() (sys.Stat_t, experimentalsys.Errno) {
	st, errno := f.File.Stat()
	if errno != 0 {
		return st, errno
	}
	f.k, f.known = f.fs.key(st), true
	return f.fs.view().stat(f.fs.mount, st), 0
}

// Ino implements experimentalsys.File (wazero's "." entry of a listing).
func (f *viewFile) Ino() (sys.Inode, experimentalsys.Errno) {
	k, ok := f.key()
	if !ok {
		return 0, experimentalsys.EBADF
	}
	return f.fs.view().number(k), 0
}

// Readdir implements experimentalsys.File: the entries take the task's
// inode numbers, in the order listed.
func (f *viewFile) Readdir(n int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	ents, errno := f.File.Readdir(n)
	if errno != 0 || len(ents) == 0 {
		return ents, errno
	}
	k, ok := f.key()
	if !ok {
		return nil, experimentalsys.EBADF
	}
	v := f.fs.view()
	out := make([]experimentalsys.Dirent, len(ents)) // (ents may be a listing kept by sortedDir)
	for i, e := range ents {
		e.Ino = v.number(nodeKey{f.fs.mount, k.dev, e.Ino})
		out[i] = e
	}
	return out, 0
}

// Write implements experimentalsys.File.
func (f *viewFile) Write(buf []byte) (int, experimentalsys.Errno) {
	n, errno := f.File.Write(buf)
	if errno == 0 {
		f.changed()
	}
	return n, errno
}

// Pwrite implements experimentalsys.File.
func (f *viewFile) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	n, errno := f.File.Pwrite(buf, off)
	if errno == 0 {
		f.changed()
	}
	return n, errno
}

// Truncate implements experimentalsys.File (fd_filestat_set_size, and
// fd_allocate past the end).
func (f *viewFile) Truncate(size int64) experimentalsys.Errno {
	errno := f.File.Truncate(size)
	if errno == 0 {
		f.changed()
	}
	return errno
}

// Utimens implements experimentalsys.File.
func (f *viewFile) Utimens(atim, mtim int64) experimentalsys.Errno {
	errno := f.File.Utimens(atim, mtim)
	if errno == 0 {
		if k, ok := f.key(); ok {
			f.fs.view().setTimes(k, atim, mtim)
		}
	}
	return errno
}

// viewPollFile is a viewFile whose file is a PollableFile (a host file,
// not a directory), for fd_fdstat_set_flags and poll_oneoff: wazero tells
// the two apart by that interface.
type viewPollFile struct{ *viewFile }

func (f viewPollFile) IsNonblock() bool {
	return f.File.(experimentalsys.PollableFile).IsNonblock()
}

func (f viewPollFile) SetNonblock(enable bool) experimentalsys.Errno {
	return f.File.(experimentalsys.PollableFile).SetNonblock(enable)
}

func (f viewPollFile) Poll(flag experimentalsys.Pflag, timeoutMillis int32) (bool, experimentalsys.Errno) {
	return f.File.(experimentalsys.PollableFile).Poll(flag, timeoutMillis)
}
