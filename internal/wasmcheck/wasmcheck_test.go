package wasmcheck

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
)

// WebAssembly value types, as encoded in a function type.
const (
	i32 = 0x7f
	i64 = 0x7e
	f64 = 0x7c
)

// imp is an import of a test module: a function of the given signature, or
// (memory set) a memory.
type imp struct {
	mod, name       string
	params, results []byte
	memory          bool
}

// build encodes a module that imports imps, defines one function of type
// () -> () whose body is empty, and exports that function under each of
// exports.
func build(imps []imp, exports ...string) []byte {
	types := [][]byte{{0x60, 0, 0}} // type 0: () -> ()
	var imports [][]byte
	funcImports := 0
	for _, im := range imps {
		entry := append(wasmtest.Name(im.mod), wasmtest.Name(im.name)...)
		if im.memory {
			entry = append(entry, 0x02, 0x00, 0x01) // memory, limits: min 1, no max
		} else {
			types = append(types, append(append([]byte{0x60}, wasmtest.Vec(bytesOf(im.params)...)...), wasmtest.Vec(bytesOf(im.results)...)...))
			entry = append(entry, 0x00)
			entry = append(entry, wasmtest.ULEB(len(types)-1)...)
			funcImports++
		}
		imports = append(imports, entry)
	}
	m := wasmtest.Module()
	m = append(m, wasmtest.Section(1, wasmtest.Vec(types...))...)
	if len(imports) > 0 {
		m = append(m, wasmtest.Section(2, wasmtest.Vec(imports...))...)
	}
	m = append(m, wasmtest.Section(3, wasmtest.Vec([]byte{0}))...) // one function of type 0
	if len(exports) > 0 {
		var es [][]byte
		for _, e := range exports {
			es = append(es, append(append(wasmtest.Name(e), 0x00), wasmtest.ULEB(funcImports)...))
		}
		m = append(m, wasmtest.Section(7, wasmtest.Vec(es...))...)
	}
	m = append(m, wasmtest.Section(10, wasmtest.Vec(wasmtest.Body(nil)))...) // an empty body
	return m
}

// bytesOf splits value types into one-byte items for vec.
func bytesOf(ts []byte) [][]byte {
	out := make([][]byte, len(ts))
	for i, t := range ts {
		out[i] = []byte{t}
	}
	return out
}

// allowedImports are imports from both allowed modules, the cyclepool ones
// with their exact signatures.
var allowedImports = []imp{
	{mod: "wasi_snapshot_preview1", name: "fd_write", params: []byte{i32, i32, i32, i32}, results: []byte{i32}},
	{mod: "wasi_snapshot_preview1", name: "proc_exit", params: []byte{i32}},
	{mod: "cyclepool", name: "progress", params: []byte{f64}},
	{mod: "cyclepool", name: "checkpoint_due", results: []byte{i32}},
	{mod: "cyclepool", name: "checkpoint", params: []byte{i32, i32}, results: []byte{i32}},
	{mod: "cyclepool", name: "restore", params: []byte{i32, i32}, results: []byte{i32}},
}

