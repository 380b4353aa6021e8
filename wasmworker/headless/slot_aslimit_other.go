//go:build !linux

package headless

// addressSpaceLimited: outside Linux a slot process does not limit its
// address space (see slot_aslimit_linux.go).
const addressSpaceLimited = false

func limitAddressSpace(uint64) error { return nil }

func unlimitAddressSpace() {}
