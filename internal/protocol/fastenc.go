package protocol

import (
	"encoding/json"
	"strconv"
)

// encodeFast writes the JSON header of the most frequent frames, assign,
// result and ack, byte for byte as json.Marshal would, without reflection:
// json.Marshal was 8% of a headless worker's CPU (its results) and 4% of
// the server's (assign and ack frames) in the dispatch benchmark. It knows
// only strings of printable ASCII that encoding/json writes as they are
// (no quote, backslash or HTML character to escape) and frames whose other
// fields are empty; on anything else it reports false and Encode uses
// json.Marshal.
func encodeFast(f *Frame) ([]byte, bool) {
	if f.Hello != nil || f.Welcome != nil || f.Heartbeat != nil || f.Checkpoint != nil || len(f.Fails) > 0 ||
		f.Cancel != nil || f.Error != nil {
		return nil, false
	}
	var n int // the one list that is set
	for _, l := range []int{len(f.Assign), len(f.Results), len(f.Acks)} {
		if l > 0 {
			n++
		}
	}
	if n != 1 || !plain(f.Type) {
		return nil, false
	}

	// About what an item takes, so that buf grows seldom.
	e := fastEncoder{buf: make([]byte, 0, 64+320*(len(f.Assign)+len(f.Results)+len(f.Acks))), ok: true}
	e.raw(`{"t":"`)
	e.raw(f.Type)
	e.raw(`"`)
	switch {
	case len(f.Assign) > 0:
		e.raw(`,"assign":[`)
		for i := range f.Assign {
			if i > 0 {
				e.raw(",")
			}
			e.assign(&f.Assign[i])
		}
	case len(f.Results) > 0:
		e.raw(`,"results":[`)
		for i := range f.Results {
			if i > 0 {
				e.raw(",")
			}
			e.result(&f.Results[i])
		}
	default:
		e.raw(`,"acks":[`)
		for i := range f.Acks {
			if i > 0 {
				e.raw(",")
			}
			e.ack(&f.Acks[i])
		}
	}
	e.raw("]}")
	if !e.ok {
		return nil, false
	}
	return e.buf, true
}

// plain reports whether encoding/json writes s as it is between quotes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// fastEncoder appends JSON to buf; ok turns false at the first string
// that is not plain.
type fastEncoder struct {
	buf []byte
	ok  bool
}

func (e *fastEncoder) raw(s string) { e.buf = append(e.buf, s...) }

func (e *fastEncoder) str(s string) {
	if !plain(s) {
		e.ok = false
	}
	e.buf = append(e.buf, '"')
	e.buf = append(e.buf, s...)
	e.buf = append(e.buf, '"')
}

func (e *fastEncoder) int(key string, v int64) {
	e.raw(key)
	e.buf = strconv.AppendInt(e.buf, v, 10)
}

func (e *fastEncoder) blob(b *Blob) {
	e.raw("{")
	if b.Name != "" {
		e.raw(`"name":`)
		e.str(b.Name)
		e.raw(",")
	}
	e.int(`"size":`, int64(b.Size))
	e.raw("}")
}

func (e *fastEncoder) blobs(key string, bs []Blob) {
	e.raw(key)
	if bs == nil {
		e.raw("null")
		return
	}
	e.raw("[")
	for i := range bs {
		if i > 0 {
			e.raw(",")
		}
		e.blob(&bs[i])
	}
	e.raw("]")
}

func (e *fastEncoder) assign(a *Assign) {
	e.int(`{"attempt":`, a.Attempt)
	e.raw(`,"task":`)
	e.str(a.Task)
	e.raw(`,"module":`)
	e.str(a.Module)
	e.raw(`,"args":`)
	if a.Args == nil {
		e.raw("null")
	} else {
		e.raw("[")
		for i, s := range a.Args {
			if i > 0 {
				e.raw(",")
			}
			e.str(s)
		}
		e.raw("]")
	}
	e.raw(`,"stdin":`)
	e.blob(&a.Stdin)
	e.blobs(`,"inputs":`, a.Inputs)
	e.raw(`,"restore":`)
	e.blob(&a.Restore)
	e.raw(`,"seed":`)
	e.buf = strconv.AppendUint(e.buf, a.Seed, 10)
	e.int(`,"limits":{"memory_pages":`, int64(a.Limits.MemoryPages))
	e.int(`,"wall_ms":`, a.Limits.WallMS)
	e.int(`,"output_bytes":`, a.Limits.OutputBytes)
	e.int(`,"log_bytes":`, a.Limits.LogBytes)
	e.int(`},"ckpt_ms":`, a.CkptMS)
	e.raw(`,"priority":`)
	e.str(a.Priority)
	if a.Setup != nil {
		// Rare, and small next to what it sets up: the standard encoder.
		b, err := json.Marshal(a.Setup)
		if err != nil {
			b = []byte("null")
		}
		e.raw(`,"setup":`)
		e.buf = append(e.buf, b...)
	}
	if a.RestoreFrom != nil {
		b, err := json.Marshal(a.RestoreFrom)
		if err != nil {
			b = []byte("null")
		}
		e.raw(`,"restore_from":`)
		e.buf = append(e.buf, b...)
	}
	e.raw("}")
}

func (e *fastEncoder) result(r *Result) {
	e.int(`{"attempt":`, r.Attempt)
	e.blobs(`,"outputs":`, r.Outputs)
	e.raw(`,"log":`)
	e.blob(&r.Log)
	e.int(`,"duration_ms":`, r.DurationMS)
	if len(r.Uploaded) > 0 {
		e.raw(`,"uploaded":[`)
		for i := range r.Uploaded {
			u := &r.Uploaded[i]
			if i > 0 {
				e.raw(",")
			}
			e.raw(`{"name":`)
			e.str(u.Name)
			e.raw(`,"blob":`)
			e.str(u.Blob)
			e.int(`,"size":`, u.Size)
			e.raw("}")
		}
		e.raw("]")
	}
	e.raw("}")
}

func (e *fastEncoder) ack(a *Ack) {
	e.int(`{"attempt":`, a.Attempt)
	e.raw(`,"of":`)
	e.str(a.Of)
	if a.Seq != 0 {
		e.int(`,"seq":`, int64(a.Seq))
	}
	e.raw(`,"ok":`)
	e.buf = strconv.AppendBool(e.buf, a.OK)
	if a.Retry {
		e.raw(`,"retry":true`)
	}
	if a.Error != "" {
		e.raw(`,"error":`)
		e.str(a.Error)
	}
	e.raw("}")
}
