package wasmcheck

import (
	"errors"
	"fmt"
)

// Bounds on what a module may declare, checked on its bytes before wazero
// compiles it. Compiling costs memory in proportion to what a module
// declares, not to its size: one local declaration of 5 bytes stands for up
// to 2^32 locals, and a 55-byte function declaring 10 million i64 locals
// cost 2.5 GiB to compile. Measured with wazero 1.12's compiler here, a
// compile keeps about 60 bytes per local, 400 bytes per function and 35
// bytes per byte of code (100 in one huge function, while it is compiled).
// The bounds keep a check under about 1 GiB, and are several times what
// real programs need:
//
//   - the Go tasks under tasks/ (built for wasip1) have 1,250 to 2,350
//     functions, at most 22 locals in one function and about 4 on average,
//     code sections of 1.1 to 2.3 MiB, one table of about 6,000 entries;
//   - a big C++ program compiled to WASI has tens of thousands of
//     functions, most with a handful of locals, a few huge ones (an
//     interpreter loop, a generated parser) with hundreds to low thousands
//     of locals and some hundred KiB of code; its code section is some MiB.
const (
	// MaxFunctions bounds the functions a module defines (and, apart,
	// those it imports).
	MaxFunctions = 100_000
	// MaxLocalsPerFunction bounds the locals one function declares (its
	// parameters not counted).
	MaxLocalsPerFunction = 50_000
	// MaxLocals bounds the locals of all functions together.
	MaxLocals = 2_000_000
	// MaxCodeBytes bounds the code section: all the function bodies.
	MaxCodeBytes = 24 << 20
	// MaxFunctionBytes bounds one function body.
	MaxFunctionBytes = 2 << 20
	// MaxTableEntries bounds the initial size of a table, and the sum over
	// all tables: a table entry costs a worker 8 bytes that the linear
	// memory limit does not count (1.6 GiB for 200 million). Go programs
	// have one table of a few thousand entries (one per function whose
	// address is taken), C++ ones up to some tens of thousands (virtual
	// functions).
	MaxTableEntries = 10_000_000
	// maxTables bounds the tables a module declares (the reference types
	// proposal allows several; compilers emit one).
	maxTables = 100
	// MaxElements bounds the entries of all element segments together
	// (what initializes the tables): wazero keeps some 70 bytes for each.
	// Go programs have one per table entry, a few thousand.
	MaxElements = 1_000_000
	// maxVec bounds the other vectors a module declares (types, globals,
	// imports, exports, element and data segments), whose entries cost
	// wazero up to some 600 bytes each (a function type) before it
	// compiles anything. Go programs have some hundreds of types and
	// globals, and tens of imports and exports.
	maxVec = 100_000
)

// Summary is what the pre-scan counted in a module.
type Summary struct {
	Functions         int    // defined (not imported)
	ImportedFunctions int    //
	Locals            uint64 // declared by all function bodies together
	MaxLocals         uint64 // the most any one function declares
	CodeBytes         int    // size of the code section
	MaxFunctionBytes  int    // size of the largest function body
	TableEntries      uint64 // the sum of the tables' initial sizes
	Elements          uint64 // entries of all element segments together
}

// errMalformed marks bytes the scan could not read.
var errMalformed = errors.New("malformed")

// reader reads the WebAssembly binary format. Its offsets are the
// module's, b ending where the part being read ends.
type reader struct {
	b   []byte
	off int
}

// sub returns a reader of the next n bytes and passes them.
func (r *reader) sub(n uint32) (*reader, error) {
	start := r.off
	if err := r.skip(n); err != nil {
		return nil, err
	}
	return &reader{b: r.b[:r.off], off: start}, nil
}

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errMalformed
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

// u32 reads an unsigned LEB128 of at most 32 bits.
func (r *reader) u32() (uint32, error) {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, errMalformed
}

// skip passes n bytes.
func (r *reader) skip(n uint32) error {
	if uint64(n) > uint64(len(r.b)-r.off) {
		return errMalformed
	}
	r.off += int(n)
	return nil
}

// vec reads a vector's length, refused over max (naming what) and over
// the bytes left (each entry takes at least one byte).
func (r *reader) vec(what string, max int) (uint32, error) {
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	if uint64(n) > uint64(max) {
		return 0, fmt.Errorf("declares %d %s; at most %d", n, what, max)
	}
	if int(n) > len(r.b)-r.off {
		return 0, errMalformed
	}
	return n, nil
}

