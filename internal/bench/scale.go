package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
)

// scaleReplicas is the number of replicas of the scale part: with one
// killed, the others take its volunteers and each holds half as many
// again, under the file limit of one process.
const scaleReplicas = 3

// swarmConns is the most volunteers one swarm process holds.
const swarmConns = 6000

// scaleRun is the state of one run of the scale part.
type scaleRun struct {
	b        *bench
	replicas []*process
	urls     []string
	swarms   []*process

	mu        sync.Mutex
	connected map[int]int64 // by swarm
	reconns   map[int]int64
	dropped   map[int]int64
}

// scale holds cfg.ScaleConns paused volunteers on three replicas of one
// PostgreSQL, heartbeating and reconnecting now and then, while a stream
// of small workflows runs on two headless workers; then it kills one
// replica and times its volunteers' return to the others.
func (b *bench) scale(ctx context.Context, dbURL string) error {
	r := &scaleRun{b: b, connected: map[int]int64{}, reconns: map[int]int64{}, dropped: map[int]int64{}}
	defer r.stop()
	r.replicas, r.urls = []*process{b.server}, []string{b.url}
	key, err := os.ReadFile(filepath.Join(b.tmp, "srv", "worker.key"))
	if err != nil {
		return fmt.Errorf("read the server's operator key: %w", err)
	}
	for i := 1; i < scaleReplicas; i++ {
		if err := r.startReplica(ctx, dbURL, i, strings.TrimSpace(string(key))); err != nil {
			return err
		}
	}
	time.Sleep(2 * time.Second)
	rssBefore, err := r.replicaRSS()
	if err != nil {
		return err
	}

	// The volunteers arrive.
	t0 := time.Now()
	for first := 0; first < b.cfg.ScaleConns; first += swarmConns {
		if err := r.startSwarm(first, min(swarmConns, b.cfg.ScaleConns-first)); err != nil {
			return err
		}
	}
	if err := r.waitConnected(ctx, b.cfg.ScaleConns, 10*time.Minute); err != nil {
		return err
	}
	arrival := time.Since(t0)
	b.printf("scale_conns: %d", r.totals().connected)
	b.printf("scale_arrival_s: %.1f", arrival.Seconds())
	b.printf("scale_arrivals_per_s: %.0f", float64(b.cfg.ScaleConns)/arrival.Seconds())

	// Idle: the volunteers only heartbeat (and a few reconnect).
	time.Sleep(10 * time.Second)
	cpu0, reconn0, w0 := cpuByChild(), r.totals().reconnects, time.Now()
	time.Sleep(30 * time.Second)
	cpu1, reconn1, window := cpuByChild(), r.totals().reconnects, time.Since(w0)
	rssAfter, err := r.replicaRSS()
	if err != nil {
		return err
	}
	k := float64(b.cfg.ScaleConns) / 1000
	perS := func(d time.Duration) float64 { return float64(d.Milliseconds()) / window.Seconds() / k }
	b.printf("scale_server_rss_kib_per_conn: %.1f", float64(rssAfter-rssBefore)/float64(b.cfg.ScaleConns))
	b.printf("scale_pg_cpu_ms_per_s_per_1000_workers: %.2f", perS(r.pgCPU(cpu1)-r.pgCPU(cpu0)))
	b.printf("scale_server_cpu_ms_per_s_per_1000_workers: %.2f", perS(r.replicaCPU(cpu1)-r.replicaCPU(cpu0)))
	b.printf("scale_churn_reconnects_per_min: %.0f", float64(reconn1-reconn0)/window.Minutes())

	// A stream of small workflows on two headless workers, through every
	// replica; one worker starts on the replica that is killed below.
	for i := range 2 {
		servers := strings.Join([]string{r.urls[(scaleReplicas-1+i)%scaleReplicas], r.urls[i%scaleReplicas], r.urls[(i+1)%scaleReplicas]}, ",")
		if _, err := b.startWorkerArgs(fmt.Sprintf("scale-worker-%d", i), "--server", servers, "--slots", "4"); err != nil {
			return err
		}
	}
	sctx, stopStream := context.WithCancel(ctx)
	var ids []string
	var streamErr error
	streamDone := make(chan struct{})
	go func() {
		defer close(streamDone)
		ids, streamErr = r.stream(sctx)
	}()
	time.Sleep(30 * time.Second)

	// A replica dies: its volunteers go to the others.
	before := r.totals()
	victim := r.replicas[scaleReplicas-1]
	t1 := time.Now()
	victim.kill()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		tot := r.totals()
		if tot.dropped-before.dropped > 0 && tot.connected >= int64(b.cfg.ScaleConns) {
			break
		}
	}
	back := time.Since(t1)
	after := r.totals()
	movedConns := after.dropped - before.dropped
	b.printf("scale_failover_moved_conns: %d", movedConns)
	b.printf("scale_failover_reconnect_s: %.1f", back.Seconds())
	b.printf("scale_reconnects_per_s: %.0f", float64(movedConns)/back.Seconds())
	if after.connected < int64(b.cfg.ScaleConns) {
		b.printf("scale_failover: error: %d of %d volunteers connected 2 minutes after the replica died", after.connected, b.cfg.ScaleConns)
	}
	time.Sleep(10 * time.Second)
	stopStream()
	<-streamDone
	if streamErr != nil {
		return streamErr
	}
	return r.streamFigures(ctx, ids, t1)
}

