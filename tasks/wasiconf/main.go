//go:build wasip1

// Command wasiconf is the conformance test of the file-system calls of WASI
// preview 1 (docs/DATA.md, "Conformance"): it calls each one directly, with
// the flags and the edge cases a program meets (every path_open flag,
// directory listing by cookie, seek and tell, pread and pwrite, append,
// truncation, rename, hard and symbolic links, dangling and looping links,
// unlink, stat and its setters, renumber, advise, allocate, rights,
// non-blocking and terminal checks), inside the preopened directory named
// by its first argument (default /out), and prints one line per check:
// its name, the errno and what it read. Runners that agree print the same
// lines; inode numbers and times that come from the host are printed as
// relations (same inode, time set as asked), not as values.
//
// With a second argument "values", it prints instead the inode numbers and
// times a sequence of calls shows, as values: the runners give them from
// the task, not the host, so two runs, on any runner and any host, print
// the same (plain wazero prints the host's).
package main

import (
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"
)

// Errno and flag values of WASI preview 1.
const (
	oCreat     = 1
	oDirectory = 2
	oExcl      = 4
	oTrunc     = 8

	fdAppend   = 1
	fdNonblock = 4

	lookupFollow = 1

	whenceSet = 0
	whenceCur = 1
	whenceEnd = 2

	setAtim = 1 << 0
	setMtim = 1 << 2

	rightsAll    = int64(-1) >> 35 // the 29 rights
	rightRead    = int64(1 << 1)
	rightWrite   = int64(1 << 6)
	rightReaddir = int64(1 << 14)
)