// limits reads a table's or memory's limits: min, and max when present.
func (r *reader) limits() (min uint32, max uint32, hasMax bool, err error) {
	flags, err := r.byte()
	if err != nil {
		return 0, 0, false, err
	}
	if flags > 3 { // 0: min; 1: min, max; 2, 3: shared memory (threads)
		return 0, 0, false, errMalformed
	}
	if min, err = r.u32(); err != nil {
		return 0, 0, false, err
	}
	if flags&1 != 0 {
		if max, err = r.u32(); err != nil {
			return 0, 0, false, err
		}
	}
	return min, max, flags&1 != 0, nil
}

// sectionNames name the sections in errors.
var sectionNames = [...]string{"custom", "type", "import", "function", "table", "memory", "global", "export", "start", "element", "code", "data", "data count"}

// Scan reads a module's section headers, its imports and tables and the
// local declarations of its function bodies, and refuses a module that
// declares more than the bounds above, before anything costs memory in
// proportion to what it declares; it allocates nothing in proportion to
// the module. It refuses bytes it cannot read, so that the compiler never
// sees them; what it does not read (types, instructions, ...) the compiler
// checks.
func Scan(wasm []byte) (Summary, error) {
	var s Summary
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return s, errors.New("not a WebAssembly module: it does not start with the \\0asm magic number")
	}
	if string(wasm[4:8]) != "\x01\x00\x00\x00" {
		return s, fmt.Errorf("invalid WebAssembly: version %x, only version 1 is supported", wasm[4:8])
	}
	r := &reader{b: wasm, off: 8}
	for r.off < len(r.b) {
		at := r.off
		id, _ := r.byte()
		name := fmt.Sprintf("unknown (id %d)", id)
		if int(id) < len(sectionNames) {
			name = sectionNames[id]
		}
		err := section(r, id, &s)
		if errors.Is(err, errMalformed) {
			return s, fmt.Errorf("invalid WebAssembly: the %s section at byte %d is cut short or malformed", name, at)
		}
		if err != nil {
			return s, err
		}
	}
	return s, nil
}

// section reads the section of the given id, after the id.
func section(r *reader, id byte, s *Summary) error {
	size, err := r.u32()
	if err != nil {
		return err
	}
	sec, err := r.sub(size)
	if err != nil {
		return err
	}
	switch id {
	case 9: // elements
		return scanElements(sec, s)
	case 1, 6, 7, 11: // types, globals, exports, data
		names := map[byte]string{1: "function types", 6: "globals", 7: "exports", 11: "data segments"}
		if _, err := sec.vec(names[id], maxVec); err != nil {
			return err
		}
	case 2: // imports
		return scanImports(sec, s)
	case 3: // functions
		n, err := sec.vec("functions", MaxFunctions)
		if err != nil {
			return err
		}
		s.Functions = int(n)
	case 4: // tables
		n, err := sec.vec("tables", maxTables)
		if err != nil {
			return err
		}
		for i := range n {
			if _, err := sec.byte(); err != nil { // the element type
				return err
			}
			if err := table(sec, s, fmt.Sprintf("table %d", i)); err != nil {
				return err
			}
		}
	case 10: // code
		s.CodeBytes = int(size)
		if size > MaxCodeBytes {
			return fmt.Errorf("its code section is %d bytes; at most %d (%d MiB)", size, MaxCodeBytes, MaxCodeBytes>>20)
		}
		return scanCode(sec, s)
	}
	return nil
}

// table checks one table's limits. Its initial size is what the module
// gets at instantiation, and it is bounded here. A table without a maximum
// (every Go program has one) or with a large one is accepted: how far a
// table grows while an attempt runs is the worker's to bound (a slot
// process's address-space limit counts it with the memory).
func table(r *reader, s *Summary, what string) error {
	min, max, hasMax, err := r.limits()
	if err != nil {
		return err
	}
	if hasMax && min > max {
		return errMalformed
	}
	if min > MaxTableEntries {
		return fmt.Errorf("%s has %d entries; at most %d", what, min, MaxTableEntries)
	}
	s.TableEntries += uint64(min)
	if s.TableEntries > MaxTableEntries {
		return fmt.Errorf("its tables have %d entries together; at most %d", s.TableEntries, MaxTableEntries)
	}
	return nil
}

// scanImports counts imported functions and checks imported tables.
func scanImports(r *reader, s *Summary) error {
	n, err := r.vec("imports", maxVec)
	if err != nil {
		return err
	}
	for range n {
		for range 2 { // module, name
			l, err := r.u32()
			if err != nil {
				return err
			}
			if err := r.skip(l); err != nil {
				return err
			}
		}
		kind, err := r.byte()
		if err != nil {
			return err
		}
		switch kind {
		case 0: // function: a type index
			s.ImportedFunctions++
			if s.ImportedFunctions > MaxFunctions {
				return fmt.Errorf("imports more than %d functions", MaxFunctions)
			}
			if _, err := r.u32(); err != nil {
				return err
			}
		case 1: // table
			return errors.New("imports a table: a task must define its own tables")
		case 2: // memory
			if _, _, _, err := r.limits(); err != nil {
				return err
			}
		case 3: // global: a value type and mutability
			if err := r.skip(2); err != nil {
				return err
			}
		default:
			return errMalformed
		}
	}
	return nil
}

