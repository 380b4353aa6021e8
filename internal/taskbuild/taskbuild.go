// Package taskbuild builds the task modules under tasks/ for tests. A module
// is built once per machine for a given source: the .wasm files live in a
// cache directory shared by every test binary,
// os.TempDir()/cyclepool-taskbuild/<hash>/<name>.wasm, where the hash covers
// every .go file under tasks/, go.mod, go.sum and the Go version.
package taskbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	built = map[string]string{} // name -> path, for this process
)

// Build builds tasks/<name> with GOOS=wasip1 GOARCH=wasm (a task in C,
// tasks/<name>/main.c, with clang: CFlags; in Rust, main.rs, with Debian's
// rustc: RustTaskFlags), unless the shared
// cache already holds it, and returns the path of the .wasm file. It fails
// the test when the build fails.
func Build(t testing.TB, name string) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	if name == "" || strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		t.Fatalf("taskbuild: bad task name %q", name)
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatalf("taskbuild: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "tasks", name)); err != nil {
		t.Fatalf("taskbuild: no task %q: %v", name, err)
	}
	hash, err := sourceHash(root)
	if err != nil {
		t.Fatalf("taskbuild: hashing sources: %v", err)
	}
	dir := filepath.Join(os.TempDir(), "cyclepool-taskbuild", hash)
	out := filepath.Join(dir, name+".wasm")
	if _, err := os.Stat(out); err == nil {
		built[name] = out
		return out
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("taskbuild: %v", err)
	}
	tmp, err := os.CreateTemp(dir, name+".*.tmp")
	if err != nil {
		t.Fatalf("taskbuild: %v", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp.Name(), "./tasks/"+name)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if _, err := os.Stat(filepath.Join(root, "tasks", name, "main.c")); err == nil {
		// A task in C, built as tasks/build.sh builds it.
		cmd = exec.Command("clang", CFlags(filepath.Join(root, "tasks", "include"), tmp.Name(), filepath.Join("tasks", name, "main.c"))...)
	}
	if _, err := os.Stat(filepath.Join(root, "tasks", name, "main.rs")); err == nil {
		// A task in Rust: the cyclepool crate first, then the task.
		// Of this build alone (test binaries build at once); rustc takes
		// only a library named lib*.rlib.
		rlib := filepath.Join(dir, "lib"+filepath.Base(tmp.Name())+".rlib")
		defer os.Remove(rlib)
		crate := exec.Command(Rustc, RustCrateFlags(rlib, filepath.Join("tasks", "rust", "cyclepool", "src", "lib.rs"))...)
		crate.Dir = root
		if outb, err := crate.CombinedOutput(); err != nil {
			t.Fatalf("taskbuild: %s: %v\n%s (make tasks installs Debian's rustc)", strings.Join(crate.Args, " "), err, outb)
		}
		cmd = exec.Command(Rustc, RustTaskFlags(rlib, tmp.Name(), filepath.Join("tasks", name, "main.rs"))...)
	}
	cmd.Dir = root
	if outb, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("taskbuild: %s: %v\n%s (make tasks installs the C toolchain)", strings.Join(cmd.Args, " "), err, outb)
	}
	// Rename is atomic: a concurrent test binary sees the old state or a
	// complete file, never a partial one.
	if err := os.Rename(tmp.Name(), out); err != nil {
		t.Fatalf("taskbuild: %v", err)
	}
	built[name] = out
	return out
}

// CFlags are clang's arguments that build a task in C (Debian's clang, lld
// and wasi-libc) from src to out, with cyclepool.h from include.
func CFlags(include, out, src string) []string {
	return []string{"--target=wasm32-wasi", "-O2", "-I", include, "-o", out, src}
}

// Rustc is Debian's rustc, whose standard library for wasm32-wasi is the
// package libstd-rust-dev-wasm32 (a rustup one earlier in PATH may have
// no such target).
const Rustc = "/usr/bin/rustc"

// RustCrateFlags are rustc's arguments that build the cyclepool crate
// (tasks/rust/cyclepool) from src into the library rlib.
func RustCrateFlags(rlib, src string) []string {
	return []string{"--edition", "2021", "--crate-type", "rlib", "--crate-name", "cyclepool", "--target", "wasm32-wasi", "-O", "-o", rlib, src}
}

// RustTaskFlags are rustc's arguments that build a task in Rust from src
// to out, against the cyclepool crate in rlib.
func RustTaskFlags(rlib, out, src string) []string {
	return []string{"--edition", "2021", "--target", "wasm32-wasi", "-O", "-C", "strip=symbols", "--extern", "cyclepool=" + rlib, "-o", out, src}
}

// Bytes builds tasks/<name> like Build and returns the module's bytes.
func Bytes(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(Build(t, name))
	if err != nil {
		t.Fatalf("taskbuild: %v", err)
	}
	return b
}

// RepoRoot returns the root of the repository, found from this source file's
// location (the directory two levels up that holds go.mod).
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if ok {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			return root, nil
		}
	}
	// Built with -trimpath or moved: ask the go command.
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fs.ErrNotExist
	}
	return filepath.Dir(gomod), nil
}

// sourceHash hashes every .go, .c, .h and .rs file under tasks/ (by path and content),
// go.mod, go.sum and the Go version.
func sourceHash(root string) (string, error) {
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "tasks"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") ||
			strings.HasSuffix(p, ".c") || strings.HasSuffix(p, ".h") || strings.HasSuffix(p, ".rs")) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	files = append(files, filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"))
	h := sha256.New()
	io.WriteString(h, runtime.Version()+"\x00")
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		b, err := os.ReadFile(f)
		if err != nil && !(os.IsNotExist(err) && strings.HasSuffix(f, "go.sum")) {
			return "", err
		}
		io.WriteString(h, filepath.ToSlash(rel)+"\x00")
		h.Write([]byte{byte(len(b) >> 24), byte(len(b) >> 16), byte(len(b) >> 8), byte(len(b))})
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
