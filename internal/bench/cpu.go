package bench

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux the benchmark runs on).
const clockTick = 10 * time.Millisecond

// cpuShare is the CPU time (user plus system) used by the benchmark's
// processes, by role: the server, the worker parents, their slot processes,
// PostgreSQL (the postmaster and its backends), Chromium (every process of
// the browser part's Chromium) and the benchmark itself (the submission
// request and the polling).
type cpuShare struct {
	server, workers, slots, postgres, browser, bench time.Duration
}

func (c cpuShare) total() time.Duration {
	return c.server + c.workers + c.slots + c.postgres + c.browser + c.bench
}

func (c cpuShare) sub(o cpuShare) cpuShare {
	return cpuShare{c.server - o.server, c.workers - o.workers, c.slots - o.slots, c.postgres - o.postgres,
		c.browser - o.browser, c.bench - o.bench}
}

// procStat is what cpuNow reads of one process.
type procStat struct {
	ppid int
	cpu  time.Duration
}

// readProcStat reads the parent and the CPU time of a process.
func readProcStat(pid int) (procStat, bool) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(data[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
	st, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return procStat{ppid: ppid, cpu: time.Duration(ut+st) * clockTick}, true
}

// cpuByChild adds up the CPU time of this process's descendants by the
// child of this process they descend from (this process itself under its
// own pid). A process that exited between two readings takes its CPU time
// with it, so compare readings taken while the same processes live.
func cpuByChild() map[int]time.Duration {
	procs := map[int]procStat{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readProcStat(pid); ok {
			procs[pid] = st
		}
	}
	self := os.Getpid()
	by := map[int]time.Duration{}
	for pid, st := range procs {
		if pid == self {
			by[self] += st.cpu
			continue
		}
		// Walk up to the child of this process that pid descends from.
		top := pid
		for n := 0; n < 64 && procs[top].ppid != self; n++ {
			p, ok := procs[top]
			if !ok || p.ppid <= 1 {
				top = 0
				break
			}
			top = p.ppid
		}
		if top != 0 {
			if top != pid {
				by[-top] += st.cpu // descendants of top, apart from top itself
			}
			by[top] += st.cpu
		}
	}
	return by
}

// cpuNow adds up the CPU time of this process's descendants by role
// (slot processes that ran no-op tasks live through a run, so readings
// compare).
func (b *bench) cpuNow() cpuShare {
	by := cpuByChild()
	self := os.Getpid()
	roles := map[int]bool{self: true, b.browserPID: true}
	var c cpuShare
	c.bench = by[self]
	c.browser = by[b.browserPID]
	if b.server != nil {
		pid := b.server.cmd.Process.Pid
		c.server, roles[pid] = by[pid], true
	}
	for _, w := range b.workers {
		pid := w.cmd.Process.Pid
		c.workers += by[pid] - by[-pid]
		c.slots += by[-pid]
		roles[pid] = true
	}
	for pid, d := range by {
		if pid > 0 && !roles[pid] {
			c.postgres += d // PostgreSQL is the benchmark's only other child
		}
	}
	return c
}

// printCPU prints the CPU time per task of a part, by role, in µs.
func (b *bench) printCPU(part string, d cpuShare, tasks int, wall time.Duration) {
	per := func(x time.Duration) float64 { return float64(x.Microseconds()) / float64(tasks) }
	b.printf("%s_cpu_us_per_task: %.0f", part, per(d.total()))
	b.printf("%s_cpu_us_per_task_server: %.0f", part, per(d.server))
	b.printf("%s_cpu_us_per_task_workers: %.0f", part, per(d.workers))
	b.printf("%s_cpu_us_per_task_slots: %.0f", part, per(d.slots))
	b.printf("%s_cpu_us_per_task_postgres: %.0f", part, per(d.postgres))
	if d.browser > 0 {
		b.printf("%s_cpu_us_per_task_chromium: %.0f", part, per(d.browser))
	}
	b.printf("%s_cpu_us_per_task_bench: %.0f", part, per(d.bench))
	b.printf("%s_cpu_cores: %.2f", part, float64(d.total())/float64(wall))
}

// batchStats reads the server's database batch counters (Prometheus text at
// /metrics): per operation, the number of batches, the items in them and
// the seconds they took.
func (b *bench) batchStats(ctx context.Context) map[string][3]float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string][3]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	re := regexp.MustCompile(`^cyclepool_db_batch_(size|seconds)_(sum|count)\{op="(\w+)"\} (\S+)$`)
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[4], 64)
		s := out[m[3]]
		switch {
		case m[1] == "size" && m[2] == "count":
			s[0] = v
		case m[1] == "size":
			s[1] = v
		case m[2] == "sum":
			s[2] = v
		}
		out[m[3]] = s
	}
	return out
}

// printBatches prints the mean size and duration of the server's database
// batches between two readings.
func (b *bench) printBatches(part string, before, after map[string][3]float64) {
	for _, op := range []string{"submission", "claim", "complete", "renew"} {
		n := after[op][0] - before[op][0]
		if n <= 0 {
			continue
		}
		b.printf("%s_%s_batches: %.0f", part, op, n)
		b.printf("%s_%s_batch_mean_size: %.1f", part, op, (after[op][1]-before[op][1])/n)
		b.printf("%s_%s_batch_mean_ms: %.2f", part, op, 1000*(after[op][2]-before[op][2])/n)
	}
}

// threadStat is the name and CPU time of one thread.
type threadStat struct {
	name string
	cpu  time.Duration
}

// threadCPU reads the CPU time of every thread of pid and of its
// descendants, by thread id (Chromium names its threads: the Web Workers'
// are "DedicatedWorker thread", the page's "CrRendererMain").
func threadCPU(pid int) map[int]threadStat {
	out := map[int]threadStat{}
	kids := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readProcStat(p); ok {
			kids[st.ppid] = append(kids[st.ppid], p)
		}
	}
	for todo := []int{pid}; len(todo) > 0; {
		p := todo[0]
		todo = append(todo[1:], kids[p]...)
		tasks, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(p), "task"))
		for _, t := range tasks {
			data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "task", t.Name(), "stat"))
			if err != nil {
				continue
			}
			i, j := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
			if i < 0 || j < i {
				continue
			}
			f := bytes.Fields(data[j+1:])
			if len(f) < 13 {
				continue
			}
			ut, _ := strconv.ParseInt(string(f[11]), 10, 64)
			st, _ := strconv.ParseInt(string(f[12]), 10, 64)
			tid, _ := strconv.Atoi(t.Name())
			out[tid] = threadStat{string(data[i+1 : j]), time.Duration(ut+st) * clockTick}
		}
	}
	return out
}