// scanCode reads each body's local declarations and skips its code.
func scanCode(r *reader, s *Summary) error {
	n, err := r.vec("function bodies", MaxFunctions)
	if err != nil {
		return err
	}
	for i := range n {
		size, err := r.u32()
		if err != nil {
			return err
		}
		body, err := r.sub(size)
		if err != nil {
			return err
		}
		// Numbered as tools number them: after the imported functions.
		fn := s.ImportedFunctions + int(i)
		if size > MaxFunctionBytes {
			return fmt.Errorf("function %d is %d bytes of code; at most %d (%d MiB) per function", fn, size, MaxFunctionBytes, MaxFunctionBytes>>20)
		}
		s.MaxFunctionBytes = max(s.MaxFunctionBytes, int(size))
		decls, err := body.u32()
		if err != nil {
			return err
		}
		if int(decls) > len(body.b)-body.off { // each takes 2 bytes or more
			return errMalformed
		}
		// The sum of at most 2^31 counts of at most 2^32 - 1: no overflow.
		var locals uint64
		for range decls {
			c, err := body.u32()
			if err != nil {
				return err
			}
			if _, err := body.byte(); err != nil { // the value type
				return err
			}
			locals += uint64(c)
		}
		if locals > MaxLocalsPerFunction {
			return fmt.Errorf("function %d declares %d locals; at most %d per function", fn, locals, MaxLocalsPerFunction)
		}
		s.Locals += locals
		s.MaxLocals = max(s.MaxLocals, locals)
		if s.Locals > MaxLocals {
			return fmt.Errorf("its functions declare more than %d locals together (%d in the first %d functions)", MaxLocals, s.Locals, i+1)
		}
	}
	return nil
}

// scanElements counts the entries of the element segments.
func scanElements(r *reader, s *Summary) error {
	n, err := r.vec("element segments", maxVec)
	if err != nil {
		return err
	}
	for range n {
		flags, err := r.u32()
		if err != nil {
			return err
		}
		if flags > 7 {
			return errMalformed
		}
		if flags&3 == 2 { // an explicit table index
			if _, err := r.u32(); err != nil {
				return err
			}
		}
		if flags&1 == 0 { // active: an offset
			if err := r.constExpr(); err != nil {
				return err
			}
		}
		if flags&3 != 0 { // an element kind (0x00) or reference type
			if _, err := r.byte(); err != nil {
				return err
			}
		}
		count, err := r.u32()
		if err != nil {
			return err
		}
		s.Elements += uint64(count)
		if s.Elements > MaxElements {
			return fmt.Errorf("its element segments have %d entries or more together; at most %d", s.Elements, MaxElements)
		}
		if uint64(count) > uint64(len(r.b)-r.off) { // each takes a byte or more
			return errMalformed
		}
		for range count {
			if flags&4 == 0 {
				_, err = r.u32() // a function index
			} else {
				err = r.constExpr()
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// constExpr skips a constant expression, up to its end.
func (r *reader) constExpr() error {
	for {
		op, err := r.byte()
		if err != nil {
			return err
		}
		switch op {
		case 0x0b: // end
			return nil
		case 0x41, 0x42, 0x23, 0xd2: // i32.const, i64.const, global.get, ref.func: a LEB128
			if err := r.leb(); err != nil {
				return err
			}
		case 0x43: // f32.const
			err = r.skip(4)
		case 0x44: // f64.const
			err = r.skip(8)
		case 0xd0: // ref.null: a reference type
			_, err = r.byte()
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // add, sub, mul (extended constant expressions)
		case 0xfd: // v128.const: 0x0c, then 16 bytes
			var sub uint32
			if sub, err = r.u32(); err == nil && sub != 0x0c {
				err = errMalformed
			}
			if err == nil {
				err = r.skip(16)
			}
		default:
			return errMalformed
		}
		if err != nil {
			return err
		}
	}
}

// leb skips a LEB128 of at most 10 bytes (signed or not, up to 64 bits).
func (r *reader) leb() error {
	for range 10 {
		c, err := r.byte()
		if err != nil {
			return err
		}
		if c&0x80 == 0 {
			return nil
		}
	}
	return errMalformed
}
