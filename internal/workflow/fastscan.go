package workflow

import (
	"encoding/json"
	"strconv"
)

// fastDecode decodes a file as scan and the JSON decoding that follows it
// in Parse would, in one pass over the bytes. scan walks the file's tokens
// with json.Decoder, whose Token allocates a value per token (33
// allocations per task of a small task): 40 of the 75 ms that Parse took
// for a file of 20,000 tasks, and the decoding 25 more. fastDecode may
// give up on a file that scan accepts (a key written with an escape, a
// number with a fraction, an exponent or more than 9 digits, an object of
// more than 16 keys, and any error): Parse then runs scan, which finds the
// file good or says what is wrong with it, and the JSON decoding. When it
// does not give up, scan accepts the file and the decoding gives the same
// values (FuzzFastDecode). data must be valid UTF-8 (Parse checks it
// first).
func fastDecode(data []byte) (f fileJSON, ok bool) {
	p := &fastScanner{data: data}
	ok = p.object(func(key []byte) bool {
		switch string(key) {
		case "name":
			return p.string(&f.Name)
		case "priority":
			return p.stringPtr(&f.Priority)
		case "replicas":
			return p.intPtr(&f.Replicas)
		case "quorum":
			return p.intPtr(&f.Quorum)
		case "tasks":
			f.Tasks = []taskJSON{}
			return p.array(func() bool {
				if len(f.Tasks) >= MaxTasks {
					return false
				}
				f.Tasks = append(f.Tasks, taskJSON{})
				return p.task(&f.Tasks[len(f.Tasks)-1])
			})
		}
		return false
	})
	p.space()
	return f, ok && p.i == len(p.data)
}

func (p *fastScanner) task(t *taskJSON) bool {
	return p.object(func(key []byte) bool {
		switch string(key) {
		case "name":
			return p.string(&t.Name)
		case "module":
			return p.string(&t.Module)
		case "args":
			t.Args = []string{}
			return p.array(func() bool {
				var a string
				ok := p.string(&a)
				t.Args = append(t.Args, a)
				return ok
			})
		case "inputs":
			t.Inputs = map[string]refJSON{}
			return p.object(func(file []byte) bool {
				var r refJSON
				ok := p.object(func(key []byte) bool {
					switch string(key) {
					case "from":
						return p.stringPtr(&r.From)
					case "output":
						return p.stringPtr(&r.Output)
					}
					return false
				})
				t.Inputs[string(file)] = r
				return ok
			})
		case "stdin":
			t.Stdin = &stdinJSON{}
			return p.object(func(key []byte) bool {
				switch string(key) {
				case "from":
					return p.stringPtr(&t.Stdin.From)
				case "output":
					return p.stringPtr(&t.Stdin.Output)
				case "data":
					return p.stringPtr(&t.Stdin.Data)
				}
				return false
			})
		case "timeout":
			return p.stringPtr(&t.Timeout)
		case "max_attempts":
			return p.intPtr(&t.MaxAttempts)
		case "limits":
			t.Limits = &limitsJSON{}
			return p.object(func(key []byte) bool {
				switch string(key) {
				case "memory_mib":
					return p.intPtr(&t.Limits.MemoryMiB)
				case "output_mib":
					return p.intPtr(&t.Limits.OutputMiB)
				case "log_kib":
					return p.intPtr(&t.Limits.LogKiB)
				}
				return false
			})
		case "checkpoint_interval":
			return p.stringPtr(&t.CheckpointInterval)
		}
		return false
	})
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

// object consumes an object, calling member with each key (which must
// consume the value). Duplicate keys give up, as do escaped keys (scan
// compares keys after unescaping them) and objects of more than 16 keys.
func (p *fastScanner) object(member func(key []byte) bool) bool {
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
		if !ok || escaped || len(seen) == len(buf) {
			return false
		}
		for _, k := range seen {
			if string(k) == string(key) {
				return false
			}
		}
		seen = append(seen, key)
		if !p.next(':') {
			return false
		}
		p.space()
		if !member(key) {
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

// array consumes an array, calling elem for each element (which must
// consume it).
func (p *fastScanner) array(elem func() bool) bool {
	if !p.next('[') {
		return false
	}
	if p.next(']') {
		return true
	}
	for {
		p.space()
		if !elem() {
			return false
		}
		if p.next(']') {
			return true
		}
		if !p.next(',') {
			return false
		}
	}
}

// string consumes a string into v.
func (p *fastScanner) string(v *string) bool {
	p.space()
	start := p.i
	raw, escaped, ok := p.str()
	switch {
	case !ok:
		return false
	case !escaped:
		*v = string(raw)
		return true
	}
	return json.Unmarshal(p.data[start:p.i], v) == nil
}

func (p *fastScanner) stringPtr(v **string) bool {
	*v = new(string)
	return p.string(*v)
}

func (p *fastScanner) intPtr(v **int) bool {
	p.space()
	start := p.i
	if !p.integer() {
		return false
	}
	n, err := strconv.Atoi(string(p.data[start:p.i]))
	*v = &n
	return err == nil
}
