package headless

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// inputTime is the modification time of every file under /in, so that a
// task that looks at it sees the same value on every runner.
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
		if err := os.Chtimes(p, inputTime, inputTime); err != nil {
			return err
		}
	}
	// When in/ is new or changed, and when the task before listed it
	// (that moved its access time to the real time, relatime), which the
	// next task on this slot would otherwise see: in/ looks the same to
	// every attempt. A slot whose previous task never touched /in (see
	// touchFS) and that has no inputs skips the system call.
	if slot != nil && !slot.inDirty && len(a.job.Assign.Inputs) == 0 {
		return nil
	}
	if err := os.Chtimes(inDir, inputTime, inputTime); err != nil {
		return err
	}
	if slot != nil {
		slot.inDirty = false
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

// noLinkFS is the /out file system: a directory the task may write, without
// symbolic links, which could point outside it.
type noLinkFS struct{ experimentalsys.FS }

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

// Symlink implements experimentalsys.FS by refusing.
func (noLinkFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	return experimentalsys.EPERM
}
