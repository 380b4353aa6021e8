// Package wasmtest encodes small WebAssembly modules by hand, for tests that
// need a module no compiler would produce: a minimal command, a trap, a
// module of an exact size, an import with a chosen signature.
package wasmtest

import "bytes"

// Module is a module of the given sections, after the magic number and
// version 1.
func Module(sections ...[]byte) []byte {
	return bytes.Join(append([][]byte{[]byte("\x00asm\x01\x00\x00\x00")}, sections...), nil)
}

// ULEB is n as an unsigned LEB128.
func ULEB(n int) []byte {
	var b []byte
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n != 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

// Section is a section of the given id and content.
func Section(id byte, content []byte) []byte {
	return append(append([]byte{id}, ULEB(len(content))...), content...)
}

// Vec is a vector of items, each already encoded.
func Vec(items ...[]byte) []byte {
	return append(ULEB(len(items)), bytes.Join(items, nil)...)
}

// Name is s as a name (its length, then its bytes).
func Name(s string) []byte { return append(ULEB(len(s)), s...) }

// Body is a function body with no locals and the given code, ended.
func Body(code []byte) []byte {
	b := append([]byte{0}, append(code, 0x0b)...)
	return append(ULEB(len(b)), b...)
}

// Noop is the smallest task: (module (memory (export "memory") 1)
// (func (export "_start"))).
func Noop() []byte {
	return Module(
		Section(1, Vec([]byte{0x60, 0, 0})), // type: () -> ()
		Section(3, Vec([]byte{0})),          // one function of type 0
		Section(5, Vec([]byte{0, 1})),       // memory, min 1 page
		Section(7, Vec(append(Name("memory"), 2, 0), append(Name("_start"), 0, 0))),
		Section(10, Vec(Body(nil))),
	)
}
