// Package wasmcheck validates uploaded task modules: valid WebAssembly, a
// WASI command (exports _start), importing only from wasi_snapshot_preview1
// and cyclepool, with the cyclepool functions' exact signatures.
package wasmcheck

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// hostFuncs are the cyclepool host functions with their signatures.
var hostFuncs = map[string][2][]api.ValueType{
	"progress":       {{api.ValueTypeF64}, nil},
	"checkpoint_due": {nil, {api.ValueTypeI32}},
	"checkpoint":     {{api.ValueTypeI32, api.ValueTypeI32}, {api.ValueTypeI32}},
	"restore":        {{api.ValueTypeI32, api.ValueTypeI32}, {api.ValueTypeI32}},
}

// Check validates a module and returns its imports as "module.name",
// sorted. The error says what is wrong in words a task author understands.
func Check(ctx context.Context, wasm []byte) ([]string, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, fmt.Errorf("not a WebAssembly module: it does not start with the \\0asm magic number")
	}
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	m, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("invalid WebAssembly: %w", err)
	}
	defer m.Close(ctx)
	imports := []string{}
	for _, f := range m.ImportedFunctions() {
		mod, name, _ := f.Import()
		switch mod {
		case "wasi_snapshot_preview1":
		case "cyclepool":
			sig, ok := hostFuncs[name]
			if !ok {
				return nil, fmt.Errorf("imports cyclepool.%s, which does not exist (cyclepool offers progress, checkpoint_due, checkpoint, restore)", name)
			}
			if !slices.Equal(sig[0], f.ParamTypes()) || !slices.Equal(sig[1], f.ResultTypes()) {
				return nil, fmt.Errorf("imports cyclepool.%s with the wrong signature (see docs/TASK_ABI.md)", name)
			}
		default:
			return nil, fmt.Errorf("imports %s.%s: a task may import only from wasi_snapshot_preview1 and cyclepool", mod, name)
		}
		imports = append(imports, mod+"."+name)
	}
	for _, mem := range m.ImportedMemories() {
		mod, name, _ := mem.Import()
		return nil, fmt.Errorf("imports memory %s.%s: a task must define its own memory", mod, name)
	}
	if _, ok := m.ExportedFunctions()["_start"]; !ok {
		exports := make([]string, 0)
		for n := range m.ExportedFunctions() {
			exports = append(exports, n)
		}
		slices.Sort(exports)
		return nil, fmt.Errorf("does not export _start: a task must be a WASI command (exports: %s)", strings.Join(exports, ", "))
	}
	slices.Sort(imports)
	return slices.Compact(imports), nil
}