//go:wasmimport wasi_snapshot_preview1 fd_prestat_get
func fdPrestatGet(fd int32, buf unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_prestat_dir_name
func fdPrestatDirName(fd int32, buf unsafe.Pointer, n int32) int32

//go:wasmimport wasi_snapshot_preview1 path_open
func pathOpen(fd, dirflags int32, path unsafe.Pointer, pathLen, oflags int32, base, inheriting int64, fdflags int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_close
func fdClose(fd int32) int32

//go:wasmimport wasi_snapshot_preview1 fd_write
func fdWrite(fd int32, iovs unsafe.Pointer, n int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_read
func fdRead(fd int32, iovs unsafe.Pointer, n int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_pwrite
func fdPwrite(fd int32, iovs unsafe.Pointer, n int32, off int64, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_pread
func fdPread(fd int32, iovs unsafe.Pointer, n int32, off int64, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_seek
func fdSeek(fd int32, off int64, whence int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_tell
func fdTell(fd int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_readdir
func fdReaddir(fd int32, buf unsafe.Pointer, n int32, cookie int64, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_filestat_get
func fdFilestatGet(fd int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_filestat_set_size
func fdFilestatSetSize(fd int32, size int64) int32

//go:wasmimport wasi_snapshot_preview1 fd_filestat_set_times
func fdFilestatSetTimes(fd int32, atim, mtim int64, flags int32) int32

//go:wasmimport wasi_snapshot_preview1 path_filestat_get
func pathFilestatGet(fd, flags int32, path unsafe.Pointer, n int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 path_filestat_set_times
func pathFilestatSetTimes(fd, flags int32, path unsafe.Pointer, n int32, atim, mtim int64, fst int32) int32

//go:wasmimport wasi_snapshot_preview1 path_create_directory
func pathCreateDirectory(fd int32, path unsafe.Pointer, n int32) int32

//go:wasmimport wasi_snapshot_preview1 path_remove_directory
func pathRemoveDirectory(fd int32, path unsafe.Pointer, n int32) int32

//go:wasmimport wasi_snapshot_preview1 path_unlink_file
func pathUnlinkFile(fd int32, path unsafe.Pointer, n int32) int32

//go:wasmimport wasi_snapshot_preview1 path_rename
func pathRename(fd int32, old unsafe.Pointer, oldN int32, newFd int32, new unsafe.Pointer, newN int32) int32

//go:wasmimport wasi_snapshot_preview1 path_link
func pathLink(oldFd, flags int32, old unsafe.Pointer, oldN int32, newFd int32, new unsafe.Pointer, newN int32) int32

//go:wasmimport wasi_snapshot_preview1 path_symlink
func pathSymlink(old unsafe.Pointer, oldN int32, fd int32, new unsafe.Pointer, newN int32) int32

//go:wasmimport wasi_snapshot_preview1 path_readlink
func pathReadlink(fd int32, path unsafe.Pointer, n int32, buf unsafe.Pointer, bufN int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_renumber
func fdRenumber(from, to int32) int32

//go:wasmimport wasi_snapshot_preview1 fd_advise
func fdAdvise(fd int32, off, n int64, advice int32) int32

//go:wasmimport wasi_snapshot_preview1 fd_allocate
func fdAllocate(fd int32, off, n int64) int32

//go:wasmimport wasi_snapshot_preview1 fd_fdstat_get
func fdFdstatGet(fd int32, out unsafe.Pointer) int32

//go:wasmimport wasi_snapshot_preview1 fd_fdstat_set_flags
func fdFdstatSetFlags(fd, flags int32) int32

//go:wasmimport wasi_snapshot_preview1 fd_sync
func fdSync(fd int32) int32

//go:wasmimport wasi_snapshot_preview1 fd_datasync
func fdDatasync(fd int32) int32

//go:wasmimport wasi_snapshot_preview1 sock_shutdown
func sockShutdown(fd, how int32) int32

// dir is the preopened directory the checks run in.
var dir int32 = -1

func main() {
	want := "/out"
	if len(os.Args) > 1 {
		want = os.Args[1]
	}
	for fd := int32(3); fd < 64; fd++ {
		var pre [8]byte
		if fdPrestatGet(fd, unsafe.Pointer(&pre[0])) != 0 {
			break
		}
		n := *(*uint32)(unsafe.Pointer(&pre[4]))
		name := make([]byte, n)
		if fdPrestatDirName(fd, unsafe.Pointer(&name[0]), int32(n)) == 0 && string(name) == want {
			dir = fd
		}
	}
	if dir < 0 {
		fmt.Println("no preopened directory", want)
		os.Exit(1)
	}
	if len(os.Args) > 2 && os.Args[2] == "values" {
		values()
		return
	}
	checks()
}

func ptr(s string) (unsafe.Pointer, int32) {
	if s == "" {
		return nil, 0
	}
	b := []byte(s)
	return unsafe.Pointer(&b[0]), int32(len(b))
}

func open(path string, dirflags, oflags int32, base int64, fdflags int32) (int32, int32) {
	p, n := ptr(path)
	var fd int32
	e := pathOpen(dir, dirflags, p, n, oflags, base, base, fdflags, unsafe.Pointer(&fd))
	return fd, e
}

type iovec struct {
	buf uint32
	n   uint32
}

func write(fd int32, s string) (int32, int32) {
	b := []byte(s)
	iov := iovec{uint32(uintptr(unsafe.Pointer(&b[0]))), uint32(len(b))}
	var n int32
	e := fdWrite(fd, unsafe.Pointer(&iov), 1, unsafe.Pointer(&n))
	return n, e
}

func read(fd int32, max int) (string, int32) {
	b := make([]byte, max+1)
	iov := iovec{uint32(uintptr(unsafe.Pointer(&b[0]))), uint32(max)}
	var n int32
	e := fdRead(fd, unsafe.Pointer(&iov), 1, unsafe.Pointer(&n))
	return string(b[:n]), e
}

func pwrite(fd int32, s string, off int64) (int32, int32) {
	b := []byte(s)
	iov := iovec{uint32(uintptr(unsafe.Pointer(&b[0]))), uint32(len(b))}
	var n int32
	e := fdPwrite(fd, unsafe.Pointer(&iov), 1, off, unsafe.Pointer(&n))
	return n, e
}

func pread(fd int32, max int, off int64) (string, int32) {
	b := make([]byte, max+1)
	iov := iovec{uint32(uintptr(unsafe.Pointer(&b[0]))), uint32(max)}
	var n int32
	e := fdPread(fd, unsafe.Pointer(&iov), 1, off, unsafe.Pointer(&n))
	return string(b[:n]), e
}

func seek(fd int32, off int64, whence int32) (int64, int32) {
	var pos int64
	e := fdSeek(fd, off, whence, unsafe.Pointer(&pos))
	return pos, e
}

func tell(fd int32) (int64, int32) {
	var pos int64
	e := fdTell(fd, unsafe.Pointer(&pos))
	return pos, e
}

// filestat is WASI's filestat (64 bytes).
type filestat struct {
	dev, ino         uint64
	filetype         uint8
	_                [7]byte
	nlink, size      uint64
	atim, mtim, ctim uint64
}

func fstat(fd int32) (filestat, int32) {
	var st filestat
	e := fdFilestatGet(fd, unsafe.Pointer(&st))
	return st, e
}

func stat(path string, flags int32) (filestat, int32) {
	var st filestat
	p, n := ptr(path)
	e := pathFilestatGet(dir, flags, p, n, unsafe.Pointer(&st))
	return st, e
}

func (st filestat) String() string {
	return fmt.Sprintf("type=%d nlink=%d size=%d", st.filetype, st.nlink, st.size)
}

// fdstat is WASI's fdstat (24 bytes).
type fdstat struct {
	filetype uint8
	_        uint8
	flags    uint16
	_        uint32
	base     uint64
	inh      uint64
}

func fdstatOf(fd int32) (fdstat, int32) {
	var st fdstat
	e := fdFdstatGet(fd, unsafe.Pointer(&st))
	return st, e
}

func readdir(fd int32, bufSize int, cookie int64) (names []string, next []int64, e int32) {
	buf := make([]byte, bufSize)
	var used int32
	e = fdReaddir(fd, unsafe.Pointer(&buf[0]), int32(bufSize), cookie, unsafe.Pointer(&used))
	b := buf[:used]
	for len(b) >= 24 {
		nx := *(*int64)(unsafe.Pointer(&b[0]))
		n := *(*uint32)(unsafe.Pointer(&b[16]))
		typ := b[20]
		if len(b) < 24+int(n) {
			break // cut: the caller asks again from the last cookie
		}
		names = append(names, fmt.Sprintf("%s/%d", b[24:24+int(n)], typ))
		next = append(next, nx)
		b = b[24+int(n):]
	}
	return names, next, e
}

func line(name string, args ...any) {
	fmt.Println(name + ": " + strings.TrimSpace(fmt.Sprintln(args...)))
}

func checks() {
	// path_open and its flags.
	a, e := open("a", 0, oCreat|oExcl, rightsAll, 0)
	line("open creat excl", e)
	_, e = open("a", 0, oCreat|oExcl, rightsAll, 0)
	line("open creat excl again", e)
	_, e = open("missing", 0, 0, rightsAll, 0)
	line("open missing", e)
	_, e = open("a", 0, oDirectory, rightsAll, 0)
	line("open file as directory", e)
	_, e = open("../escape", 0, oCreat, rightsAll, 0)
	line("open escaping", e)
	_, e = open("/abs", 0, oCreat, rightsAll, 0)
	line("open absolute", e)
	_, e = open("", 0, 0, rightsAll, 0)
	line("open empty path", e)

	// Writing, seeking and reading.
	n, e := write(a, "hello world")
	line("write", n, e)
	pos, e := tell(a)
	line("tell", pos, e)
	pos, e = seek(a, -5, whenceEnd)
	line("seek end", pos, e)
	s, e := read(a, 100)
	line("read", s, e)
	s, e = read(a, 100)
	line("read at end", len(s), e)
	pos, e = seek(a, 2, whenceSet)
	line("seek set", pos, e)
	pos, e = seek(a, 3, whenceCur)
	line("seek cur", pos, e)
	_, e = seek(a, -100, whenceCur)
	line("seek before start", e)
	_, e = seek(a, 0, 7)
	line("seek bad whence", e)
	s, e = pread(a, 4, 0)
	line("pread", s, e)
	pos, _ = tell(a)
	line("tell after pread", pos)
	n, e = pwrite(a, "J", 0)
	line("pwrite", n, e)
	s, _ = pread(a, 5, 0)
	line("pread after pwrite", s)
	n, e = pwrite(a, "far", 20)
	line("pwrite past end", n, e)
	st, e := fstat(a)
	line("fstat", st, e)
	s, _ = pread(a, 30, 0)
	line("hole reads zeros", strings.ReplaceAll(s, "\x00", "0"))

	// Truncation, allocation, advice, sync.
	line("set size 3", fdFilestatSetSize(a, 3))
	st, _ = fstat(a)
	line("size after shrink", st.size)
	line("set size 6", fdFilestatSetSize(a, 6))
	s, _ = pread(a, 10, 0)
	line("content after grow", strings.ReplaceAll(s, "\x00", "0"))
	line("allocate", fdAllocate(a, 0, 100))
	st, _ = fstat(a)
	line("size after allocate", st.size)
	line("advise dontneed", fdAdvise(a, 0, 0, 4))
	line("advise bad", fdAdvise(a, 0, 0, 99))
	line("sync", fdSync(a))
	line("datasync", fdDatasync(a))

	// fdstat, flags, append, non-blocking.
	fs, e := fdstatOf(a)
	line("fdstat file", fs.filetype, fs.flags, e)
	line("set flags append", fdFdstatSetFlags(a, fdAppend))
	pos, _ = seek(a, 0, whenceSet)
	write(a, "Z")
	s, _ = pread(a, 20, 0)
	line("write after append flag", strings.ReplaceAll(s, "\x00", "0"))
	line("set flags nonblock", fdFdstatSetFlags(a, fdNonblock))
	fs, _ = fdstatOf(a)
	line("flags now", fs.flags)
	line("close", fdClose(a))
	line("close again", fdClose(a))
	_, e = write(a, "x")
	line("write closed", e)

	b, e := open("b", 0, oCreat, rightsAll, fdAppend)
	line("open append", e)
	write(b, "one")
	seek(b, 0, whenceSet)
	write(b, "two")
	s, _ = pread(b, 20, 0)
	line("append writes", s)
	fs, _ = fdstatOf(b)
	line("append flag", fs.flags)
	fdClose(b)
	b, e = open("b", 0, oTrunc, rightsAll, 0)
	st, _ = fstat(b)
	line("open trunc", st.size, e)
	fdClose(b)

	// Rights.
	r, e := open("b", 0, 0, rightRead, 0)
	line("open read-only rights", e)
	_, e = write(r, "no")
	line("write without the right", e)
	fdClose(r)
	w, e := open("b", 0, 0, rightWrite, 0)
	line("open write-only rights", e)
	_, e = read(w, 10)
	line("read without the right", e)
	fdClose(w)

	// Terminals and sockets.
	for fd := int32(0); fd < 3; fd++ {
		fs, e := fdstatOf(fd)
		line(fmt.Sprintf("fdstat %d", fd), fs.filetype, e)
	}
	line("sock_shutdown stdout", sockShutdown(1, 2))
	line("sock_shutdown closed", sockShutdown(99, 2))

	// Directories and listing by cookie.
	p, pn := ptr("d")
	line("mkdir", pathCreateDirectory(dir, p, pn))
	line("mkdir again", pathCreateDirectory(dir, p, pn))
	for _, f := range []string{"d/x", "d/yy", "d/zzz", "d/w"} {
		fd, _ := open(f, 0, oCreat, rightsAll, 0)
		fdClose(fd)
	}
	dfd, e := open("d", 0, oDirectory, rightRead|rightReaddir, 0)
	line("open directory", e)
	names, _, e := readdir(dfd, 4096, 0)
	line("readdir", names, e)
	// A small buffer: entries come a few at a time, by cookie.
	var all []string
	cookie := int64(0)
	for round := 0; round < 20; round++ {
		got, next, _ := readdir(dfd, 64, cookie)
		if len(got) == 0 {
			break
		}
		all = append(all, got...)
		cookie = next[len(next)-1]
	}
	line("readdir by cookie", all)
	got, _, e := readdir(dfd, 4096, 3)
	line("readdir from cookie 3", got, e)
	_, _, e = readdir(dir+100, 64, 0)
	line("readdir bad fd", e)
	f, _ := open("d/x", 0, 0, rightsAll, 0)
	_, _, e = readdir(f, 64, 0)
	line("readdir a file", e)
	fdClose(f)
	st, e = stat("d", 0)
	line("stat directory", st.filetype, e) // its size and links are the host file system's
	fdClose(dfd)

	// Rename, link, unlink.
	po, pon := ptr("b")
	pd, pdn := ptr("d/b")
	line("rename", pathRename(dir, po, pon, dir, pd, pdn))
	_, e = stat("b", 0)
	line("stat renamed away", e)
	pd2, pdn2 := ptr("d")
	px, pxn := ptr("d/x")
	line("rename directory onto file", pathRename(dir, pd2, pdn2, dir, px, pxn))
	pc, pcn := ptr("c")
	line("link", pathLink(dir, 0, pd, pdn, dir, pc, pcn))
	s1, _ := stat("d/b", 0)
	s2, _ := stat("c", 0)
	line("link nlink", s1.nlink, s2.nlink, "same inode", s1.ino == s2.ino)
	line("link existing", pathLink(dir, 0, pd, pdn, dir, pc, pcn))
	pe, pen := ptr("e")
	line("link directory", pathLink(dir, 0, pd2, pdn2, dir, pe, pen))
	line("unlink", pathUnlinkFile(dir, pc, pcn))
	s1, _ = stat("d/b", 0)
	line("nlink after unlink", s1.nlink)
	line("unlink missing", pathUnlinkFile(dir, pc, pcn))
	line("unlink directory", pathUnlinkFile(dir, pd2, pdn2))
	line("rmdir not empty", pathRemoveDirectory(dir, pd2, pdn2))
	line("rmdir a file", pathRemoveDirectory(dir, pd, pdn))

	// Paths with trailing slashes and dots, a directory renamed onto
	// itself.
	pt, ptn := ptr("t/")
	line("mkdir trailing slash", pathCreateDirectory(dir, pt, ptn))
	pt2, pt2n := ptr("t/./")
	pt3, pt3n := ptr("t3")
	line("rename trailing dot", pathRename(dir, pt2, pt2n, dir, pt3, pt3n))
	_, e = stat("t3", 0)
	line("renamed directory", e)
	_, e = stat("t", 0)
	line("old name gone", e)
	line("rename onto itself", pathRename(dir, pd2, pdn2, dir, pd2, pdn2))
	pt4, pt4n := ptr("t3/")
	line("rmdir trailing slash", pathRemoveDirectory(dir, pt4, pt4n))
	pdot, pdotn := ptr("d/..")
	_, e = stat("d/..", 0)
	line("stat d/..", e)
	line("rmdir d/..", pathRemoveDirectory(dir, pdot, pdotn))

	// Symbolic links: reading, following, dangling and looping.
	line("symlink", pathSymlink2("d/b", "s"))
	buf := make([]byte, 64)
	var used int32
	ps, psn := ptr("s")
	e = pathReadlink(dir, ps, psn, unsafe.Pointer(&buf[0]), int32(len(buf)), unsafe.Pointer(&used))
	line("readlink", string(buf[:used]), e)
	pf, pfn := ptr("d/x")
	line("readlink a file", pathReadlink(dir, pf, pfn, unsafe.Pointer(&buf[0]), int32(len(buf)), unsafe.Pointer(&used)))
	st, e = stat("s", 0)
	line("lstat symlink", st.filetype, e)
	st, e = stat("s", lookupFollow)
	line("stat through symlink", st.filetype, e)
	line("symlink existing", pathSymlink2("x", "s"))
	line("dangling symlink", pathSymlink2("nothing", "dangle"))
	_, e = open("dangle", lookupFollow, 0, rightsAll, 0)
	line("open dangling", e)
	_, e = stat("dangle", 0)
	line("lstat dangling", e)
	line("loop symlinks", pathSymlink2("loop2", "loop1"), pathSymlink2("loop1", "loop2"))
	_, e = open("loop1", lookupFollow, 0, rightsAll, 0)
	line("open loop", e)
	_, e = stat("loop1", lookupFollow)
	line("stat loop", e)
	line("escaping symlink", pathSymlink2("../../etc/passwd", "esc"))
	_, e = open("esc", lookupFollow, 0, rightsAll, 0)
	line("open escaping symlink", e)
	line("unlink symlink", pathUnlinkFile(dir, ps, psn))

	// Times: set as asked, read back.
	const t1, t2 = 1_000_000_000_123, 2_000_000_000_456
	line("set times by path", pathFilestatSetTimes(dir, 0, pd, pdn, t1, t2, setAtim|setMtim))
	st, _ = stat("d/b", 0)
	line("times by path", st.atim == t1, st.mtim == t2)
	g, _ := open("d/b", 0, 0, rightsAll, 0)
	line("set times by fd", fdFilestatSetTimes(g, t2, t1, setAtim|setMtim))
	st, _ = fstat(g)
	line("times by fd", st.atim == t2, st.mtim == t1)
	line("set times bad flags", fdFilestatSetTimes(g, 0, 0, setAtim|2))

	// Renumber.
	h, _ := open("d/yy", 0, 0, rightsAll, 0)
	pwrite(h, "renumbered", 0)
	line("renumber", fdRenumber(h, g))
	s, e = pread(g, 20, 0)
	line("read renumbered", s, e)
	_, e = pread(h, 20, 0)
	line("read old number", e)
	line("renumber closed", fdRenumber(h, g))
	fdClose(g)
}

func pathSymlink2(target, link string) int32 {
	t, tn := ptr(target)
	l, ln := ptr(link)
	return pathSymlink(t, tn, dir, l, ln)
}

// values prints the identity and times of files through a sequence that
// makes, writes, links, lists, renames and removes them, with clock reads
// between (each moves the task's clock on).
func values() {
	show := func(name string, st filestat, e int32) {
		line(name, e, "dev", st.dev, "ino", st.ino, "nlink", st.nlink, "size", st.size, "atim", st.atim, "mtim", st.mtim, "ctim", st.ctim)
	}
	tick := func() { time.Now() }
	st, e := stat(".", 0)
	show("dir", st, e)
	a, e := open("va", 0, oCreat|oExcl, rightsAll, 0)
	line("create va", e)
	st, e = fstat(a)
	show("va made", st, e)
	tick()
	write(a, "one")
	st, e = fstat(a)
	show("va written", st, e)
	st, e = stat(".", 0)
	show("dir after create", st, e)
	tick()
	pa, pn := ptr("vd")
	line("mkdir vd", pathCreateDirectory(dir, pa, pn))
	st, e = stat("vd", 0)
	show("vd", st, e)
	tick()
	x, e := open("vd/x", 0, oCreat, rightsAll, 0)
	line("create vd/x", e)
	fdClose(x)
	st, e = stat("vd", 0)
	show("vd after create", st, e)
	po, on := ptr("va")
	pl, ln := ptr("vl")
	tick()
	line("symlink vl", pathSymlink(po, on, dir, pl, ln))
	st, e = stat("vl", 0)
	show("vl", st, e)
	st, e = stat("vl", lookupFollow)
	show("vl followed", st, e)
	pb, bn := ptr("vb")
	line("link vb", pathLink(dir, 0, po, on, dir, pb, bn))
	st, e = stat("vb", 0)
	show("vb", st, e)
	tick()
	line("set atim", fdFilestatSetTimes(a, 1_600_000_000_000_000_000, 0, setAtim))
	st, e = fstat(a)
	show("va atim set", st, e)
	tick()
	line("set mtim now", fdFilestatSetTimes(a, 0, 0, 1<<3))
	st, e = fstat(a)
	show("va mtim now", st, e)
	tick()
	line("truncate", fdFilestatSetSize(a, 1))
	st, e = fstat(a)
	show("va truncated", st, e)
	d, e := open(".", 0, oDirectory, rightRead|rightReaddir, 0)
	line("open dir", e)
	buf := make([]byte, 4096)
	var used int32
	e = fdReaddir(d, unsafe.Pointer(&buf[0]), int32(len(buf)), 0, unsafe.Pointer(&used))
	var ents []string
	for b := buf[:used]; len(b) >= 24; {
		n := *(*uint32)(unsafe.Pointer(&b[16]))
		if len(b) < 24+int(n) {
			break
		}
		ents = append(ents, fmt.Sprintf("%s=%d", b[24:24+int(n)], *(*uint64)(unsafe.Pointer(&b[8]))))
		b = b[24+int(n):]
	}
	line("listing", e, ents)
	fdClose(d)
	pe, en := ptr("ve")
	line("rename vd ve", pathRename(dir, pa, pn, dir, pe, en))
	st, e = stat("ve", 0)
	show("ve", st, e)
	fdClose(a)
	line("unlink va", pathUnlinkFile(dir, po, on))
	line("unlink vb", pathUnlinkFile(dir, pb, bn))
	line("unlink vl", pathUnlinkFile(dir, pl, ln))
	tick()
	c, e := open("vc", 0, oCreat|oExcl, rightsAll, 0)
	line("create vc", e)
	st, e = fstat(c)
	show("vc", st, e)
	fdClose(c)
}
