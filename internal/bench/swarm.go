package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// SwarmCommand, as the first argument of cyclepool-bench, makes the
// process a swarm of volunteers for the scale part (RunSwarm): one process
// holds at most a few thousand connections, as a machine's file limit
// allows, so the scale part starts several.
const SwarmCommand = "swarm"

// swarm is a process's share of the scale part's volunteers: each holds
// one WebSocket to a replica, says hello as a paused volunteer (a phone on
// battery: connected, heartbeating, given no task), heartbeats at the
// interval its welcome names for such a worker (idle_heartbeat_ms),
// reconnects now and then (churn), and when its replica goes away
// reconnects to another one under the identity it had.
type swarm struct {
	servers []string // ws:// URLs of the replicas' /ws/worker
	header  http.Header
	churn   float64 // share of the volunteers that reconnect every minute

	connected  atomic.Int64 // volunteers with a welcome, now
	reconnects atomic.Int64 // connections made after a volunteer's first
	dialErrors atomic.Int64 // dials or hellos that failed
	dropped    atomic.Int64 // connections the server side ended
	dials      chan struct{}
}

// RunSwarm runs a swarm (the child process of the scale part) until ctx
// ends, printing one `swarm connected=N reconnects=N dial_errors=N
// dropped=N` line a second on out.
func RunSwarm(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(SwarmCommand, flag.ContinueOnError)
	servers := fs.String("servers", "", "comma-separated base URLs of the replicas")
	conns := fs.Int("conns", 1000, "volunteers in this process")
	first := fs.Int("first", 0, "number of the first volunteer: volunteer i starts on replica i modulo their count")
	keyFile := fs.String("key-file", "", "the operator key the volunteers present")
	churn := fs.Float64("churn", 0.01, "share of the volunteers that reconnect every minute")
	if err := fs.Parse(args); err != nil {
		return err
	}
	key, err := os.ReadFile(*keyFile)
	if err != nil {
		return fmt.Errorf("swarm: read the operator key: %w", err)
	}
	s := &swarm{churn: *churn, dials: make(chan struct{}, 64),
		header: http.Header{"Authorization": {"Bearer " + strings.TrimSpace(string(key))}}}
	for _, u := range strings.Split(*servers, ",") {
		s.servers = append(s.servers, "ws"+strings.TrimPrefix(u, "http")+"/ws/worker")
	}
	for i := range *conns {
		go s.volunteer(ctx, *first+i)
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		fmt.Fprintf(out, "swarm connected=%d reconnects=%d dial_errors=%d dropped=%d\n",
			s.connected.Load(), s.reconnects.Load(), s.dialErrors.Load(), s.dropped.Load())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// volunteer is volunteer i, for as long as ctx lasts. It comes back as
// wasmworker.Worker does: to another replica picked at random, after a
// pause in the second half of a backoff that starts at 100 ms and doubles
// while dials fail, up to 5 s.
func (s *swarm) volunteer(ctx context.Context, i int) {
	server := i % len(s.servers)
	var id, token string
	backoff := 100 * time.Millisecond
	for n := 0; ctx.Err() == nil; n++ {
		c, w, err := s.dial(ctx, s.servers[server], id, token)
		if err == nil {
			if n > 0 {
				s.reconnects.Add(1)
			}
			id, token, backoff = w.WorkerID, w.ReconnectToken, 100*time.Millisecond
			s.connected.Add(1)
			every := w.HeartbeatMS
			if w.IdleHeartbeatMS > 0 { // paused and holding nothing, as a worker does
				every = w.IdleHeartbeatMS
			}
			serverGone := s.hold(ctx, c, time.Duration(every)*time.Millisecond)
			s.connected.Add(-1)
			c.CloseNow()
			if !serverGone {
				continue // churn: the volunteer comes back to the same replica
			}
			s.dropped.Add(1)
		} else {
			s.dialErrors.Add(1)
		}
		sleep(ctx, backoff/2+rand.N(backoff/2+1))
		backoff = min(2*backoff, 5*time.Second)
		server = otherServer(server, len(s.servers))
	}
}

// dial connects to url and says hello, resuming identity id when set.
func (s *swarm) dial(ctx context.Context, url, id, token string) (*websocket.Conn, *protocol.Welcome, error) {
	select {
	case s.dials <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	defer func() { <-s.dials }()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{HTTPHeader: s.header})
	if err != nil {
		return nil, nil, err
	}
	c.SetReadLimit(1 << 20)
	hello, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{
		Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1, WorkerID: id, ReconnectToken: token,
		Device: protocol.Device{Paused: true, PausedBecause: "on battery"}}})
	if err == nil {
		err = c.Write(dctx, websocket.MessageText, hello)
	}
	for err == nil {
		var typ websocket.MessageType
		var data []byte
		if typ, data, err = c.Read(dctx); err != nil {
			break
		}
		var f *protocol.Frame
		if f, err = protocol.Decode(data, typ == websocket.MessageBinary); err != nil {
			break
		}
		switch {
		case f.Type == protocol.TypeWelcome && f.Welcome != nil:
			return c, f.Welcome, nil
		case f.Type == protocol.TypeError:
			err = fmt.Errorf("refused: %+v", f.Error)
		}
	}
	c.CloseNow()
	return nil, nil, err
}

// hold heartbeats on c until the server ends it (true), the volunteer
// leaves for a while (churn: false) or ctx ends.
func (s *swarm) hold(ctx context.Context, c *websocket.Conn, every time.Duration) (serverGone bool) {
	if every <= 0 {
		every = 3 * time.Second
	}
	hb, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Running: []protocol.Progress{}}})
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	}()
	// Leaving is a Poisson process of rate churn a minute.
	leave := time.Duration(float64(time.Hour) * 1e6) // never
	if s.churn > 0 {
		leave = time.Duration(rand.ExpFloat64() / s.churn * float64(time.Minute))
	}
	leaveT := time.NewTimer(leave)
	defer leaveT.Stop()
	// Heartbeats start at a random point of the interval, as volunteers
	// that arrived at different times would.
	beat := time.NewTimer(time.Duration(rand.Int64N(int64(every))))
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-gone:
			return true
		case <-leaveT.C:
			return false
		case <-beat.C:
			wctx, cancel := context.WithTimeout(ctx, every)
			err := c.Write(wctx, websocket.MessageText, hb)
			cancel()
			if err != nil {
				return ctx.Err() == nil
			}
			beat.Reset(every)
		}
	}
}

// otherServer picks one of n servers other than i at random (i itself when
// n is 1), as wasmworker.Worker does after a failure.
func otherServer(i, n int) int {
	if n < 2 {
		return i
	}
	return (i + 1 + rand.IntN(n-1)) % n
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
