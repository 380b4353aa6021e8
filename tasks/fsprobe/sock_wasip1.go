//go:build wasip1

package main

import (
	"fmt"
	"unsafe"
)

//go:wasmimport wasi_snapshot_preview1 sock_accept
func sockAccept(fd int32, flags int32, result unsafe.Pointer) uint32

//go:wasmimport wasi_snapshot_preview1 sock_recv
func sockRecv(fd int32, data unsafe.Pointer, n int32, flags int32, size unsafe.Pointer, oflags unsafe.Pointer) uint32

//go:wasmimport wasi_snapshot_preview1 sock_send
func sockSend(fd int32, data unsafe.Pointer, n int32, flags int32, size unsafe.Pointer) uint32

//go:wasmimport wasi_snapshot_preview1 sock_shutdown
func sockShutdown(fd int32, how int32) uint32

// sockErrnos calls the socket functions on descriptors that are no sockets
// (a task has none) and returns their errnos.
func sockErrnos() string {
	var out uint32
	var size, oflags uint32
	return fmt.Sprintf("accept %d recv %d recv-badflags %d send %d send-badflags %d shutdown %d shutdown-nofd %d",
		sockAccept(3, 0, unsafe.Pointer(&out)),
		sockRecv(0, nil, 0, 0, unsafe.Pointer(&size), unsafe.Pointer(&oflags)),
		sockRecv(0, nil, 0, 4, unsafe.Pointer(&size), unsafe.Pointer(&oflags)),
		sockSend(1, nil, 0, 0, unsafe.Pointer(&size)),
		sockSend(1, nil, 0, 1, unsafe.Pointer(&size)),
		sockShutdown(3, 3),
		sockShutdown(99, 3))
}