// startReplica starts replica i of the scale part on the database.
func (r *scaleRun) startReplica(ctx context.Context, db string, i int, key string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	p, err := r.b.spawn([]string{"serve", "--addr", fmt.Sprintf("127.0.0.1:%d", port), "--database-url", db,
		"--data-dir", filepath.Join(r.b.tmp, fmt.Sprintf("srv%d", i)), "--log-level", "warn", "--replica", fmt.Sprintf("replica-%d", i),
		"--worker-key", key, "--procs", "1"}, nil)
	if err != nil {
		return err
	}
	r.replicas, r.urls = append(r.replicas, p), append(r.urls, url)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("replica %d exited at start", i)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
	}
	return fmt.Errorf("replica %d was not ready within a minute", i)
}

var swarmRE = regexp.MustCompile(`^swarm connected=(\d+) reconnects=(\d+) dial_errors=(\d+) dropped=(\d+)$`)

// startSwarm starts a swarm process of n volunteers numbered from first.
func (r *scaleRun) startSwarm(first, n int) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, SwarmCommand, "--servers", strings.Join(r.urls, ","), "--conns", strconv.Itoa(n),
		"--first", strconv.Itoa(first), "--key-file", filepath.Join(r.b.tmp, "srv", "worker.key"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start a swarm: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	r.swarms = append(r.swarms, p)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			m := swarmRE.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			c, _ := strconv.ParseInt(m[1], 10, 64)
			rc, _ := strconv.ParseInt(m[2], 10, 64)
			d, _ := strconv.ParseInt(m[4], 10, 64)
			r.mu.Lock()
			r.connected[first], r.reconns[first], r.dropped[first] = c, rc, d
			r.mu.Unlock()
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	return nil
}

// swarmTotals adds up the swarms' latest reports.
type swarmTotals struct{ connected, reconnects, dropped int64 }

func (r *scaleRun) totals() swarmTotals {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t swarmTotals
	for k, c := range r.connected {
		t.connected += c
		t.reconnects += r.reconns[k]
		t.dropped += r.dropped[k]
	}
	return t
}

func (r *scaleRun) waitConnected(ctx context.Context, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if r.totals().connected >= int64(n) {
			return nil
		}
		for _, s := range r.swarms {
			select {
			case <-s.done:
				return errors.New("a swarm process exited")
			default:
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%d of %d volunteers connected after %v", r.totals().connected, n, limit)
}

// replicaRSS is the resident memory of the live replicas, in KiB.
func (r *scaleRun) replicaRSS() (int64, error) {
	var sum int64
	for _, p := range r.replicas {
		kib, err := rssKiB(p.cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		sum += kib
	}
	return sum, nil
}

// replicaCPU is the CPU time of the replicas in a cpuByChild reading.
func (r *scaleRun) replicaCPU(by map[int]time.Duration) time.Duration {
	var d time.Duration
	for _, p := range r.replicas {
		d += by[p.cmd.Process.Pid]
	}
	return d
}

// pgCPU is PostgreSQL's CPU time in a cpuByChild reading: the child that
// is neither a replica, a worker nor a swarm.
func (r *scaleRun) pgCPU(by map[int]time.Duration) time.Duration {
	known := map[int]bool{os.Getpid(): true}
	for _, ps := range [][]*process{r.replicas, r.swarms, r.b.workers} {
		for _, p := range ps {
			known[p.cmd.Process.Pid] = true
		}
	}
	var d time.Duration
	for pid, c := range by {
		if pid > 0 && !known[pid] {
			d += c
		}
	}
	return d
}

// stream submits a two-task chain workflow every 50 ms, round robin over
// the live replicas, until ctx ends, and returns the ids submitted.
func (r *scaleRun) stream(ctx context.Context) ([]string, error) {
	wf, _ := json.Marshal(map[string]any{"name": "scale-chain", "priority": "interactive", "tasks": []map[string]any{
		{"name": "a", "module": r.b.noop},
		{"name": "b", "module": r.b.noop, "inputs": map[string]any{"in": map[string]any{"from": "a"}}},
	}})
	var ids []string
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return ids, nil
		case <-t.C:
		}
		// The last replica dies during the stream: submissions go to the
		// others, as a load balancer would send them.
		c := client.New(r.urls[i%(scaleReplicas-1)], r.b.ownerToken)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		sub, err := c.Submit(sctx, wf)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ids, nil
			}
			return ids, fmt.Errorf("submit to the stream: %w", err)
		}
		ids = append(ids, sub.ID)
	}
}

