package server

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are this replica's Prometheus metrics, in a registry of its own.
type metrics struct {
	reg            *prometheus.Registry
	dispatched     prometheus.Counter
	rounds         *prometheus.CounterVec
	completions    *prometheus.CounterVec
	checkpoints    prometheus.Counter
	leaseExpiries  prometheus.Counter
	leaseGraces    prometheus.Counter
	workerConnects *prometheus.CounterVec
	badFrames      prometheus.Counter
	silenceCloses  prometheus.Counter
	handBackHolds  prometheus.Counter
	uploadedBytes  prometheus.Counter
	uploadSeconds  prometheus.Counter
	leader         prometheus.Gauge
	hellosWaiting  prometheus.Gauge
	batchSize      *prometheus.HistogramVec
	batchSeconds   *prometheus.HistogramVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		dispatched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_tasks_dispatched_total", Help: "Task attempts assigned to workers by this replica."}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cyclepool_dispatch_rounds_total", Help: "Dispatcher wake-ups, by outcome: run (a round read the ready tasks), submission (a small submission claimed its own ready tasks for idle slots in its transaction), skipped (slots came free, but the last round had left no ready task)."}, []string{"outcome"}),
		completions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cyclepool_attempt_completions_total", Help: "Attempt results and failures received, by outcome (succeeded, failed, refused)."}, []string{"outcome"}),
		checkpoints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_checkpoints_total", Help: "Checkpoints saved."}),
		leaseExpiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_lease_expiries_total", Help: "Attempts lost because their lease lapsed (counted by the maintenance leader)."}),
		leaseGraces: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_lease_graces_total", Help: "Sweeps of the lease reaper that came after a gap (no replica could sweep: the database could not write, every replica was down, the leader changed) and renewed every running attempt's lease instead of expiring any (counted by the maintenance leader)."}),
		workerConnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cyclepool_worker_connections_total", Help: "Worker connections accepted, by kind."}, []string{"kind"}),
		badFrames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_bad_frames_total", Help: "Malformed or forbidden worker frames (each closed its socket)."}),
		silenceCloses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_worker_silence_closes_total", Help: "Worker connections closed because the worker sent nothing for the silence limit (a frozen tab, a phone off the network)."}),
		handBackHolds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_hand_back_holds_total", Help: "Times a volunteer handed back attempts faster than its budget and got no new work for a while."}),
		uploadedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_output_upload_bytes_total", Help: "Bytes of outputs workers uploaded over HTTP and the server stored."}),
		uploadSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cyclepool_output_upload_seconds_total", Help: "Time spent receiving the output uploads that were stored."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cyclepool_maintenance_leader", Help: "1 when this replica runs the maintenance (lease reaper)."}),
		hellosWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cyclepool_hellos_waiting", Help: "Worker hellos waiting for their registration in the database (a storm of reconnections shows here)."}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cyclepool_db_batch_size", Help: "Items per database batch, by operation (claim, renew, complete, submission, hello).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12)}, []string{"op"}),
		batchSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cyclepool_db_batch_seconds", Help: "Latency of database batches, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"op"}),
	}
	for _, outcome := range []string{"run", "submission", "skipped"} {
		m.rounds.WithLabelValues(outcome) // every outcome shows, 0 until it happens
	}
	m.reg.MustRegister(m.dispatched, m.rounds, m.completions, m.checkpoints, m.leaseExpiries, m.leaseGraces, m.workerConnects, m.badFrames, m.silenceCloses, m.handBackHolds, m.uploadedBytes, m.uploadSeconds,
		m.leader, m.hellosWaiting, m.batchSize, m.batchSeconds, s.health.writable, s.health.faults,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{s: s,
			tasks:       prometheus.NewDesc("cyclepool_tasks", "Unfinished tasks over all workflows, by state (from the database).", []string{"state"}, nil),
			workersDB:   prometheus.NewDesc("cyclepool_workers_connected", "Connected workers over all replicas, by kind (from the database).", []string{"kind"}, nil),
			workersHere: prometheus.NewDesc("cyclepool_replica_workers", "Workers connected to this replica, by kind.", []string{"kind"}, nil),
		})
	return m
}

func (m *metrics) observeBatch(op string, n int, start time.Time) {
	if n == 0 {
		return
	}
	m.batchSize.WithLabelValues(op).Observe(float64(n))
	m.batchSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// stateCollector reads task and worker counts at scrape time.
type stateCollector struct {
	s                             *Server
	tasks, workersDB, workersHere *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tasks
	ch <- c.workersDB
	ch <- c.workersHere
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tasks, workers, err := c.s.store.ActiveCounts(ctx)
	if err == nil {
		for st, n := range tasks {
			ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.GaugeValue, float64(n), st)
		}
		for k, n := range workers {
			ch <- prometheus.MustNewConstMetric(c.workersDB, prometheus.GaugeValue, float64(n), k)
		}
	}
	for k, n := range c.s.hub.countByKind() {
		ch <- prometheus.MustNewConstMetric(c.workersHere, prometheus.GaugeValue, float64(n), k)
	}
}
