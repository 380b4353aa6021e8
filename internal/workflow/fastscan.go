package workflow

// fastScan reports whether scan certainly accepts data: the same walk of
// the schema over the bytes themselves, without json.Decoder's tokens.
// scan's Token calls allocate a value per token (33 allocations per task
// of a small task): 40 of the 75 ms that Parse took for a file of 20,000
// tasks. fastScan may refuse a file that scan accepts (a key written with
// an escape, a number with a fraction or exponent, more than 9 digits):
// Parse then runs scan, which finds the file good or says what is wrong
// with it. It never accepts a file that scan refuses (FuzzFastScan).
// data must be valid UTF-8 (Parse checks it first).
func fastScan(data []byte) bool {
	p := &fastScanner{data: data}
	p.space()
	if !p.value(schema) {
		return false
	}
	p.space()
	return p.i == len(p.data)
}

type fastScanner struct {
	data []byte
	i    int
}

func (p *fastScanner) space() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// next skips white space and consumes c if it comes next.
func (p *fastScanner) next(c byte) bool {
	p.space()
	if p.i < len(p.data) && p.data[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str consumes a JSON string and returns its bytes between the quotes and
// whether it holds an escape.
func (p *fastScanner) str() (s []byte, escaped, ok bool) {
	if p.i >= len(p.data) || p.data[p.i] != '"' {
		return nil, false, false
	}
	p.i++
	start := p.i
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			s = p.data[start:p.i]
			p.i++
			return s, escaped, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			escaped = true
			if p.i+1 >= len(p.data) {
				return nil, false, false
			}
			switch p.data[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if p.i+6 > len(p.data) {
					return nil, false, false
				}
				for _, h := range p.data[p.i+2 : p.i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return nil, false, false
					}
				}
				p.i += 6
			default:
				return nil, false, false
			}
		default:
			p.i++
		}
	}
	return nil, false, false
}

// integer consumes an integer of at most 9 digits (which fits in 32 bits),
// written as JSON writes numbers.
func (p *fastScanner) integer() bool {
	if p.i < len(p.data) && p.data[p.i] == '-' {
		p.i++
	}
	start := p.i
	for p.i < len(p.data) && '0' <= p.data[p.i] && p.data[p.i] <= '9' {
		p.i++
	}
	n := p.i - start
	if n == 0 || n > 9 || n > 1 && p.data[start] == '0' {
		return false
	}
	if p.i < len(p.data) {
		switch p.data[p.i] {
		case '.', 'e', 'E':
			return false
		}
	}
	return true
}

func (p *fastScanner) value(n *node) bool {
	p.space()
	switch n.typ {
	case tString:
		_, _, ok := p.str()
		return ok
	case tInt:
		return p.integer()
	case tArray:
		if !p.next('[') {
			return false
		}
		if p.next(']') {
			return true
		}
		for count := 1; ; count++ {
			if n == schema.fields["tasks"] && count > MaxTasks {
				return false
			}
			if !p.value(n.elem) {
				return false
			}
			if p.next(']') {
				return true
			}
			if !p.next(',') {
				return false
			}
		}
	case tObject, tMap:
		if !p.next('{') {
			return false
		}
		if p.next('}') {
			return true
		}
		var buf [16][]byte // a task has at most 9 fields
		seen := buf[:0]
		for {
			p.space()
			key, escaped, ok := p.str()
			if !ok || escaped || len(seen) >= 64 {
				return false // scan compares keys after unescaping them
			}
			for _, k := range seen {
				if string(k) == string(key) {
					return false
				}
			}
			child := n.elem
			if n.typ == tObject {
				if child = n.fields[string(key)]; child == nil {
					return false
				}
			}
			seen = append(seen, key)
			if !p.next(':') || !p.value(child) {
				return false
			}
			if p.next('}') {
				return true
			}
			if !p.next(',') {
				return false
			}
		}
	}
	return false
}
