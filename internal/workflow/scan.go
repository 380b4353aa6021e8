package workflow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The first pass over a file walks its JSON tokens against this schema, so
// that syntax errors, unknown fields, duplicate keys, nulls and wrong types are
// refused with the full path of the offending field, in file order, before
// the file is decoded into Go values.

type nodeType int

const (
	tString nodeType = iota
	tInt
	tObject // fixed fields
	tMap    // any keys, values of one schema
	tArray
	tBool
)

type node struct {
	typ    nodeType
	fields map[string]*node // tObject
	elem   *node            // tMap, tArray
}

var schema = func() *node {
	str := &node{typ: tString}
	num := &node{typ: tInt}
	ref := &node{typ: tObject, fields: map[string]*node{"from": str, "output": str}}
	stdin := &node{typ: tObject, fields: map[string]*node{"from": str, "output": str, "data": str}}
	boolean := &node{typ: tBool}
	limits := &node{typ: tObject, fields: map[string]*node{"memory_mib": num, "output_mib": num, "log_kib": num, "scratch_mib": num}}
	file := &node{typ: tObject, fields: map[string]*node{"blob": str, "archive": boolean, "writable": boolean, "data": str, "from": str, "output": str}}
	task := &node{typ: tObject, fields: map[string]*node{
		"name":                str,
		"module":              str,
		"args":                {typ: tArray, elem: str},
		"inputs":              {typ: tMap, elem: ref},
		"stdin":               stdin,
		"timeout":             str,
		"max_attempts":        num,
		"limits":              limits,
		"checkpoint_interval": str,
		"env":                 {typ: tMap, elem: str},
		"cwd":                 str,
		"files":               {typ: tMap, elem: file},
		"outputs":             {typ: tArray, elem: str},
	}}
	return &node{typ: tObject, fields: map[string]*node{
		"name":     str,
		"priority": str,
		"replicas": num,
		"quorum":   num,
		"tasks":    {typ: tArray, elem: task},
	}}
}()

// scanner walks the tokens of one file.
type scanner struct {
	data  []byte
	dec   *json.Decoder
	path  []string // keys, and "[i]" for array elements
	names []string // task names seen so far, by index ("" if none yet)
}

// scan checks the structure of a whole file. It returns nil or an *Error.
func scan(data []byte) error {
	s := &scanner{data: data, dec: json.NewDecoder(bytes.NewReader(data))}
	s.dec.UseNumber()
	if err := s.value(schema); err != nil {
		return err
	}
	if _, err := s.dec.Token(); err != io.EOF {
		return &Error{Msg: fmt.Sprintf("unexpected data after the workflow object (%s)", s.where(s.dec.InputOffset()))}
	}
	return nil
}

// where formats a byte offset as a line and column.
func (s *scanner) where(off int64) string {
	if off > int64(len(s.data)) {
		off = int64(len(s.data))
	}
	line := 1 + bytes.Count(s.data[:off], []byte{'\n'})
	col := int(off) - bytes.LastIndexByte(s.data[:off], '\n')
	return fmt.Sprintf("line %d, column %d", line, col)
}

// fail builds an *Error for the current path.
func (s *scanner) fail(msg string) error {
	e := &Error{Msg: msg}
	path := s.path
	if len(path) >= 2 && path[0] == "tasks" && strings.HasPrefix(path[1], "[") {
		i, _ := strconv.Atoi(strings.Trim(path[1], "[]"))
		name := ""
		if i < len(s.names) {
			name = s.names[i]
		}
		if name == "" {
			name = lenientTaskName(s.data, i)
		}
		if name != "" {
			e.Task = name
			path = path[2:]
		}
	}
	e.Field = joinPath(path)
	return e
}

