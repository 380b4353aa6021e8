//go:build wasip1

package sdk

import "unsafe"

//go:wasmimport cyclepool progress
func hostProgress(fraction float64)

//go:wasmimport cyclepool checkpoint_due
func hostCheckpointDue() int32

//go:wasmimport cyclepool checkpoint
func hostCheckpoint(ptr unsafe.Pointer, n int32) int32

//go:wasmimport cyclepool restore
func hostRestore(ptr unsafe.Pointer, capacity int32) int32

func progress(f float64) { hostProgress(f) }

func checkpointDue() int32 { return hostCheckpointDue() }

func checkpoint(state []byte) int32 {
	if len(state) == 0 {
		var b byte
		return hostCheckpoint(unsafe.Pointer(&b), 0)
	}
	return hostCheckpoint(unsafe.Pointer(&state[0]), int32(len(state)))
}

func restore(buf []byte) int {
	if len(buf) == 0 {
		var b byte
		return int(hostRestore(unsafe.Pointer(&b), 0))
	}
	return int(hostRestore(unsafe.Pointer(&buf[0]), int32(len(buf))))
}
