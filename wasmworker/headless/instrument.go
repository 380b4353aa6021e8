package headless

import (
	"errors"
	"fmt"
)

// stopExport is the name under which an instrumented module exports its stop
// flag, a mutable i32 global.
const stopExport = "cyclepool.stop"

// instrument returns a copy of the wasm module bin in which the header of
// every loop first checks a new mutable i32 global, exported as stopExport,
// and traps (unreachable) when it is not zero:
//
//	loop bt
//	  global.get $stop
//	  if
//	    unreachable
//	  end
//	  ... original loop body
//
// Setting the global from the host stops the module at its next loop
// iteration. Only loops jump backwards in wasm (the tail-call and exception
// proposals, which add other ways, are not enabled in the runtime), and
// recursion ends in a stack overflow, so a module cannot run on without
// passing a loop header. This costs a load, a test and a branch per
// iteration, where wazero's WithCloseOnContextDone makes an indirect call
// (docs/TASK_ABI.md, "Cancellation").
//
// instrument fails on a module it cannot take apart (unknown opcodes or
// sections, a start function, a reference to a global that would collide
// with the new one); the caller then falls back to WithCloseOnContextDone.
// It does not validate the module: the runtime does that when compiling it.
func instrument(bin []byte) ([]byte, error) {
	const header = "\x00asm\x01\x00\x00\x00"
	if len(bin) < 8 || string(bin[:8]) != header {
		return nil, errors.New("not a wasm 1.0 binary")
	}
	type section struct {
		id      byte
		content []byte
	}
	var sections []section
	d := &decoder{b: bin, pos: 8}
	for d.pos < len(d.b) {
		id := d.byte()
		n := d.u32()
		content := d.bytes(int(n))
		if d.err != nil {
			return nil, d.err
		}
		sections = append(sections, section{id, content})
	}

	// Count globals (imported and defined) to find the new global's index.
	var globals uint32
	var exportsContent, globalsContent []byte
	haveCode := false
	for _, s := range sections {
		switch s.id {
		case 2:
			n, err := countGlobalImports(s.content)
			if err != nil {
				return nil, err
			}
			globals += n
		case 6:
			sd := &decoder{b: s.content}
			globals += sd.u32()
			globalsContent = s.content
			if sd.err != nil {
				return nil, sd.err
			}
		case 7:
			exportsContent = s.content
		case 8:
			return nil, errors.New("module has a start function")
		case 10:
			haveCode = true
		}
	}
	if !haveCode {
		return nil, errors.New("module has no code section")
	}
	stop := globals

	// The new global: mutable i32 initialised to 0.
	newGlobals, err := appendToVec(globalsContent, []byte{0x7f, 0x01, 0x41, 0x00, 0x0b})
	if err != nil {
		return nil, err
	}
	if err := checkExportNames(exportsContent); err != nil {
		return nil, err
	}
	exp := append(appendName(nil, stopExport), 0x03)
	exp = appendU32(exp, stop)
	newExports, err := appendToVec(exportsContent, exp)
	if err != nil {
		return nil, err
	}

	// Section order: the position of each known section id.
	rank := map[byte]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}
	out := []byte(header)
	put := func(id byte, content []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(content)))
		out = append(out, content...)
	}
	wroteGlobals, wroteExports := false, false
	for _, s := range sections {
		r, known := rank[s.id]
		if s.id != 0 && !known {
			return nil, fmt.Errorf("unknown section id %d", s.id)
		}
		if s.id != 0 {
			if !wroteGlobals && r > rank[6] {
				put(6, newGlobals)
				wroteGlobals = true
			}
			if !wroteExports && r > rank[7] {
				put(7, newExports)
				wroteExports = true
			}
		}
		switch s.id {
		case 6:
			put(6, newGlobals)
			wroteGlobals = true
		case 7:
			put(7, newExports)
			wroteExports = true
		case 10:
			code, err := instrumentCode(s.content, stop)
			if err != nil {
				return nil, err
			}
			put(10, code)
		default:
			put(s.id, s.content)
		}
	}
	return out, nil
}

