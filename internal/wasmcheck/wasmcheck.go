// Package wasmcheck validates uploaded task modules: valid WebAssembly, a
// WASI command (exports _start), importing only functions that exist in
// wasi_snapshot_preview1 and cyclepool, with their exact signatures.
package wasmcheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// hostFuncs are the cyclepool host functions with their signatures.
var hostFuncs = map[string][2][]api.ValueType{
	"progress":       {{api.ValueTypeF64}, nil},
	"checkpoint_due": {nil, {api.ValueTypeI32}},
	"checkpoint":     {{api.ValueTypeI32, api.ValueTypeI32}, {api.ValueTypeI32}},
	"restore":        {{api.ValueTypeI32, api.ValueTypeI32}, {api.ValueTypeI32}},
}

// MaxConcurrent bounds the checks that compile at once in a process: with
// the bounds of Scan one compile takes up to about 1 GiB, and this keeps
// uploads arriving together from multiplying that.
const MaxConcurrent = 2

// turns holds a token for each check compiling.
var turns = make(chan struct{}, MaxConcurrent)

// ErrBusy is returned, wrapped, by a check whose context ended while it
// waited for a turn to compile (MaxConcurrent others were compiling).
var ErrBusy = errors.New("too many modules are being checked at once; try again shortly")

// Check validates a module and returns its imports as "module.name",
// sorted. The error says what is wrong in words a task author understands.
// It first scans the module's bytes (Scan), refusing one that declares more
// than its bounds; then it waits for one of MaxConcurrent turns and
// compiles the module.
func Check(ctx context.Context, wasm []byte) ([]string, error) {
	if _, err := Scan(wasm); err != nil {
		return nil, err
	}
	select {
	case turns <- struct{}{}:
	default:
		select {
		case turns <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%v)", ErrBusy, context.Cause(ctx))
		}
	}
	defer func() { <-turns }()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	m, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("invalid WebAssembly: %w", err)
	}
	defer m.Close(ctx)
	// WASI's functions as the workers' runtime offers them: a misspelt
	// import or a wrong signature is refused here, not by every attempt.
	wasi, err := wasi_snapshot_preview1.NewBuilder(rt).Compile(ctx)
	if err != nil {
		return nil, fmt.Errorf("check module: compiling WASI: %w", err)
	}
	defer wasi.Close(ctx)
	wasiFuncs := wasi.ExportedFunctions()
	imports := []string{}
	for _, f := range m.ImportedFunctions() {
		mod, name, _ := f.Import()
		switch mod {
		case "wasi_snapshot_preview1":
			def, ok := wasiFuncs[name]
			if !ok {
				return nil, fmt.Errorf("imports wasi_snapshot_preview1.%s, which WASI preview 1 does not have", name)
			}
			if !slices.Equal(def.ParamTypes(), f.ParamTypes()) || !slices.Equal(def.ResultTypes(), f.ResultTypes()) {
				return nil, fmt.Errorf("imports wasi_snapshot_preview1.%s with the wrong signature", name)
			}
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
		// Named up to a few: a module may export 100,000 functions.
		list := strings.Join(exports[:min(len(exports), 10)], ", ")
		if len(exports) > 10 {
			list += fmt.Sprintf(" and %d more", len(exports)-10)
		}
		return nil, fmt.Errorf("does not export _start: a task must be a WASI command (exports: %s)", list)
	}
	slices.Sort(imports)
	return slices.Compact(imports), nil
}
