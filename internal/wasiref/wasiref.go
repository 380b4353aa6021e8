// Package wasiref runs a WASI command on plain wazero, with a host
// directory mounted: the reference the runners' file systems are held to
// (tasks/wasiconf, docs/DATA.md "Conformance"). Tests use it; the product
// does not.
package wasiref

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

// Run runs the command wasm with args (argv[1:]) and the host directory
// dir mounted at guest, and returns its standard output. cacheDir, when
// not empty, is a wazero compilation cache to keep the compiled module in
// (compiling tasks/wasiconf takes about 1.7 CPU-seconds).
func Run(ctx context.Context, wasm []byte, cacheDir, dir, guest string, args ...string) (string, error) {
	cfg := wazero.NewRuntimeConfig()
	if cacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(cacheDir)
		if err != nil {
			return "", fmt.Errorf("compilation cache %s: %w", cacheDir, err)
		}
		defer cache.Close(ctx)
		cfg = cfg.WithCompilationCache(cache)
	}
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	var stdout, stderr bytes.Buffer
	mcfg := wazero.NewModuleConfig().WithArgs(append([]string{"task"}, args...)...).WithStdout(&stdout).WithStderr(&stderr).
		WithFSConfig(wazero.NewFSConfig().WithDirMount(dir, guest))
	_, err := rt.InstantiateWithConfig(ctx, wasm, mcfg)
	var ee *sys.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 0) {
		return stdout.String(), fmt.Errorf("run on plain wazero: %w\n%s", err, stderr.String())
	}
	return stdout.String(), nil
}

// Deviations returns plain wazero's output of tasks/wasiconf with the
// answers where the runners differ on purpose (docs/DATA.md,
// "Conformance"):
//   - a symbolic link whose target is absolute or climbs with ".." is
//     refused (EPERM, 63): plain wazero makes it, and its host then follows
//     it out of the sandbox;
//   - a directory lists its entries in name order (after "." and ".."),
//     not in the host file system's order.
func Deviations(wazero string) string {
	lines := strings.Split(wazero, "\n")
	var listed []string // the sorted entries of "readdir:"
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "escaping symlink: "):
			lines[i] = "escaping symlink: 63"
		case strings.HasPrefix(l, "readdir: ["), strings.HasPrefix(l, "readdir by cookie: ["):
			head, rest, _ := strings.Cut(l, "[")
			list, tail, _ := strings.Cut(rest, "]")
			ents := strings.Fields(list)
			var dots, names []string
			for _, e := range ents {
				if e == "./3" || e == "../3" {
					dots = append(dots, e)
				} else {
					names = append(names, e)
				}
			}
			slices.Sort(names)
			ents = append(dots, names...)
			if strings.HasPrefix(l, "readdir: [") {
				listed = ents
			}
			lines[i] = head + "[" + strings.Join(ents, " ") + "]" + tail
		case strings.HasPrefix(l, "readdir from cookie 3: [") && !strings.HasPrefix(l, "readdir from cookie 3: []") && len(listed) > 3:
			_, rest, _ := strings.Cut(l, "]")
			lines[i] = "readdir from cookie 3: [" + strings.Join(listed[3:], " ") + "]" + rest
		}
	}
	return strings.Join(lines, "\n")
}

// Diff describes every line where the outputs a (of aName) and b (of
// bName) differ, one message per line; none when they are the same.
func Diff(aName, a, bName, b string) []string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	w := max(len(aName), len(bName)) + 1
	var out []string
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			out = append(out, fmt.Sprintf("line %d:\n%-*s %q\n%-*s %q", i+1, w, aName+":", x, w, bName+":", y))
		}
	}
	return out
}
