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
	dir, err := os.MkdirTemp("", "cyclepool-attempt-")
	if err != nil {
		return err
	}
	a.dir = dir
	inDir, outDir := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	if err := os.Mkdir(inDir, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(outDir, 0o755); err != nil {
		return err
	}
	for _, in := range a.job.Assign.Inputs {
		p := filepath.Join(inDir, in.Name)
		if err := os.WriteFile(p, in.Data, 0o444); err != nil {
			return err
		}
		if err := os.Chtimes(p, inputTime, inputTime); err != nil {
			return err
		}
	}
	return os.Chtimes(inDir, inputTime, inputTime)
}

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
	outDir := filepath.Join(a.dir, "out")
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

// Symlink implements experimentalsys.FS by refusing.
func (noLinkFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	return experimentalsys.EPERM
}
