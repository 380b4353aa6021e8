// Package jsonscan reads JSON text for decoders written by hand for speed
// (the worker protocol's most frequent frames, workflow files of thousands
// of tasks), where encoding/json's reflection and byte-by-byte state
// machine cost more than the work that follows. A Scanner reads one token
// at a time and reports false on anything outside the subset it knows; its
// callers then fall back to encoding/json, which decides and words the
// error. It accepts only valid JSON: numbers as JSON writes integers (no
// fraction or exponent), and objects of at most 16 distinct keys written
// without escapes.
package jsonscan

// Scanner reads JSON text from a byte slice.
type Scanner struct {
	data []byte
	i    int
}

// New returns a Scanner at the start of data.
func New(data []byte) *Scanner { return &Scanner{data: data} }

// Space skips white space.
func (s *Scanner) Space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// Done skips white space and reports whether the text ends there.
func (s *Scanner) Done() bool {
	s.Space()
	return s.i == len(s.data)
}

// Take skips white space and consumes c if it comes next.
func (s *Scanner) Take(c byte) bool {
	s.Space()
	if s.i < len(s.data) && s.data[s.i] == c {
		s.i++
		return true
	}
	return false
}

// literal skips white space and consumes lit if it comes next.
func (s *Scanner) literal(lit string) bool {
	s.Space()
	if len(s.data)-s.i >= len(lit) && string(s.data[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// Null consumes a null literal if one comes next.
func (s *Scanner) Null() bool { return s.literal("null") }

// Bool consumes true or false.
func (s *Scanner) Bool() (v, ok bool) {
	switch {
	case s.literal("true"):
		return true, true
	case s.literal("false"):
		return false, true
	}
	return false, false
}

// String consumes a string and returns its bytes between the quotes (raw:
// escapes as written), whether it holds an escape, and whether it was a
// valid JSON string. It does not check UTF-8.
func (s *Scanner) String() (raw []byte, escaped, ok bool) {
	if !s.Take('"') {
		return nil, false, false
	}
	start := s.i
	for s.i < len(s.data) {
		c := s.data[s.i]
		switch {
		case c == '"':
			s.i++
			return s.data[start : s.i-1], escaped, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.data) {
				return nil, false, false
			}
			switch s.data[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.data) {
					return nil, false, false
				}
				for _, h := range s.data[s.i+2 : s.i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return nil, false, false
					}
				}
				s.i += 6
			default:
				return nil, false, false
			}
		default:
			s.i++
		}
	}
	return nil, false, false
}

// Integer consumes an integer as JSON writes one (an optional minus sign,
// digits without leading zeros, no fraction or exponent) and returns its
// text.
func (s *Scanner) Integer() ([]byte, bool) {
	s.Space()
	start := s.i
	if s.i < len(s.data) && s.data[s.i] == '-' {
		s.i++
	}
	d := s.i
	for s.i < len(s.data) && '0' <= s.data[s.i] && s.data[s.i] <= '9' {
		s.i++
	}
	if s.i == d || s.data[d] == '0' && s.i-d > 1 {
		return nil, false
	}
	if s.i < len(s.data) {
		switch s.data[s.i] {
		case '.', 'e', 'E':
			return nil, false
		}
	}
	return s.data[start:s.i], true
}

// Number consumes a number as JSON writes one (an optional minus sign,
// digits without leading zeros, an optional fraction and exponent) and
// returns its text.
func (s *Scanner) Number() ([]byte, bool) {
	s.Space()
	start := s.i
	digits := func() int {
		d := s.i
		for s.i < len(s.data) && '0' <= s.data[s.i] && s.data[s.i] <= '9' {
			s.i++
		}
		return s.i - d
	}
	if s.i < len(s.data) && s.data[s.i] == '-' {
		s.i++
	}
	d := s.i
	if n := digits(); n == 0 || s.data[d] == '0' && n > 1 {
		return nil, false
	}
	if s.i < len(s.data) && s.data[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return nil, false
		}
	}
	if s.i < len(s.data) && (s.data[s.i] == 'e' || s.data[s.i] == 'E') {
		s.i++
		if s.i < len(s.data) && (s.data[s.i] == '+' || s.data[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return nil, false
		}
	}
	return s.data[start:s.i], true
}

// maxKeys is the most keys Object takes in one object.
const maxKeys = 16

// Object consumes an object, calling member with each key and the Scanner
// before its value, which member must consume. A key written with an
// escape, a key seen twice (encoding/json would merge or replace the
// values) and more than 16 keys are refused.
func (s *Scanner) Object(member func(key []byte) bool) bool {
	if !s.Take('{') {
		return false
	}
	if s.Take('}') {
		return true
	}
	var buf [maxKeys][]byte
	seen := buf[:0]
	for {
		key, escaped, ok := s.String()
		if !ok || escaped || len(seen) == len(buf) || !s.Take(':') {
			return false
		}
		for _, k := range seen {
			if string(k) == string(key) {
				return false
			}
		}
		seen = append(seen, key)
		s.Space()
		if !member(key) {
			return false
		}
		if s.Take('}') {
			return true
		}
		if !s.Take(',') {
			return false
		}
	}
}

// Array consumes an array, calling elem with the Scanner before each
// element, which elem must consume.
func (s *Scanner) Array(elem func() bool) bool {
	if !s.Take('[') {
		return false
	}
	if s.Take(']') {
		return true
	}
	for {
		s.Space()
		if !elem() {
			return false
		}
		if s.Take(']') {
			return true
		}
		if !s.Take(',') {
			return false
		}
	}
}

// Text returns the text from offset start to the Scanner's position.
func (s *Scanner) Text(start int) []byte { return s.data[start:s.i] }

// Pos is the Scanner's offset in its text.
func (s *Scanner) Pos() int { return s.i }