// instrumentCode rewrites the code section.
func instrumentCode(content []byte, stop uint32) ([]byte, error) {
	check := []byte{0x23}
	check = appendU32(check, stop)
	check = append(check, 0x04, 0x40, 0x00, 0x0b) // if (empty) unreachable end

	d := &decoder{b: content}
	n := d.u32()
	out := appendU32(nil, n)
	var body []byte
	for i := uint32(0); i < n && d.err == nil; i++ {
		size := d.u32()
		end := d.pos + int(size)
		if d.err != nil || end > len(d.b) || end < d.pos {
			return nil, errors.New("truncated code section")
		}
		fd := &decoder{b: d.b[:end], pos: d.pos}
		// Locals: vec(count, valtype).
		nl := fd.u32()
		for j := uint32(0); j < nl && fd.err == nil; j++ {
			fd.u32()
			fd.valtype()
		}
		body = append(body[:0], d.b[d.pos:fd.pos]...)
		for fd.pos < end && fd.err == nil {
			start := fd.pos
			op := fd.instr(stop)
			body = append(body, fd.b[start:fd.pos]...)
			if op == 0x03 && fd.err == nil { // loop
				body = append(body, check...)
			}
		}
		if fd.err != nil {
			return nil, fmt.Errorf("function %d: %w", i, fd.err)
		}
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
		d.pos = end
	}
	if d.err != nil {
		return nil, d.err
	}
	if d.pos != len(d.b) {
		return nil, errors.New("trailing bytes in code section")
	}
	return out, nil
}

// countGlobalImports counts the global imports of an import section.
func countGlobalImports(content []byte) (uint32, error) {
	d := &decoder{b: content}
	n := d.u32()
	var globals uint32
	for i := uint32(0); i < n && d.err == nil; i++ {
		d.name()
		d.name()
		switch kind := d.byte(); kind {
		case 0x00: // func: type index
			d.u32()
		case 0x01: // table: reftype, limits
			d.byte()
			d.limits()
		case 0x02: // memory: limits
			d.limits()
		case 0x03: // global: valtype, mutability
			d.valtype()
			d.byte()
			globals++
		case 0x04: // tag: attribute, type index
			d.byte()
			d.u32()
		default:
			return 0, fmt.Errorf("unknown import kind %d", kind)
		}
	}
	return globals, d.err
}

// checkExportNames fails when the module already exports stopExport.
func checkExportNames(content []byte) error {
	if content == nil {
		return nil
	}
	d := &decoder{b: content}
	n := d.u32()
	for i := uint32(0); i < n && d.err == nil; i++ {
		if d.name() == stopExport {
			return fmt.Errorf("module already exports %q", stopExport)
		}
		d.byte()
		d.u32()
	}
	return d.err
}

// appendToVec appends item to the vector that is the whole of content (nil:
// an empty vector).
func appendToVec(content, item []byte) ([]byte, error) {
	var n uint32
	var rest []byte
	if content != nil {
		d := &decoder{b: content}
		n = d.u32()
		if d.err != nil {
			return nil, d.err
		}
		rest = content[d.pos:]
	}
	out := appendU32(nil, n+1)
	out = append(out, rest...)
	return append(out, item...), nil
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
		} else {
			return append(b, c)
		}
	}
}

func appendName(b []byte, s string) []byte {
	return append(appendU32(b, uint32(len(s))), s...)
}

// decoder reads a wasm binary. The first error sticks; reads after it
// return zero values.
type decoder struct {
	b   []byte
	pos int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("offset %d: %s", d.pos, fmt.Sprintf(format, args...))
	}
	d.pos = len(d.b)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if d.pos >= len(d.b) {
		d.fail("unexpected end")
		return 0
	}
	c := d.b[d.pos]
	d.pos++
	return c
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || d.pos+n > len(d.b) {
		d.fail("unexpected end")
		return nil
	}
	b := d.b[d.pos : d.pos+n]
	d.pos += n
	return b
}

// leb skips a LEB128 number of at most max bytes and returns its low 64
// bits, unsigned.
func (d *decoder) leb(max int) uint64 {
	var v uint64
	for i := 0; i < max; i++ {
		c := d.byte()
		if d.err != nil {
			return 0
		}
		if i < 10 {
			v |= uint64(c&0x7f) << (7 * i)
		}
		if c&0x80 == 0 {
			return v
		}
	}
	d.fail("LEB128 number too long")
	return 0
}

