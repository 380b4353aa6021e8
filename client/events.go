package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// maxEventLine bounds one line of the event stream (a status event of a large
// workflow is one long data line).
const maxEventLine = 64 << 20

// eventReader parses a Server-Sent Events stream as the WHATWG HTML standard
// describes it: lines end with CRLF, LF or CR; a blank line dispatches the
// event; lines starting with ':' are comments; "field: value" loses one
// space after the colon; several data lines are joined with "\n"; an event
// cut off by the end of the stream is dropped.
type eventReader struct {
	r         *bufio.Reader
	skipLF    bool // the previous line ended with CR: a leading LF belongs to it
	first     bool
	lastID    string
	eventType string
	data      bytes.Buffer
	hasData   bool
}

func newEventReader(r io.Reader) *eventReader {
	return &eventReader{r: bufio.NewReaderSize(r, 64<<10), first: true}
}

// readLine returns the next line without its terminator.
func (er *eventReader) readLine() ([]byte, error) {
	var line []byte
	for {
		b, err := er.r.ReadByte()
		if err != nil {
			if err == io.EOF && len(line) > 0 {
				// A line cut off by the end of the stream: the event it
				// belongs to cannot be complete, so it is dropped anyway.
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if er.skipLF {
			er.skipLF = false
			if b == '\n' {
				continue
			}
		}
		switch b {
		case '\n':
			return line, nil
		case '\r':
			er.skipLF = true
			return line, nil
		}
		if len(line) >= maxEventLine {
			return nil, fmt.Errorf("event stream line longer than %d bytes", maxEventLine)
		}
		line = append(line, b)
	}
}

// next returns the next dispatched event. At the end of the stream it returns
// io.EOF (or io.ErrUnexpectedEOF when the stream ended inside an event).
func (er *eventReader) next() (Event, error) {
	for {
		line, err := er.readLine()
		if err != nil {
			if err == io.EOF && (er.hasData || er.eventType != "") {
				err = io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		if er.first {
			er.first = false
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		if len(line) == 0 {
			if !er.hasData {
				er.eventType = ""
				continue
			}
			ev := Event{Type: er.eventType, ID: er.lastID, Data: bytes.Clone(er.data.Bytes())}
			if ev.Type == "" {
				ev.Type = "message"
			}
			er.eventType, er.hasData = "", false
			er.data.Reset()
			return ev, nil
		}
		if line[0] == ':' {
			continue // comment, often a keep-alive
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		switch string(field) {
		case "event":
			er.eventType = string(value)
		case "data":
			if er.hasData {
				er.data.WriteByte('\n')
			}
			er.data.Write(value)
			er.hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				er.lastID = string(value)
			}
		case "retry":
			// The reconnection delay is ours to choose (see Watch).
		}
	}
}

// stream opens a workflow's event stream and calls fn for every event until
// the stream ends (nil), fn returns an error (that error), or the stream
// breaks (the error).
func (c *Client) stream(ctx context.Context, id string, fn func(Event) error) error {
	resp, err := c.do(ctx, http.MethodGet, pathOf("workflows", id, "events"), nil, "", "text/event-stream")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	er := newEventReader(resp.Body)
	for {
		ev, err := er.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read event stream: %w", err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// Events follows a workflow's event stream. The first event is a "status"
// event holding the whole status object, then one "task" or "workflow" event
// per change (apply them with Status.Apply). The event channel is closed when
// the stream ends: after the "workflow" event of a finished workflow, when
// the connection breaks, or when ctx is done. The error channel then yields
// exactly one value, nil for a stream the server ended, and is closed.
// Events does not reconnect; Watch and Wait do.
func (c *Client) Events(ctx context.Context, id string) (<-chan Event, <-chan error) {
	events := make(chan Event)
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		defer close(events)
		err := c.stream(ctx, id, func(ev Event) error {
			select {
			case events <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil {
			err = fmt.Errorf("events of workflow %s: %w", id, err)
		}
		errc <- err
	}()
	return events, errc
}

// errStopWatch ends a stream from inside its callback.
var errStopWatch = errors.New("stop")