// Check accepts a WASI command that imports only from
// wasi_snapshot_preview1 and cyclepool (the latter's functions with their
// exact signatures) and returns its imports sorted and without repeats; it
// refuses anything else (not WebAssembly, truncated, another import module,
// an unknown cyclepool function or a wrong signature, an imported memory,
// no _start export) with an error that says what is wrong.
func TestCheck(t *testing.T) {
	valid := build(nil, "_start")
	for _, tc := range []struct {
		name    string
		wasm    []byte
		imports []string // when accepted
		err     string   // a part of the error, when refused
	}{
		{name: "minimal command", wasm: valid, imports: []string{}},
		{name: "command with other exports", wasm: build(nil, "_start", "helper"), imports: []string{}},
		{name: "allowed imports", wasm: build(allowedImports, "_start"), imports: []string{
			"cyclepool.checkpoint", "cyclepool.checkpoint_due", "cyclepool.progress", "cyclepool.restore",
			"wasi_snapshot_preview1.fd_write", "wasi_snapshot_preview1.proc_exit"}},
		{name: "an import repeated", wasm: build([]imp{
			{mod: "cyclepool", name: "progress", params: []byte{f64}},
			{mod: "wasi_snapshot_preview1", name: "proc_exit", params: []byte{i32}},
			{mod: "cyclepool", name: "progress", params: []byte{f64}},
		}, "_start"), imports: []string{"cyclepool.progress", "wasi_snapshot_preview1.proc_exit"}},

		{name: "empty", wasm: nil, err: "not a WebAssembly module"},
		{name: "garbage bytes", wasm: []byte("#!/bin/sh\necho this is not wasm\n"), err: "not a WebAssembly module"},
		{name: "magic without version", wasm: []byte("\x00asm"), err: "not a WebAssembly module"},
		{name: "ELF binary", wasm: []byte("\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00"), err: "not a WebAssembly module"},
		{name: "truncated module", wasm: valid[:len(valid)-3], err: "invalid WebAssembly"},
		{name: "header only, cut in a section", wasm: append([]byte("\x00asm\x01\x00\x00\x00"), 0x01, 0x10, 0x01), err: "invalid WebAssembly"},
		{name: "unknown version", wasm: append([]byte("\x00asm\x02\x00\x00\x00"), valid[8:]...), err: "invalid WebAssembly"},
		{name: "garbage after a valid header", wasm: append([]byte("\x00asm\x01\x00\x00\x00"), "garbage garbage"...), err: "invalid WebAssembly"},

		{name: "disallowed import module", wasm: build([]imp{{mod: "env", name: "abort", params: []byte{i32}}}, "_start"),
			err: "imports env.abort: a task may import only from wasi_snapshot_preview1 and cyclepool"},
		{name: "disallowed beside allowed imports", wasm: build(append(slices.Clone(allowedImports),
			imp{mod: "wasi_unstable", name: "fd_write", params: []byte{i32, i32, i32, i32}, results: []byte{i32}}), "_start"),
			err: "imports wasi_unstable.fd_write: a task may import only"},
		{name: "unknown WASI function", wasm: build([]imp{{mod: "wasi_snapshot_preview1", name: "fd_writ", params: []byte{i32, i32, i32, i32}, results: []byte{i32}}}, "_start"),
			err: "imports wasi_snapshot_preview1.fd_writ, which WASI preview 1 does not have"},
		{name: "WASI function with the wrong signature", wasm: build([]imp{{mod: "wasi_snapshot_preview1", name: "fd_write", params: []byte{i32, i32}, results: []byte{i32}}}, "_start"),
			err: "imports wasi_snapshot_preview1.fd_write with the wrong signature"},
		{name: "unknown cyclepool function", wasm: build([]imp{{mod: "cyclepool", name: "sleep", params: []byte{i64}}}, "_start"),
			err: "imports cyclepool.sleep, which does not exist"},
		{name: "cyclepool function with wrong parameters", wasm: build([]imp{{mod: "cyclepool", name: "progress", params: []byte{i32}}}, "_start"),
			err: "imports cyclepool.progress with the wrong signature"},
		{name: "cyclepool function with wrong results", wasm: build([]imp{{mod: "cyclepool", name: "checkpoint", params: []byte{i32, i32}}}, "_start"),
			err: "imports cyclepool.checkpoint with the wrong signature"},
		{name: "cyclepool function with a result too many", wasm: build([]imp{{mod: "cyclepool", name: "progress", params: []byte{f64}, results: []byte{i32}}}, "_start"),
			err: "imports cyclepool.progress with the wrong signature"},
		{name: "imported memory", wasm: build([]imp{{mod: "env", name: "memory", memory: true}}, "_start"),
			err: "imports memory env.memory: a task must define its own memory"},
		{name: "memory imported from an allowed module", wasm: build([]imp{{mod: "wasi_snapshot_preview1", name: "memory", memory: true}}, "_start"),
			err: "imports memory wasi_snapshot_preview1.memory: a task must define its own memory"},
		{name: "no _start", wasm: build(nil, "main", "init"), err: "does not export _start: a task must be a WASI command (exports: init, main)"},
		{name: "no exports", wasm: build(nil), err: "does not export _start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Check(context.Background(), tc.wasm)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Check = %q, %v; want an error containing %q", got, err, tc.err)
				}
				if got != nil {
					t.Errorf("Check refused the module and returned imports %q", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check refused a valid module: %v", err)
			}
			if got == nil || !slices.Equal(got, tc.imports) {
				t.Errorf("imports %#v, want %#v", got, tc.imports)
			}
		})
	}
}

// A real task module, built from tasks/ for wasip1 (a Go program linked with
// the cyclepool SDK), passes the check, and its imports are listed sorted,
// all from the two allowed modules.
func TestCheckRealTask(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a task module")
	}
	wasm, err := os.ReadFile(taskbuild.Build(t, "counter"))
	if err != nil {
		t.Fatal(err)
	}
	imports, err := Check(context.Background(), wasm)
	if err != nil {
		t.Fatalf("the counter task was refused: %v", err)
	}
	if len(imports) == 0 || !slices.IsSorted(imports) {
		t.Errorf("imports %q, want a sorted, non-empty list", imports)
	}
	for _, im := range imports {
		if !strings.HasPrefix(im, "wasi_snapshot_preview1.") && !strings.HasPrefix(im, "cyclepool.") {
			t.Errorf("import %q from neither allowed module", im)
		}
	}
	if !slices.Contains(imports, "cyclepool.checkpoint") {
		t.Errorf("imports %q: the counter task checkpoints, want cyclepool.checkpoint among them", imports)
	}
	// The same module cut short is refused.
	if _, err := Check(context.Background(), wasm[:len(wasm)/2]); err == nil || !strings.Contains(err.Error(), "invalid WebAssembly") {
		t.Errorf("the counter task cut in half: %v, want invalid WebAssembly", err)
	}
}