func joinPath(path []string) string {
	var b strings.Builder
	for _, p := range path {
		if b.Len() > 0 && !strings.HasPrefix(p, "[") {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

// lenientTaskName returns the name of task i if the file is valid JSON and the
// name is a valid task name, "" otherwise.
func lenientTaskName(data []byte, i int) string {
	var f struct {
		Tasks []struct {
			Name any `json:"name"`
		} `json:"tasks"`
	}
	_ = json.Unmarshal(data, &f) // best effort: fills what it can
	if i < len(f.Tasks) {
		if n, ok := f.Tasks[i].Name.(string); ok && checkTaskName(n) == "" {
			return n
		}
	}
	return ""
}

func (s *scanner) token() (json.Token, error) {
	off := s.dec.InputOffset()
	tok, err := s.dec.Token()
	if err != nil {
		var se *json.SyntaxError
		switch {
		case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
			return nil, &Error{Msg: "invalid JSON: unexpected end of file"}
		case errors.As(err, &se):
			return nil, &Error{Msg: fmt.Sprintf("invalid JSON at %s: %s", s.where(se.Offset), se.Error())}
		default:
			return nil, &Error{Msg: fmt.Sprintf("invalid JSON at %s: %v", s.where(off), err)}
		}
	}
	return tok, nil
}

func describe(tok json.Token) string {
	switch t := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "an array"
	}
	return "a value"
}

var typeWord = map[nodeType]string{
	tString: "a string",
	tInt:    "an integer",
	tObject: "an object",
	tMap:    "an object",
	tArray:  "an array",
	tBool:   "true or false",
}

// value reads one value that must match n.
func (s *scanner) value(n *node) error {
	tok, err := s.token()
	if err != nil {
		return err
	}
	if tok == nil {
		return s.fail("must not be null (leave the field out instead)")
	}
	wrong := func() error {
		return s.fail(fmt.Sprintf("must be %s, not %s", typeWord[n.typ], describe(tok)))
	}
	switch n.typ {
	case tString:
		if _, ok := tok.(string); !ok {
			return wrong()
		}
		return nil
	case tBool:
		if _, ok := tok.(bool); !ok {
			return wrong()
		}
		return nil
	case tInt:
		num, ok := tok.(json.Number)
		if !ok {
			return wrong()
		}
		if _, err := strconv.ParseInt(string(num), 10, 32); err != nil {
			if _, ferr := strconv.ParseFloat(string(num), 64); ferr == nil && strings.ContainsAny(string(num), ".eE") {
				return s.fail(fmt.Sprintf("must be an integer, not %s", num))
			}
			return s.fail(fmt.Sprintf("%s is out of range", num))
		}
		return nil
	case tArray:
		if tok != json.Delim('[') {
			return wrong()
		}
		for i := 0; s.dec.More(); i++ {
			if n == schema.fields["tasks"] && i >= MaxTasks {
				return s.fail(fmt.Sprintf("more than %d tasks", MaxTasks))
			}
			s.path = append(s.path, "["+strconv.Itoa(i)+"]")
			if err := s.value(n.elem); err != nil {
				return err
			}
			s.path = s.path[:len(s.path)-1]
		}
		_, err := s.token() // ']'
		return err
	case tObject, tMap:
		if tok != json.Delim('{') {
			return wrong()
		}
		isTask := n == schema.fields["tasks"].elem
		if isTask {
			s.names = append(s.names, "")
		}
		seen := map[string]bool{}
		for s.dec.More() {
			kt, err := s.token()
			if err != nil {
				return err
			}
			key := kt.(string) // keys are always strings
			s.path = append(s.path, key)
			if seen[key] {
				return s.fail("appears twice")
			}
			seen[key] = true
			child := n.elem
			if n.typ == tObject {
				child = n.fields[key]
				if child == nil {
					return s.fail("unknown field")
				}
			}
			if isTask && key == "name" {
				// Remember the task's name for later error messages.
				off := s.dec.InputOffset()
				if err := s.value(child); err != nil {
					return err
				}
				var name string
				if json.Unmarshal(bytes.TrimLeft(s.data[off:s.dec.InputOffset()], " \t\r\n:"), &name) == nil && checkTaskName(name) == "" {
					s.names[len(s.names)-1] = name
				}
			} else if err := s.value(child); err != nil {
				return err
			}
			s.path = s.path[:len(s.path)-1]
		}
		_, err := s.token() // '}'
		return err
	}
	return fmt.Errorf("workflow: bad schema")
}
