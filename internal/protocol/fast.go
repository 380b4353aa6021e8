package protocol

import (
	"strconv"

	"github.com/cyclepool/cyclepool/internal/jsonscan"
)

// decodeFast parses the JSON header of the most frequent frames, assign,
// ack and result, as encoding/json would, several times faster (it matters
// most in the browser worker, where Go runs as WebAssembly and
// encoding/json's byte-by-byte scanner costs more than the rest of an
// attempt's handling; in the server, decoding results took 13% of its CPU
// in the dispatch benchmark).
// It knows only the form json.Marshal writes: exact field names, strings
// of printable ASCII without escapes, integers without fraction or
// exponent, null only for lists. On anything else it reports false and
// Decode uses encoding/json, which then decides (and words any error).
func decodeFast(hdr []byte) (*Frame, bool) {
	p := fastParser{jsonscan.New(hdr)}
	f := new(Frame)
	ok := p.Object(func(key []byte) bool {
		switch string(key) {
		case "t":
			s, ok := p.str()
			f.Type = s
			return ok
		case "assign":
			f.Assign = []Assign{}
			var last repeated
			ok, null := p.list(func() bool {
				f.Assign = append(f.Assign, Assign{})
				return p.assign(&f.Assign[len(f.Assign)-1], &last)
			})
			if null {
				f.Assign = nil
			}
			return ok
		case "results":
			f.Results = []Result{}
			ok, null := p.list(func() bool {
				f.Results = append(f.Results, Result{})
				return p.result(&f.Results[len(f.Results)-1])
			})
			if null {
				f.Results = nil
			}
			return ok
		case "acks":
			f.Acks = []Ack{}
			ok, null := p.list(func() bool {
				f.Acks = append(f.Acks, Ack{})
				return p.ack(&f.Acks[len(f.Acks)-1])
			})
			if null {
				f.Acks = nil
			}
			return ok
		case "heartbeat":
			if p.Null() {
				f.Heartbeat = nil
				return true
			}
			f.Heartbeat = &Heartbeat{}
			return p.heartbeat(f.Heartbeat)
		}
		return false
	})
	if !ok || !p.Done() || (f.Type != TypeAssign && f.Type != TypeAck && f.Type != TypeResult && f.Type != TypeHeartbeat) {
		return nil, false
	}
	return f, true
}

// fastParser reads the subset of JSON that decodeFast accepts.
type fastParser struct{ *jsonscan.Scanner }

// repeated is the last value of fields that repeat from one element of a
// list to the next (an assign frame's modules and priorities), whose
// string is then reused rather than allocated again.
type repeated struct{ module, priority string }

// ascii reads a string of printable ASCII without escapes, as the bytes
// of the frame.
func (p fastParser) ascii() ([]byte, bool) {
	raw, escaped, ok := p.String()
	if !ok || escaped {
		return nil, false
	}
	for _, c := range raw {
		if c >= 0x7f {
			return nil, false
		}
	}
	return raw, true
}

// str reads a string of printable ASCII without escapes.
func (p fastParser) str() (string, bool) {
	raw, ok := p.ascii()
	return string(raw), ok
}

// strAs is str, returning *last when the string equals it, else keeping
// the new string in *last.
func (p fastParser) strAs(last *string) (string, bool) {
	raw, ok := p.ascii()
	if !ok {
		return "", false
	}
	if string(raw) != *last {
		*last = string(raw)
	}
	return *last, true
}

func (p fastParser) int64() (int64, bool) {
	d, ok := p.Integer()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(d), 10, 64)
	return v, err == nil
}

func (p fastParser) uint(bits int) (uint64, bool) {
	d, ok := p.Integer()
	if !ok || d[0] == '-' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(d), 10, bits)
	return v, err == nil
}

func (p fastParser) float64() (float64, bool) {
	d, ok := p.Number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(d), 64)
	return v, err == nil
}

// floatPtr reads a number, or null (nil), into *v.
func (p fastParser) floatPtr(v **float64) bool {
	if p.Null() {
		*v = nil
		return true
	}
	x, ok := p.float64()
	*v = &x
	return ok
}

func (p fastParser) int() (int, bool) {
	v, ok := p.int64()
	return int(v), ok && int64(int(v)) == v
}

// list reads an array, calling item for each element, or null.
func (p fastParser) list(item func() bool) (ok, null bool) {
	if p.Null() {
		return true, true
	}
	return p.Array(item), false
}

