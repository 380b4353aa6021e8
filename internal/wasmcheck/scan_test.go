package wasmcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/taskbuild"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
)

// withLocals is a function body declaring n locals of type t in one
// declaration, with no code.
func withLocals(n int, t byte) []byte {
	b := append(wasmtest.Vec(append(wasmtest.ULEB(n), t)), 0x0b)
	return append(wasmtest.ULEB(len(b)), b...)
}

// command encodes a command of the given function bodies, all of type
// () -> (), the first exported as _start, with the sections of extra
// (id, content; before the code section, in order) and a memory of a page.
func command(bodies [][]byte, extra ...[]byte) []byte {
	funcs := make([][]byte, len(bodies))
	for i := range funcs {
		funcs[i] = []byte{0}
	}
	m := wasmtest.Module(wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0})))
	for _, e := range extra {
		if e[0] < 3 {
			m = append(m, e...)
		}
	}
	m = append(m, wasmtest.Section(3, wasmtest.Vec(funcs...))...)
	for _, e := range extra {
		if e[0] >= 3 {
			m = append(m, e...)
		}
	}
	m = append(m, wasmtest.Section(5, wasmtest.Vec([]byte{0, 1}))...)
	m = append(m, wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("_start"), 0, 0)))...)
	return append(m, wasmtest.Section(10, wasmtest.Vec(bodies...))...)
}

// repeat is n copies of a body.
func repeat(n int, body []byte) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = body
	}
	return out
}

// tableSection declares one funcref table of the given limits (max < 0:
// none).
func tableSection(min, max int) []byte {
	lim := append([]byte{0}, wasmtest.ULEB(min)...)
	if max >= 0 {
		lim = append(append([]byte{1}, wasmtest.ULEB(min)...), wasmtest.ULEB(max)...)
	}
	return wasmtest.Section(4, wasmtest.Vec(append([]byte{0x70}, lim...)))
}

