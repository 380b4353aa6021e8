package jsonscan

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		in      string
		ok      bool
		escaped bool
		raw     string
	}{
		{`"plain"`, true, false, "plain"},
		{` "spaced"`, true, false, "spaced"},
		{`"é ü"`, true, false, "é ü"},
		{`"a\"b\\c\/d\b\f\n\r\t"`, true, true, `a\"b\\c\/d\b\f\n\r\t`},
		{`"\u00e9\uD83D"`, true, true, `\u00e9\uD83D`},
		{`"\x"`, false, false, ""},
		{`"\u00g0"`, false, false, ""},
		{`"\u00e"`, false, false, ""},
		{"\"tab\there\"", false, false, ""},
		{`"open`, false, false, ""},
		{`open"`, false, false, ""},
	} {
		raw, escaped, ok := New([]byte(tc.in)).String()
		if ok != tc.ok || escaped != tc.escaped || string(raw) != tc.raw {
			t.Errorf("%s: %q %v %v, want %q %v %v", tc.in, raw, escaped, ok, tc.raw, tc.escaped, tc.ok)
		}
		if tc.ok != json.Valid([]byte(tc.in)) {
			t.Errorf("%s: ok %v but json.Valid says otherwise", tc.in, tc.ok)
		}
	}
}

func TestInteger(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"0", true}, {"-0", true}, {"42", true}, {"-17", true}, {"9223372036854775808", true},
		{"01", false}, {"-01", false}, {"1.5", false}, {"1e3", false}, {"1E3", false}, {"-", false}, {"x", false}, {"", false},
	} {
		d, ok := New([]byte(tc.in)).Integer()
		if ok != tc.ok || ok && string(d) != tc.in {
			t.Errorf("%q: %q %v, want ok %v", tc.in, d, ok, tc.ok)
		}
	}
}

func TestNumber(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // the number's text; "" when refused
	}{
		{"0", "0"}, {"-0", "-0"}, {"1.5", "1.5"}, {"-0.25e-3", "-0.25e-3"}, {"1E+2", "1E+2"}, {"3e400", "3e400"},
		{"12,", "12"}, {"7}", "7"},
		{"01", ""}, {".5", ""}, {"1.", ""}, {"1e", ""}, {"1e+", ""}, {"-", ""}, {"+1", ""}, {"x", ""}, {"", ""},
	} {
		d, ok := New([]byte(tc.in)).Number()
		if ok != (tc.want != "") || string(d) != tc.want {
			t.Errorf("%q: %q %v, want %q", tc.in, d, ok, tc.want)
		}
	}
}

func TestObjectAndArray(t *testing.T) {
	many := make([]string, maxKeys+1)
	for i := range many {
		many[i] = fmt.Sprintf(`"k%d": 1`, i)
	}
	for _, tc := range []struct {
		in   string
		ok   bool
		keys string
	}{
		{`{}`, true, ""},
		{` { "a" : 1 , "b": [true, false, null] } `, true, "a,b"},
		{`{"a": 1, "a": 2}`, false, "a"},
		{`{"\u0061": 1}`, false, ""},
		{`{"a": 1,}`, false, "a"},
		{`{"a" 1}`, false, ""},
		{`{` + strings.Join(many[:maxKeys], ",") + `}`, true, ""},
		{`{` + strings.Join(many, ",") + `}`, false, ""},
		{`{"a": [1, 2,]}`, false, "a"},
		{`{"a": [1 2]}`, false, "a"},
	} {
		s := New([]byte(tc.in))
		var keys []string
		ok := s.Object(func(key []byte) bool {
			keys = append(keys, string(key))
			switch s.data[s.i] {
			case '[':
				return s.Array(func() bool {
					if s.Null() {
						return true
					}
					if _, ok := s.Bool(); ok {
						return true
					}
					_, ok := s.Integer()
					return ok
				})
			default:
				_, ok := s.Integer()
				return ok
			}
		}) && s.Done()
		if ok != tc.ok {
			t.Errorf("%s: ok %v, want %v", tc.in, ok, tc.ok)
		}
		if tc.keys != "" && strings.Join(keys, ",") != tc.keys {
			t.Errorf("%s: keys %v, want %s", tc.in, keys, tc.keys)
		}
		if ok && !json.Valid([]byte(tc.in)) {
			t.Errorf("%s: accepted, but it is not JSON", tc.in)
		}
	}
}