func (d *decoder) u32() uint32 {
	v := d.leb(5)
	if v > 0xffffffff {
		d.fail("u32 out of range")
	}
	return uint32(v)
}

func (d *decoder) name() string { return string(d.bytes(int(d.u32()))) }

func (d *decoder) limits() {
	flags := d.byte()
	d.leb(10)
	if flags&1 != 0 {
		d.leb(10)
	}
}

func (d *decoder) valtype() {
	switch t := d.byte(); t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
	default:
		d.fail("unknown value type %#x", t)
	}
}

func (d *decoder) blockType() {
	if d.pos < len(d.b) {
		switch d.b[d.pos] {
		case 0x40, 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
			d.pos++
			return
		}
	}
	d.leb(5) // s33 type index
}

func (d *decoder) memarg() {
	align := d.u32()
	if align&0x40 != 0 { // multi-memory: a memory index follows
		d.u32()
	}
	d.leb(10) // offset
}

// instr skips one instruction and returns its opcode. It fails on an opcode
// it does not know and on global.get/global.set of an index >= stop (which
// would otherwise reach the stop flag).
func (d *decoder) instr(stop uint32) byte {
	op := d.byte()
	switch {
	case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
		d.blockType()
	case op == 0x0c || op == 0x0d || op == 0x10 || op == 0xd2: // br, br_if, call, ref.func
		d.u32()
	case op == 0x0e: // br_table
		n := d.u32()
		for i := uint32(0); i <= n && d.err == nil; i++ {
			d.u32()
		}
	case op == 0x11: // call_indirect
		d.u32()
		d.u32()
	case op == 0x1c: // select t*
		n := d.u32()
		for i := uint32(0); i < n && d.err == nil; i++ {
			d.valtype()
		}
	case op == 0x23 || op == 0x24: // global.get, global.set
		if d.u32() >= stop {
			d.fail("global index out of range")
		}
	case op >= 0x20 && op <= 0x26: // local.*, table.get, table.set
		d.u32()
	case op >= 0x28 && op <= 0x3e: // loads and stores
		d.memarg()
	case op == 0x3f || op == 0x40: // memory.size, memory.grow
		d.u32()
	case op == 0x41: // i32.const
		d.leb(5)
	case op == 0x42: // i64.const
		d.leb(10)
	case op == 0x43:
		d.bytes(4)
	case op == 0x44:
		d.bytes(8)
	case op == 0xd0: // ref.null t
		d.byte()
	case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0b || op == 0x0f || op == 0x1a || op == 0x1b ||
		(op >= 0x45 && op <= 0xc4) || op == 0xd1:
	case op == 0xfc:
		switch sub := d.u32(); {
		case sub <= 7: // saturating truncations
		case sub == 8: // memory.init data, mem
			d.u32()
			d.u32()
		case sub == 9 || sub == 11 || sub == 13 || sub == 15 || sub == 16 || sub == 17:
			d.u32()
		case sub == 10 || sub == 12 || sub == 14:
			d.u32()
			d.u32()
		default:
			d.fail("unknown opcode 0xfc %d", sub)
		}
	case op == 0xfd:
		switch sub := d.u32(); {
		case sub <= 11 || sub == 92 || sub == 93: // loads and stores
			d.memarg()
		case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
			d.bytes(16)
		case sub >= 21 && sub <= 34: // lane extract and replace
			d.byte()
		case sub >= 84 && sub <= 91: // lane loads and stores
			d.memarg()
			d.byte()
		case sub <= 0x113:
		default:
			d.fail("unknown opcode 0xfd %d", sub)
		}
	case op == 0xfe:
		switch sub := d.u32(); {
		case sub == 3: // atomic.fence
			d.byte()
		case sub <= 0x4e:
			d.memarg()
		default:
			d.fail("unknown opcode 0xfe %d", sub)
		}
	default:
		d.fail("unknown opcode %#x", op)
	}
	return op
}
