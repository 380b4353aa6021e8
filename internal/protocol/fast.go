package protocol

import (
	"strconv"
)

// decodeFast parses the JSON header of the most frequent frames, assign
// and ack, as encoding/json would, several times faster (it matters most
// in the browser worker, where Go runs as WebAssembly and encoding/json's
// byte-by-byte scanner costs more than the rest of an attempt's handling).
// It knows only the form json.Marshal writes: exact field names, strings
// of printable ASCII without escapes, integers without fraction or
// exponent, null only for lists. On anything else it reports false and
// Decode uses encoding/json, which then decides (and words any error).
func decodeFast(hdr []byte) (*Frame, bool) {
	p := fastParser{b: hdr}
	f := new(Frame)
	ok := p.object(func(key []byte) bool {
		switch string(key) {
		case "t":
			s, ok := p.str()
			f.Type = s
			return ok
		case "assign":
			ok := p.list(func() bool {
				f.Assign = append(f.Assign, Assign{})
				return p.assign(&f.Assign[len(f.Assign)-1])
			}, func() { f.Assign = nil })
			if ok && f.Assign == nil && p.b[p.i-1] == ']' {
				f.Assign = []Assign{}
			}
			return ok
		case "acks":
			ok := p.list(func() bool {
				f.Acks = append(f.Acks, Ack{})
				return p.ack(&f.Acks[len(f.Acks)-1])
			}, func() { f.Acks = nil })
			if ok && f.Acks == nil && p.b[p.i-1] == ']' {
				f.Acks = []Ack{}
			}
			return ok
		}
		return false
	})
	p.space()
	if !ok || p.i != len(p.b) || (f.Type != TypeAssign && f.Type != TypeAck) {
		return nil, false
	}
	return f, true
}

// fastParser reads the subset of JSON that decodeFast accepts.
type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// take consumes c (after white space) and reports whether it was there.
func (p *fastParser) take(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// null consumes a null literal if one comes next.
func (p *fastParser) null() bool {
	p.space()
	if len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "null" {
		p.i += 4
		return true
	}
	return false
}

// rawStr reads a string of printable ASCII without escapes.
func (p *fastParser) rawStr() ([]byte, bool) {
	if !p.take('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return p.b[start : p.i-1], true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, false
		}
		p.i++
	}
	return nil, false
}

func (p *fastParser) str() (string, bool) {
	s, ok := p.rawStr()
	return string(s), ok
}

// digits reads an integer literal: an optional minus sign and digits,
// without fraction or exponent, as JSON writes it (no leading zeros).
func (p *fastParser) digits() ([]byte, bool) {
	p.space()
	start := p.i
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	d := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	if p.i == d || (p.b[d] == '0' && p.i-d > 1) {
		return nil, false
	}
	if p.i < len(p.b) {
		switch p.b[p.i] {
		case '.', 'e', 'E':
			return nil, false
		}
	}
	return p.b[start:p.i], true
}

func (p *fastParser) int64() (int64, bool) {
	d, ok := p.digits()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(d), 10, 64)
	return v, err == nil
}

func (p *fastParser) uint(bits int) (uint64, bool) {
	d, ok := p.digits()
	if !ok || d[0] == '-' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(d), 10, bits)
	return v, err == nil
}

func (p *fastParser) int() (int, bool) {
	v, ok := p.int64()
	return int(v), ok && int64(int(v)) == v
}

func (p *fastParser) bool() (bool, bool) {
	p.space()
	switch {
	case len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "true":
		p.i += 4
		return true, true
	case len(p.b)-p.i >= 5 && string(p.b[p.i:p.i+5]) == "false":
		p.i += 5
		return false, true
	}
	return false, false
}

// object reads an object, calling field for each key with the parser at
// its value; field consumes the value and reports success. A key seen
// twice is refused (encoding/json merges objects and replaces lists then).
func (p *fastParser) object(field func(key []byte) bool) bool {
	if !p.take('{') {
		return false
	}
	if p.take('}') {
		return true
	}
	var seen [16][]byte
	n := 0
	for {
		key, ok := p.rawStr()
		if !ok || !p.take(':') {
			return false
		}
		for _, k := range seen[:n] {
			if string(k) == string(key) {
				return false
			}
		}
		if n == len(seen) {
			return false
		}
		seen[n] = key
		n++
		if !field(key) {
			return false
		}
		if p.take('}') {
			return true
		}
		if !p.take(',') {
			return false
		}
	}
}

// list reads an array, calling item for each element, or null (calling
// none).
func (p *fastParser) list(item func() bool, none func()) bool {
	if p.null() {
		none()
		return true
	}
	if !p.take('[') {
		return false
	}
	if p.take(']') {
		return true
	}
	for {
		if !item() {
			return false
		}
		if p.take(']') {
			return true
		}
		if !p.take(',') {
			return false
		}
	}
}

func (p *fastParser) blob(b *Blob) bool {
	return p.object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "name":
			b.Name, ok = p.str()
		case "size":
			b.Size, ok = p.int()
		}
		return ok
	})
}

func (p *fastParser) assign(a *Assign) bool {
	return p.object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "attempt":
			a.Attempt, ok = p.int64()
		case "task":
			a.Task, ok = p.str()
		case "module":
			a.Module, ok = p.str()
		case "args":
			a.Args = nil
			ok = p.list(func() bool {
				s, ok := p.str()
				a.Args = append(a.Args, s)
				return ok
			}, func() {})
			if ok && a.Args == nil && p.b[p.i-1] == ']' {
				a.Args = []string{}
			}
		case "stdin":
			ok = p.blob(&a.Stdin)
		case "inputs":
			a.Inputs = nil
			ok = p.list(func() bool {
				a.Inputs = append(a.Inputs, Blob{})
				return p.blob(&a.Inputs[len(a.Inputs)-1])
			}, func() {})
			if ok && a.Inputs == nil && p.b[p.i-1] == ']' {
				a.Inputs = []Blob{}
			}
		case "restore":
			ok = p.blob(&a.Restore)
		case "seed":
			a.Seed, ok = p.uint(64)
		case "limits":
			ok = p.object(func(key []byte) bool {
				var ok bool
				switch string(key) {
				case "memory_pages":
					var v uint64
					v, ok = p.uint(32)
					a.Limits.MemoryPages = uint32(v)
				case "wall_ms":
					a.Limits.WallMS, ok = p.int64()
				case "output_bytes":
					a.Limits.OutputBytes, ok = p.int64()
				case "log_bytes":
					a.Limits.LogBytes, ok = p.int64()
				}
				return ok
			})
		case "ckpt_ms":
			a.CkptMS, ok = p.int64()
		case "priority":
			a.Priority, ok = p.str()
		}
		return ok
	})
}

func (p *fastParser) ack(a *Ack) bool {
	return p.object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "attempt":
			a.Attempt, ok = p.int64()
		case "of":
			a.Of, ok = p.str()
		case "seq":
			a.Seq, ok = p.int()
		case "ok":
			a.OK, ok = p.bool()
		case "retry":
			a.Retry, ok = p.bool()
		case "error":
			a.Error, ok = p.str()
		}
		return ok
	})
}