func (p fastParser) blob(b *Blob) bool {
	return p.Object(func(key []byte) bool {
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

func (p fastParser) assign(a *Assign, last *repeated) bool {
	return p.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "attempt":
			a.Attempt, ok = p.int64()
		case "task":
			a.Task, ok = p.str()
		case "module":
			a.Module, ok = p.strAs(&last.module)
		case "args":
			a.Args = []string{}
			var null bool
			ok, null = p.list(func() bool {
				s, ok := p.str()
				a.Args = append(a.Args, s)
				return ok
			})
			if null {
				a.Args = nil
			}
		case "stdin":
			ok = p.blob(&a.Stdin)
		case "inputs":
			a.Inputs = []Blob{}
			var null bool
			ok, null = p.list(func() bool {
				a.Inputs = append(a.Inputs, Blob{})
				return p.blob(&a.Inputs[len(a.Inputs)-1])
			})
			if null {
				a.Inputs = nil
			}
		case "restore":
			ok = p.blob(&a.Restore)
		case "seed":
			a.Seed, ok = p.uint(64)
		case "limits":
			ok = p.Object(func(key []byte) bool {
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
			a.Priority, ok = p.strAs(&last.priority)
		}
		return ok
	})
}

func (p fastParser) ack(a *Ack) bool {
	return p.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "attempt":
			a.Attempt, ok = p.int64()
		case "of":
			a.Of, ok = p.str()
		case "seq":
			a.Seq, ok = p.int()
		case "ok":
			a.OK, ok = p.Bool()
		case "retry":
			a.Retry, ok = p.Bool()
		case "error":
			a.Error, ok = p.str()
		}
		return ok
	})
}

func (p fastParser) result(r *Result) bool {
	return p.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "attempt":
			r.Attempt, ok = p.int64()
		case "outputs":
			r.Outputs = []Blob{}
			var null bool
			ok, null = p.list(func() bool {
				r.Outputs = append(r.Outputs, Blob{})
				return p.blob(&r.Outputs[len(r.Outputs)-1])
			})
			if null {
				r.Outputs = nil
			}
		case "log":
			ok = p.blob(&r.Log)
		case "duration_ms":
			r.DurationMS, ok = p.int64()
		case "uploaded":
			r.Uploaded = []Uploaded{}
			var null bool
			ok, null = p.list(func() bool {
				r.Uploaded = append(r.Uploaded, Uploaded{})
				u := &r.Uploaded[len(r.Uploaded)-1]
				return p.Object(func(key []byte) bool {
					var ok bool
					switch string(key) {
					case "name":
						u.Name, ok = p.str()
					case "blob":
						u.Blob, ok = p.str()
					case "size":
						u.Size, ok = p.int64()
					}
					return ok
				})
			})
			if null {
				r.Uploaded = nil
			}
		}
		return ok
	})
}

// heartbeat reads a heartbeat, which every worker sends every few seconds:
// the frame a replica decodes most with many volunteers connected.
func (p fastParser) heartbeat(h *Heartbeat) bool {
	return p.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "running":
			h.Running = []Progress{}
			var null bool
			ok, null = p.list(func() bool {
				h.Running = append(h.Running, Progress{})
				pr := &h.Running[len(h.Running)-1]
				return p.Object(func(key []byte) bool {
					var ok bool
					switch string(key) {
					case "attempt":
						pr.Attempt, ok = p.int64()
					case "fraction":
						pr.Fraction, ok = p.float64()
					}
					return ok
				})
			})
			if null {
				h.Running = nil
			}
		case "free":
			h.Free, ok = p.int()
		case "queue":
			if p.Null() {
				h.Queue, ok = nil, true
				break
			}
			var q int
			q, ok = p.int()
			h.Queue = &q
		case "device":
			if p.Null() {
				h.Device, ok = nil, true
				break
			}
			h.Device = &Device{}
			ok = p.device(h.Device)
		}
		return ok
	})
}

func (p fastParser) device(d *Device) bool {
	return p.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "battery":
			ok = p.floatPtr(&d.Battery)
		case "charging":
			d.Charging, ok = p.str()
		case "connection":
			d.Connection, ok = p.str()
		case "downlink_mbps":
			ok = p.floatPtr(&d.DownlinkMbps)
		case "rtt_ms":
			ok = p.floatPtr(&d.RTTMillis)
		case "save_data":
			d.SaveData, ok = p.str()
		case "online":
			d.Online, ok = p.str()
		case "visibility":
			d.Visibility, ok = p.str()
		case "cores":
			d.Cores, ok = p.int()
		case "memory_gib":
			ok = p.floatPtr(&d.MemoryGiB)
		case "user_agent":
			d.UserAgent, ok = p.str()
		case "paused":
			d.Paused, ok = p.Bool()
		case "paused_because":
			d.PausedBecause, ok = p.str()
		}
		return ok
	})
}