// streamFigures waits for the stream's workflows and reports how long
// their second tasks waited from ready to running, before and after the
// failover at t, and whether any task ran more than once.
func (r *scaleRun) streamFigures(ctx context.Context, ids []string, failover time.Time) error {
	for _, id := range ids {
		if err := r.b.waitDone(ctx, id, 2*time.Minute); err != nil {
			return fmt.Errorf("a workflow of the stream: %w", err)
		}
	}
	rows, err := r.b.db.Query(ctx, `SELECT extract(epoch FROM a.started_at - (t.sort_key + interval '5 minutes')), a.started_at < $2
		FROM tasks t JOIN attempts a ON a.task_id = t.id WHERE t.workflow_id = ANY($1::uuid[]) AND t.name = 'b'`, ids, failover)
	if err != nil {
		return err
	}
	var steady, all []time.Duration
	for rows.Next() {
		var s float64
		var beforeFailover bool
		if err := rows.Scan(&s, &beforeFailover); err != nil {
			rows.Close()
			return err
		}
		d := time.Duration(s * float64(time.Second))
		all = append(all, d)
		if beforeFailover {
			steady = append(steady, d)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	r.b.printf("scale_stream_workflows: %d", len(ids))
	r.b.printf("scale_ready_to_running_p50_ms: %.2f", ms(percentile(steady, 50)))
	r.b.printf("scale_ready_to_running_p99_ms: %.2f", ms(percentile(steady, 99)))
	r.b.printf("scale_ready_to_running_failover_p99_ms: %.2f", ms(percentile(all, 99)))
	// An attempt that ended as never started (its reason ends "queued
	// again": the worker left or fell silent with it queued, its frame
	// never reached the worker, or it was refused for coming after a
	// newer one) did not run: it is counted apart.
	var twice, unstarted int
	if err := r.b.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE ran > 1), coalesce(sum(attempts - ran), 0) FROM (
		SELECT a.task_id, count(*) AS attempts, count(*) FILTER (WHERE NOT (a.state = 'lost' AND a.reason LIKE '%queued again')) AS ran
		FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = ANY($1::uuid[]) GROUP BY a.task_id) x`,
		ids).Scan(&twice, &unstarted); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	r.b.printf("scale_tasks_run_twice: %d", twice)
	r.b.printf("scale_attempts_never_started: %d", unstarted)
	if twice > 0 {
		// Why: every attempt of those tasks, for a reader to tell a task
		// that ran twice from one whose first attempt never started.
		rows, err := r.b.db.Query(ctx, `SELECT a.task_id, a.id, a.state, a.reason FROM attempts a
			WHERE a.task_id IN (SELECT a.task_id FROM attempts a JOIN tasks t ON t.id = a.task_id
				WHERE t.workflow_id = ANY($1::uuid[]) GROUP BY a.task_id
				HAVING count(*) FILTER (WHERE NOT (a.state = 'lost' AND a.reason LIKE '%queued again')) > 1 LIMIT 5)
			ORDER BY a.task_id, a.id`, ids)
		if err != nil {
			return err
		}
		for rows.Next() {
			var task, attempt int64
			var state, reason string
			if err := rows.Scan(&task, &attempt, &state, &reason); err != nil {
				rows.Close()
				return err
			}
			r.b.printf("scale_tasks_run_twice_attempt: task %d attempt %d %s %q", task, attempt, state, reason)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// stop ends the swarms and the replicas the scale part started (the
// first replica is the benchmark's own server, which Run stops).
func (r *scaleRun) stop() {
	for _, s := range r.swarms {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, s := range r.swarms {
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	for _, w := range r.b.workers {
		w.stop()
	}
	for _, p := range r.replicas[min(1, len(r.replicas)):] {
		p.stop()
	}
}