// Modules that declare more than compiling may cost (issue 21 item 1: 55
// bytes that cost 2.5 GiB to check) are refused by their bytes, before
// wazero compiles them, with an error that names what is too large and the
// bound; checking each costs a few MiB at most. Modules within the bounds
// are accepted.
func TestCheckBounds(t *testing.T) {
	i64 := byte(0x7e)
	body := func(code []byte) []byte { return wasmtest.Body(code) }
	for _, tc := range []struct {
		name string
		wasm []byte
		err  string // a part of the error; "" when accepted
	}{
		{name: "10 million locals in one function",
			wasm: command([][]byte{withLocals(10_000_000, i64)}),
			err:  "function 0 declares 10000000 locals; at most 50000 per function"},
		{name: "locals over the bound in a later function, after imports",
			wasm: command([][]byte{body(nil), body(nil), body(nil), withLocals(MaxLocalsPerFunction+1, i64)},
				wasmtest.Section(2, wasmtest.Vec(append(append(wasmtest.Name("wasi_snapshot_preview1"), wasmtest.Name("sched_yield")...), 0, 0)))),
			err: "function 4 declares 50001 locals; at most 50000 per function"},
		{name: "locals in many declarations of one function",
			wasm: command([][]byte{func() []byte {
				var decls [][]byte
				for range 3 {
					decls = append(decls, append(wasmtest.ULEB(20_000), i64))
				}
				b := append(wasmtest.Vec(decls...), 0x0b)
				return append(wasmtest.ULEB(len(b)), b...)
			}()}),
			err: "function 0 declares 60000 locals; at most 50000 per function"},
		{name: "2,000 functions of 10 million locals",
			wasm: command(repeat(2000, withLocals(10_000_000, i64))),
			err:  "function 0 declares 10000000 locals"},
		{name: "locals under the bound in each function, over it together",
			wasm: command(repeat(2000, withLocals(MaxLocalsPerFunction, i64))),
			err:  "its functions declare more than 2000000 locals together (2050000 in the first 41 functions)"},
		{name: "too many functions",
			wasm: command(repeat(MaxFunctions+1, body(nil))),
			err:  "declares 100001 functions; at most 100000"},
		{name: "a function body too large",
			wasm: command([][]byte{body(bytes.Repeat([]byte{0x01}, MaxFunctionBytes))}),
			err:  "function 0 is 2097154 bytes of code; at most 2097152 (2 MiB) per function"},
		{name: "a code section too large",
			wasm: command(repeat(13, body(bytes.Repeat([]byte{0x01}, MaxFunctionBytes-2)))),
			err:  "its code section is 27263029 bytes; at most 25165824 (24 MiB)"},
		{name: "a table of 200 million entries",
			wasm: command([][]byte{body(nil)}, tableSection(200_000_000, -1)),
			err:  "table 0 has 200000000 entries; at most 10000000"},
		{name: "tables too large together",
			wasm: command([][]byte{body(nil)}, wasmtest.Section(4, wasmtest.Vec(
				append([]byte{0x70, 0}, wasmtest.ULEB(6_000_000)...),
				append([]byte{0x70, 0}, wasmtest.ULEB(6_000_000)...)))),
			err: "its tables have 12000000 entries together; at most 10000000"},
		{name: "an imported table",
			wasm: command([][]byte{body(nil)}, wasmtest.Section(2, wasmtest.Vec(
				append(append(wasmtest.Name("env"), wasmtest.Name("table")...), 1, 0x70, 0, 1)))),
			err: "imports a table: a task must define its own tables"},
		{name: "too many function types",
			wasm: wasmtest.Module(wasmtest.Section(1, wasmtest.Vec(repeat(100_001, []byte{0x60, 0, 0})...))),
			err:  "declares 100001 function types; at most 100000"},
		{name: "too many element entries",
			wasm: command([][]byte{body(nil)}, tableSection(1, -1), wasmtest.Section(9, wasmtest.Vec(
				append(append([]byte{0, 0x41, 0, 0x0b}, wasmtest.ULEB(MaxElements+1)...), make([]byte, MaxElements+1)...)))),
			err: "its element segments have 1000001 entries or more together; at most 1000000"},
		{name: "element entries over the bound in several segments of every kind",
			wasm: command([][]byte{body(nil)}, tableSection(1, -1), wasmtest.Section(9, wasmtest.Vec(
				append(append([]byte{1, 0}, wasmtest.ULEB(400_000)...), make([]byte, 400_000)...),
				append(append([]byte{2, 0, 0x41, 0, 0x0b, 0}, wasmtest.ULEB(400_000)...), make([]byte, 400_000)...),
				append(append([]byte{5, 0x70}, wasmtest.ULEB(100_000)...), bytes.Repeat([]byte{0xd2, 0, 0x0b}, 100_000)...),
				append(append([]byte{6, 0, 0x23, 0, 0x0b, 0x70}, wasmtest.ULEB(200_000)...), bytes.Repeat([]byte{0xd0, 0x70, 0x0b}, 200_000)...)))),
			err: "its element segments have 1100000 entries or more together; at most 1000000"},
		{name: "a vector longer than its section",
			wasm: wasmtest.Module(wasmtest.Section(1, []byte{0xff, 0xff, 0xff, 0xff, 0x0f})),
			err:  "declares 4294967295 function types; at most 100000"},
		{name: "a body count longer than its section",
			wasm: wasmtest.Module(wasmtest.Section(10, []byte{0xa0, 0x8d, 0x06})),
			err:  "invalid WebAssembly: the code section at byte 8 is cut short or malformed"},
		{name: "a local declaration cut short",
			wasm: wasmtest.Module(wasmtest.Section(10, []byte{1, 3, 1, 0x80, 0x80})),
			err:  "invalid WebAssembly: the code section at byte 8 is cut short or malformed"},

		{name: "no _start among many exports",
			wasm: build(nil, func() []string {
				var es []string
				for i := range 1000 {
					es = append(es, fmt.Sprintf("f%04d", i))
				}
				return es
			}()...),
			err: "(exports: f0000, f0001, f0002, f0003, f0004, f0005, f0006, f0007, f0008, f0009 and 990 more)"},

		{name: "locals at the bound", wasm: command([][]byte{withLocals(MaxLocalsPerFunction, i64)})},
		{name: "a table at the bound, with no maximum", wasm: command([][]byte{body(nil)}, tableSection(MaxTableEntries, -1))},
		{name: "a table with a maximum", wasm: command([][]byte{body(nil)}, tableSection(10, 100))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Check(context.Background(), tc.wasm)
			runtime.ReadMemStats(&after)
			if tc.err == "" {
				if err != nil {
					t.Fatalf("Check refused a module within the bounds: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Check = %v; want an error containing %q", err, tc.err)
			}
			// All allocations during the check, live or not: an upper bound
			// of the memory it took.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
				t.Errorf("checking it allocated %d MiB; want at most 64 MiB", alloc>>20)
			}
		})
	}
}

// A check waits for a turn to compile (MaxConcurrent at once) and, when its
// context ends meanwhile, fails with ErrBusy; a module refused by its bytes
// needs no turn.
func TestCheckTurns(t *testing.T) {
	for range MaxConcurrent {
		turns <- struct{}{}
	}
	defer func() {
		for range MaxConcurrent {
			<-turns
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Check(ctx, build(nil, "_start")); !errors.Is(err, ErrBusy) {
		t.Errorf("Check with every turn taken = %v, want ErrBusy", err)
	}
	if _, err := Check(ctx, command([][]byte{withLocals(10_000_000, 0x7e)})); err == nil || errors.Is(err, ErrBusy) {
		t.Errorf("Check of a module over the bounds, every turn taken = %v, want it refused", err)
	}
}

// Every task module under tasks/ (Go programs built for wasip1) is within
// the bounds, and passes the check.
func TestCheckAllTasks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the task modules")
	}
	root, err := taskbuild.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mains, err := filepath.Glob(filepath.Join(root, "tasks", "*", "main.go"))
	if err != nil || len(mains) == 0 {
		t.Fatalf("no tasks found under %s/tasks: %v", root, err)
	}
	for _, m := range mains {
		name := filepath.Base(filepath.Dir(m))
		t.Run(name, func(t *testing.T) {
			wasm, err := os.ReadFile(taskbuild.Build(t, name))
			if err != nil {
				t.Fatal(err)
			}
			s, err := Scan(wasm)
			if err != nil {
				t.Fatalf("scan: %v", err)
			}
			t.Logf("%+v", s)
			if _, err := Check(context.Background(), wasm); err != nil {
				t.Errorf("refused: %v", err)
			}
		})
	}
}
