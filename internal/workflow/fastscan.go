package workflow

import (
	"encoding/json"
	"strconv"

	"github.com/cyclepool/cyclepool/internal/jsonscan"
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
	p := fastScanner{jsonscan.New(data)}
	ok = p.Object(func(key []byte) bool {
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
			return p.Array(func() bool {
				if len(f.Tasks) >= MaxTasks {
					return false
				}
				f.Tasks = append(f.Tasks, taskJSON{})
				return p.task(&f.Tasks[len(f.Tasks)-1])
			})
		}
		return false
	})
	return f, ok && p.Done()
}

func (p fastScanner) task(t *taskJSON) bool {
	return p.Object(func(key []byte) bool {
		switch string(key) {
		case "name":
			return p.string(&t.Name)
		case "module":
			return p.string(&t.Module)
		case "args":
			t.Args = []string{}
			return p.Array(func() bool {
				var a string
				ok := p.string(&a)
				t.Args = append(t.Args, a)
				return ok
			})
		case "inputs":
			t.Inputs = map[string]refJSON{}
			return p.Object(func(file []byte) bool {
				var r refJSON
				ok := p.Object(func(key []byte) bool {
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
			return p.Object(func(key []byte) bool {
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
		case "env":
			t.Env = map[string]string{}
			return p.Object(func(name []byte) bool {
				var v string
				ok := p.string(&v)
				t.Env[string(name)] = v
				return ok
			})
		case "cwd":
			return p.stringPtr(&t.Cwd)
		case "files":
			t.Files = map[string]*fileSourceJSON{}
			return p.Object(func(path []byte) bool {
				f := &fileSourceJSON{}
				t.Files[string(path)] = f
				return p.Object(func(key []byte) bool {
					switch string(key) {
					case "blob":
						return p.stringPtr(&f.Blob)
					case "data":
						return p.stringPtr(&f.Data)
					case "from":
						return p.stringPtr(&f.From)
					case "output":
						return p.stringPtr(&f.Output)
					case "archive":
						return p.boolPtr(&f.Archive)
					case "writable":
						return p.boolPtr(&f.Writable)
					}
					return false
				})
			})
		case "outputs":
			t.Outputs = []string{}
			return p.Array(func() bool {
				var o string
				ok := p.string(&o)
				t.Outputs = append(t.Outputs, o)
				return ok
			})
		case "timeout":
			return p.stringPtr(&t.Timeout)
		case "max_attempts":
			return p.intPtr(&t.MaxAttempts)
		case "limits":
			t.Limits = &limitsJSON{}
			return p.Object(func(key []byte) bool {
				switch string(key) {
				case "memory_mib":
					return p.intPtr(&t.Limits.MemoryMiB)
				case "output_mib":
					return p.intPtr(&t.Limits.OutputMiB)
				case "log_kib":
					return p.intPtr(&t.Limits.LogKiB)
				case "scratch_mib":
					return p.intPtr(&t.Limits.ScratchMiB)
				}
				return false
			})
		case "checkpoint_interval":
			return p.stringPtr(&t.CheckpointInterval)
		}
		return false
	})
}

// fastScanner reads the values of a workflow file for fastDecode.
type fastScanner struct{ *jsonscan.Scanner }

// string consumes a string into v.
func (p fastScanner) string(v *string) bool {
	p.Space()
	start := p.Pos()
	raw, escaped, ok := p.String()
	switch {
	case !ok:
		return false
	case !escaped:
		*v = string(raw)
		return true
	}
	return json.Unmarshal(p.Text(start), v) == nil
}

func (p fastScanner) stringPtr(v **string) bool {
	*v = new(string)
	return p.string(*v)
}

// boolPtr consumes a boolean into v.
func (p fastScanner) boolPtr(v **bool) bool {
	p.Space()
	b, ok := p.Bool()
	*v = &b
	return ok
}

// intPtr consumes an integer of at most 9 digits (which fits in 32 bits).
func (p fastScanner) intPtr(v **int) bool {
	d, ok := p.Integer()
	if !ok || len(d) > 9 && d[0] != '-' || len(d) > 10 {
		return false
	}
	n, err := strconv.Atoi(string(d))
	*v = &n
	return err == nil
}
