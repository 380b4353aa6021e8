package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/cyclepool/cyclepool/internal/workflow"
)

// Output is one named output of a finished attempt: its bytes, or the
// blob it was uploaded as (Blob, of Size bytes).
type Output struct {
	Name string
	Data []byte
	Blob string // "sha256:<hex>" of an output uploaded over HTTP (BeginOutputUpload)
	Size int64  // the uploaded blob's size, as recorded at its upload
}

// Completion is how a worker says an attempt ended.
type Completion struct {
	Attempt int64
	Worker  string
	OK      bool
	Outputs []Output // when OK
	Log     []byte
	Reason  string // when not OK: a protocol reason code
	Message string
	// End says how a failure (not OK) ended, and so whom it charges
	// (Ending.Charges): EndTaskError, the zero value, uses up one of the
	// task's attempts.
	End Ending
	// Refused is set by Complete when it refused a result that breaks its
	// task's rules (an output name the workflow could not name, outputs or
	// a log over the task's limits), saying which: the attempt ended
	// (EndRefused, charged to the worker) and the task was queued again.
	Refused string
	// Duration is the run time the worker reported for a success. The run
	// time averages take it, or the time since the attempt was created
	// when that is shorter: the latter also counts the attempt's wait in
	// the worker's queue, which says nothing of the task.
	Duration time.Duration
}

// Complete commits a batch of completions in one transaction and reports,
// for each, whether it was accepted. A completion is refused when its
// attempt is no longer running on that worker (lease lost, cancelled,
// already completed): fencing by attempt id. Accepted successes store the
// outputs, mark the task done and make dependents whose last upstream task
// this was ready, in the same transaction. Accepted failures queue the task
// again, or fail it (and its dependents) after max_attempts. With an
// error, accepted may still report completions that were committed (see
// CompleteFinished).
func (s *Store) Complete(ctx context.Context, cs []Completion) ([]bool, error) {
	accepted, _, err := s.CompleteFinished(ctx, cs)
	return accepted, err
}

// CompleteFinished is Complete that also returns the ids of workflows the
// completion finished, when it knows them (the one-round-trip path of
// small batches of successes does): the caller can tell those waiting for
// them sooner than the notification on ChannelFinished, which every
// replica hears anyway.
//
// A batch may be committed in two transactions (see completeBatch). When
// the second fails, the error comes back with accepted still set for the
// completions the first committed, and finished for the workflows it
// finished: those are done, and sending them again would only have them
// refused; the others were not committed.
func (s *Store) CompleteFinished(ctx context.Context, cs []Completion) (accepted []bool, finished []string, err error) {
	accepted, finished, _, err = s.CompleteWatching(ctx, cs, nil)
	return accepted, finished, err
}

// FinishedStatus is a workflow's status and its attempts' spans, as
// StatusAndSpans reads them.
type FinishedStatus struct {
	Status *WorkflowStatus
	Spans  []AttemptSpan
}

// MaxWatched bounds the workflows CompleteWatching watches.
const MaxWatched = 4

// CompleteWatching is CompleteFinished that also reads the status of each
// workflow of watch (the first MaxWatched ids that are UUIDs) found
// finished once the batch has committed, when the batch takes one round
// trip (a few successes: completeFast): after its COMMIT, in that round
// trip. An owner waiting for a workflow the batch finished then gets its
// answer without a round trip of its own. The statuses are of any owner:
// watch only workflows whose owner's waiter has looked at them. A status
// that could not be read is left out, and does not make the batch fail.
func (s *Store) CompleteWatching(ctx context.Context, cs []Completion, watch []string) (accepted []bool, finished []string,
	statuses map[string]FinishedStatus, err error) {
	if len(cs) == 0 {
		return nil, nil, nil, nil
	}
	// A worker may send anything: one item it got wrong must not sink the
	// others. Items that repeat an attempt of the batch, or that PostgreSQL
	// could not store, are refused on their own.
	accepted = make([]bool, len(cs))
	keep := make([]int, 0, len(cs))
	seen := make(map[int64]bool, len(cs))
	for i := range cs {
		sanitize(&cs[i])
		if seen[cs[i].Attempt] {
			continue
		}
		if msg := badOutputs(cs[i].Outputs); cs[i].OK && msg != "" {
			refuse(&cs[i], msg)
		}
		if !cs[i].OK && !cs[i].End.Charges().Attempt && len(cs[i].Log) > uncountedLogBytes {
			// Logs of ends charged to nobody are kept short: a worker
			// could otherwise hand back the same task again and again,
			// each time with a log of megabytes.
			cs[i].Log = cs[i].Log[:uncountedLogBytes]
		}
		seen[cs[i].Attempt] = true
		keep = append(keep, i)
	}
	if len(keep) == 0 {
		return accepted, nil, nil, nil
	}
	if err := s.resolveUploads(ctx, cs); err != nil {
		return accepted, nil, nil, err
	}
	batch := pick(cs, keep)
	acc, finished, statuses, err := s.completeBatch(ctx, batch, watch)
	if acc == nil {
		acc = make([]bool, len(batch))
	}
	if err != nil && !retryable(err) && !ServerFault(err) && ctx.Err() == nil {
		// Find the culprit: commit the items not committed yet one by one.
		// Not when PostgreSQL itself failed (its disk is full, it is down or
		// read-only): that is no item's fault, and every item waits for
		// another try (the caller asks the workers to send them again).
		err = nil
		for j := range batch {
			if acc[j] {
				continue
			}
			one, fin, _, oneErr := s.completeBatch(ctx, batch[j:j+1], nil)
			if oneErr != nil {
				if retryable(oneErr) || ServerFault(oneErr) || ctx.Err() != nil {
					err = oneErr
					break
				}
				continue // refused: this item cannot be stored
			}
			acc[j] = one[0]
			finished = append(finished, fin...)
		}
	}
	for j, i := range keep {
		accepted[i], cs[i].Refused = acc[j], batch[j].Refused
	}
	return accepted, finished, statuses, err
}

// byAttempt returns the indexes of cs in attempt id order: batches lock
// attempts in that order, so that concurrent batches cannot deadlock.
func byAttempt(cs []Completion) []int {
	order := make([]int, len(cs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(cs[a].Attempt, cs[b].Attempt) })
	return order
}

// runTime is the run time of a success for the averages: the one the
// worker reported, at most the time since the claim (sinceClaimMS); that
// time alone when the worker reported none.
func runTime(sinceClaimMS int64, reported time.Duration) time.Duration {
	d := time.Duration(sinceClaimMS) * time.Millisecond
	if reported > 0 {
		d = min(d, reported)
	}
	return d
}

// pick returns the elements of xs at the indexes idx, in that order.
func pick[T any](xs []T, idx []int) []T {
	out := make([]T, len(idx))
	for j, i := range idx {
		out[j] = xs[i]
	}
	return out
}

// sanitize makes a completion's text storable: valid UTF-8 without NUL.
func sanitize(c *Completion) {
	clean := func(s string) string {
		return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	}
	c.Reason, c.Message = clean(c.Reason), clean(c.Message)
}

// Stdout is the name of the output every successful attempt has: what the
// task wrote to its standard output.
const Stdout = "stdout"

// implied reports whether an output goes without a task_outputs row: an
// empty stdout. A done task without a stdout row has an empty stdout
// (every reader of outputs knows it: loadInputs, taskStatusSQL, Output).
// Most tasks write their results to files or to a short stdout; for those
// with nothing on stdout, a row and its index entry per task cost about a
// third of a completion's time in BenchmarkCandidatesClaimPicksComplete.
func implied(o Output) bool { return o.Name == Stdout && len(o.Data) == 0 && o.Blob == "" }

// appendStored appends the outputs os of one success that get a
// task_outputs row (not the implied ones) to the arrays of a completion
// statement, each with key (its attempt or task, as the statement wants).
func appendStored(keys []int64, names []string, datas [][]byte, key int64, os []Output) ([]int64, []string, [][]byte) {
	for _, o := range os {
		if implied(o) || o.Blob != "" {
			continue
		}
		if o.Data == nil {
			o.Data = []byte{} // an empty output is still an output
		}
		keys, names, datas = append(keys, key), append(names, o.Name), append(datas, o.Data)
	}
	return keys, names, datas
}

// badOutputs says what is wrong with a result's outputs ("" when
// nothing): distinct names, valid UTF-8, each one the workflow file could
// name (workflow.CheckOutputName: a clean relative path, or an absolute
// one outside /in and /out).
func badOutputs(os []Output) string {
	names := make(map[string]bool, len(os))
	for _, o := range os {
		if !utf8.ValidString(o.Name) {
			return fmt.Sprintf("output name %q is not valid UTF-8", o.Name)
		}
		if msg := workflow.CheckOutputName(o.Name); msg != "" {
			return msg
		}
		if names[o.Name] {
			return fmt.Sprintf("output %q appears twice", o.Name)
		}
		names[o.Name] = true
	}
	return ""
}

// refuse turns a result that breaks its task's rules into the end of its
// attempt (EndRefused), keeping none of what it carried.
func refuse(c *Completion, why string) {
	c.Refused = why
	c.OK, c.End, c.Reason, c.Message, c.Outputs, c.Log = false, EndRefused, "refused", why, nil, nil
}

// uncountedLogBytes bounds the log kept for an attempt that ended charged
// to nobody (Ending.Charges).
const uncountedLogBytes = 4 << 10

// outputBytes is the size of a result's outputs, which the task's
// output_bytes bounds.
func outputBytes(os []Output) int64 {
	var n int64
	for _, o := range os {
		n += int64(len(o.Data)) + o.Size
	}
	return n
}

// completeBatch is Complete for a batch of distinct attempts. A small
// batch of successes commits in two transactions when it holds attempts of
// replicated tasks (completeFast, then completeGeneral for those); when the
// second fails, accepted and finished still report what the first
// committed, beside the error.
func (s *Store) completeBatch(ctx context.Context, cs []Completion, watch []string) (accepted []bool, finished []string,
	statuses map[string]FinishedStatus, err error) {
	if len(cs) > fastBatch || !plainSuccesses(cs) {
		accepted, err = s.completeGeneral(ctx, cs)
		return accepted, nil, nil, err
	}
	// A few successes: one round trip, except for replicated tasks'
	// attempts, which completeFast leaves to the general path.
	var rest []int
	for try := 0; ; try++ {
		accepted, rest, finished, statuses, err = s.completeFast(ctx, cs, watch)
		if err == nil || try >= 5 || !retryable(err) {
			break
		}
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("complete %d attempts: %w", len(cs), err)
	}
	if len(rest) == 0 {
		return accepted, finished, statuses, nil
	}
	general := pick(cs, rest)
	acc, err := s.completeGeneral(ctx, general)
	if err != nil {
		return accepted, finished, nil, err // the rest are false: not committed
	}
	for j, i := range rest {
		accepted[i], cs[i].Refused = acc[j], general[j].Refused
	}
	return accepted, finished, nil, nil // the statuses were read before the rest committed
}

// fastBatch is the largest batch completeFast takes. A small batch is the
// case of a lightly loaded server, where a completion's latency is a round
// trip more or less; large batches, under load, went faster through the
// general path in the dispatch benchmark (4,300-4,500 tasks/s against
// 1,100-3,400, and 149 µs of PostgreSQL per task against 171-228).
const fastBatch = 8

// plainSuccesses reports whether every completion is a success with no
// output uploaded over HTTP: what completeFast takes.
func plainSuccesses(cs []Completion) bool {
	for i := range cs {
		if !cs[i].OK || hasUploaded(&cs[i]) {
			return false
		}
	}
	return true
}

// completeFast commits successes in one round trip (BEGIN, completeFastSQL
// and COMMIT, pipelined): on the latency path of every task, where the
// general path's two round trips cost as much as the rows. It leaves alone
// the attempts of replicated tasks, whose results are verified first, and
// returns their indexes in cs for the general path, and the ids of the
// workflows it finished. After the COMMIT, the same round trip reads the
// statuses of the watched workflows that have finished (CompleteWatching).
func (s *Store) completeFast(ctx context.Context, cs []Completion, watch []string) (accepted []bool, rest []int, finished []string,
	statuses map[string]FinishedStatus, err error) {
	order := byAttempt(cs)
	ids := make([]int64, len(cs))
	workers := make([]string, len(cs))
	logs := make([][]byte, len(cs))
	sizes := make([]int64, len(cs))
	var outAttempt []int64
	var outName []string
	var outData [][]byte
	for j, i := range order {
		c := &cs[i]
		ids[j], workers[j], logs[j], sizes[j] = c.Attempt, c.Worker, c.Log, outputBytes(c.Outputs)
		outAttempt, outName, outData = appendStored(outAttempt, outName, outData, c.Attempt, c.Outputs)
	}
	b := &pgx.Batch{}
	queueBegin(b, false)
	b.Queue(completeFastSQL, ids, uuidParams(workers), logs, outAttempt, outName, outData, s.interactiveHeadStart.Milliseconds(), ChannelReady, sizes)
	b.Queue("COMMIT")
	watched := make([]string, 0, MaxWatched)
	for _, id := range watch {
		if len(watched) < MaxWatched && looksLikeUUID(id) {
			watched = append(watched, id)
			b.Queue(finishedWorkflowSQL, id)
			b.Queue(finishedTasksSQL, id)
			b.Queue(finishedSpansSQL, id)
		}
	}
	br := s.pool.SendBatch(ctx, b)
	type row struct {
		attempt    int64
		replicated bool
		module     string
		name       string
		ms         int64
		finished   []string
		done       bool
	}
	var got []row
	if err = execBegin(br); err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			got, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
				var x row
				var notified int64
				err := r.Scan(&x.attempt, &x.replicated, &x.module, &x.name, &x.ms, &notified, &x.finished, &x.done)
				return x, err
			})
		}
		if err == nil {
			_, err = br.Exec() // COMMIT
		}
	}
	if err == nil {
		// Committed: what follows is read, or left out, without failing
		// the batch.
		for _, id := range watched {
			st, spans, err := readStatus(br, id, true)
			if err != nil && !errors.Is(err, ErrNotFound) {
				break // the rest of the batch failed with it
			}
			if err == nil {
				if statuses == nil {
					statuses = map[string]FinishedStatus{}
				}
				statuses[id] = FinishedStatus{Status: st, Spans: spans}
			}
		}
		br.Close()
	} else {
		br.Close()
		return nil, nil, nil, nil, err
	}
	index := make(map[int64]int, len(cs))
	for i := range cs {
		index[cs[i].Attempt] = i
	}
	accepted = make([]bool, len(cs))
	var runs []Run
	var succeeded []string // the workers of the accepted attempts
	done := 0
	for _, x := range got {
		i := index[x.attempt]
		if x.replicated {
			rest = append(rest, i)
			continue
		}
		accepted[i] = true
		d := runTime(x.ms, cs[i].Duration)
		runs = append(runs, Run{Module: x.module, Name: x.name, Duration: d})
		succeeded = append(succeeded, cs[i].Worker)
		if x.done {
			done++
		}
	}
	s.runs.add(runs)
	s.tallies.add(time.Now(), done, succeeded)
	for _, x := range got {
		if len(x.finished) > 0 {
			finished = x.finished // the same in every row that has it
			break
		}
	}
	slices.Sort(rest)
	return accepted, rest, finished, statuses, nil
}

// completeGeneral is Complete for any batch of distinct attempts.
func (s *Store) completeGeneral(ctx context.Context, cs []Completion) ([]bool, error) {
	order := byAttempt(cs)
	ids := make([]int64, len(cs))
	workers := make([]string, len(cs))
	oks := make([]bool, len(cs))
	states := make([]string, len(cs))
	sizes := make([]int64, len(cs))
	logs := make([][]byte, len(cs))
	reasons := make([]string, len(cs))
	for j, i := range order {
		c := &cs[i]
		ids[j], workers[j], oks[j], logs[j], sizes[j] = c.Attempt, c.Worker, c.OK, c.Log, outputBytes(c.Outputs)
		if !c.OK {
			reasons[j] = c.reason()
			states[j] = c.End.attemptState()
		} else {
			states[j] = "succeeded"
		}
	}
	accepted := make([]bool, len(cs))
	var err error
	for try := 0; ; try++ {
		clear(accepted)
		err = s.completeOnce(ctx, cs, accepted, ids, workers, oks, logs, reasons, states, sizes)
		if err == nil || try >= 5 || !retryable(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("complete %d attempts: %w", len(cs), err)
	}
	return accepted, nil
}

// completeOnce is one try of Complete, in two round trips in the common case
// (all successes): BEGIN (queueBegin's settings: with stale statistics the
// statements below otherwise read every active task, or the whole table)
// with the fenced attempt update, then the outputs, the task and workflow
// updates and COMMIT, each pipelined as a pgx batch.
func (s *Store) completeOnce(ctx context.Context, cs []Completion, accepted []bool,
	ids []int64, workers []string, oks []bool, logs [][]byte, reasons, states []string, sizes []int64) (err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	inTx := false
	defer func() {
		if err != nil && inTx {
			if _, rerr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
				conn.Conn().Close(context.WithoutCancel(ctx))
			}
		}
	}()
	b := &pgx.Batch{}
	queueBegin(b, false)
	b.Queue(completeAttemptsSQL, ids, uuidParams(workers), oks, logs, reasons, states, sizes)
	br := conn.SendBatch(ctx, b)
	if err := execBegin(br); err != nil {
		br.Close()
		return err
	}
	inTx = true
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return err
	}
	taskOf := map[int64]int64{}
	replicated := map[int64]bool{}
	reported := make(map[int64]time.Duration, len(cs))
	for i := range cs {
		if cs[i].OK {
			reported[cs[i].Attempt] = cs[i].Duration
		}
	}
	var runs []Run
	// Declared once: the pointers Scan takes would move variables
	// declared in the loop to the heap, seven allocations per row.
	var a, t int64
	var rep, ok bool
	var module pgtype.DriverBytes
	var name string
	var ms int64
	var over bool
	var why string
	var refused map[int64]string // attempts whose result broke its task's limits, and why
	in := interned{}
	for rows.Next() {
		if err := rows.Scan(&a, &t, &rep, &ok, &module, &name, &ms, &over, &why); err != nil {
			rows.Close()
			br.Close()
			return err
		}
		taskOf[a] = t
		if over {
			if refused == nil {
				refused = map[int64]string{}
			}
			refused[a] = why
		}
		if rep {
			replicated[a] = true
		}
		if ok {
			d := runTime(ms, reported[a])
			runs = append(runs, Run{Module: in.of(module), Name: name, Duration: d})
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		br.Close()
		return err
	}
	if err := br.Close(); err != nil {
		return err
	}
	var done []int64
	var outTask []int64
	var outName []string
	var outData [][]byte
	var upTask []int64
	var upName, upBlob []string
	var ends []attemptEnd
	var vres []replicaResult
	invalid := map[string]int{} // workers whose results were refused
	for i := range cs {
		t, ok := taskOf[cs[i].Attempt]
		if !ok {
			continue
		}
		accepted[i] = true
		if why, bad := refused[cs[i].Attempt]; bad {
			cs[i].Refused = why
			ends = append(ends, attemptEnd{task: t, worker: cs[i].Worker, reason: why, end: EndRefused})
			invalid[cs[i].Worker]++
			continue
		}
		if !cs[i].OK && cs[i].End == EndRefused {
			invalid[cs[i].Worker]++
		}
		if cs[i].OK && replicated[cs[i].Attempt] {
			vres = append(vres, replicaResult{attempt: cs[i].Attempt, task: t, worker: cs[i].Worker, outputs: cs[i].Outputs})
		} else if cs[i].OK {
			done = append(done, t)
			outTask, outName, outData = appendStored(outTask, outName, outData, t, cs[i].Outputs)
			upTask, upName, upBlob = appendUploaded(upTask, upName, upBlob, t, cs[i].Outputs)
		} else {
			ends = append(ends, attemptEnd{task: t, worker: cs[i].Worker, reason: cs[i].reason(), end: cs[i].End})
		}
	}
	if len(vres) > 0 {
		// Replicated tasks (never when replicas = 1): compare by hash.
		vdone, vends, err := s.verify(ctx, conn, vres)
		if err != nil {
			return err
		}
		done = append(done, vdone...)
		ends = append(ends, vends...)
	}
	if len(ends) > 0 {
		if err := s.settleEnds(ctx, conn, ends); err != nil {
			return err
		}
	}
	if len(invalid) > 0 {
		if err := chargeWorkers(ctx, conn, EndRefused, invalid); err != nil {
			return err
		}
	}
	b = &pgx.Batch{}
	if len(outTask) > 0 {
		// Only for tasks still running: a cancelled task keeps no outputs.
		b.Queue(insertOutputsSQL, outTask, outName, outData)
	}
	if len(upTask) > 0 {
		b.Queue(insertUploadedSQL, upTask, upName, upBlob)
	}
	var marked int64 // tasks marked done
	if len(done) > 0 {
		slices.Sort(done)
		b.Queue(doneSQL, done, s.interactiveHeadStart.Milliseconds(), ChannelReady).QueryRow(func(r pgx.Row) error {
			var readied, finished, notified int64
			return r.Scan(&readied, &finished, &notified, &marked)
		})
	}
	b.Queue("COMMIT")
	err = conn.SendBatch(ctx, b).Close()
	if err == nil {
		inTx = false
		s.runs.add(runs)
		var workers []string
		for i := range cs {
			if accepted[i] && cs[i].OK {
				workers = append(workers, cs[i].Worker)
			}
		}
		s.tallies.add(time.Now(), int(marked), workers)
	}
	return err
}

// insertOutputsSQL stores the outputs ($1 task, $2 name, $3 data) of
// tasks still running: a cancelled task keeps no outputs. The state test
// is written with COLLATE "C" (see doneCTEs), so that it matches the
// predicate of no index: with the statistics of a table analyzed while
// few tasks ran, PostgreSQL otherwise read every running task for each
// batch (a bitmap scan of tasks_active).
const insertOutputsSQL = `INSERT INTO task_outputs (task_id, name, data)
	SELECT u.* FROM unnest($1::bigint[], $2::text[], $3::bytea[]) AS u(task_id, name, data)
	JOIN tasks t ON t.id = u.task_id WHERE t.state COLLATE "C" = 'running'`

// completeAttemptsSQL ends the running attempts $1 (sorted, distinct) of
// workers $2 (fencing: an attempt no longer running on its worker is left
// alone) with success $3, log $4, reason $5 and state $6, and returns each
// ended attempt's task. A success whose outputs ($7: bytes in all) or log
// break the task's limits is refused instead (over, with the reason), and
// a failure's log is cut to the task's limit.
//
// The arrays are unnested once and each attempt found by a probe of
// attempts_pkey (TestCompletionReadsRowsInProportionToItsBatch checks the
// plan with stale statistics). Looking each attempt's values up by
// array_position instead, as this statement once did, cost a scan of the
// arrays per value: 11 µs per attempt in batches of 100 against 9 with
// the join, 15 against 7 in batches of 400. The update changes no indexed
// column, so it is a HOT update
// (migrations/00012_attempts_done_in_place.sql).
const completeAttemptsSQL = `UPDATE attempts a SET
		state = CASE WHEN o.over THEN 'failed' ELSE u.state END, ended_at = now(),
		log = CASE WHEN o.over THEN NULL WHEN u.ok THEN u.log ELSE substring(u.log FROM 1 FOR t.log_bytes::int) END,
		reason = CASE WHEN o.over THEN format('refused: the result breaks the task''s limits: outputs of %s bytes (at most %s), a log of %s bytes (at most %s)',
			u.size, t.output_bytes, coalesce(octet_length(u.log), 0), t.log_bytes) ELSE u.reason END
	FROM unnest($1::bigint[], $2::uuid[], $3::bool[], $4::bytea[], $5::text[], $6::text[], $7::bigint[]) AS u(id, w, ok, log, reason, state, size),
		tasks t, LATERAL (SELECT u.ok AND (u.size > t.output_bytes OR coalesce(octet_length(u.log), 0) > t.log_bytes) AS over) o
	WHERE a.id = u.id AND a.worker_id = u.w AND a.state = 'running' AND t.id = a.task_id
	RETURNING a.id, a.task_id, t.max_replicas > 1, u.ok AND NOT o.over, t.module_id, t.name,
		(extract(epoch FROM now() - a.started_at) * 1000)::bigint, o.over, a.reason`

// doneSQL marks tasks done ($1), releases the dependents whose last
// upstream task this was, counts the workflows down (finishing those with no
// task left) and wakes the dispatchers when tasks became ready, in one
// statement; its last column counts the tasks it marked done.
var doneSQL = "WITH " + doneCTEs("= ANY($1)", "$2") + `
SELECT ready.n, (SELECT count(*) FROM wf),
	(SELECT count(*) FROM (SELECT pg_notify($3, '') FROM ready r WHERE r.n > 0) x), (SELECT count(*) FROM done)
FROM ready`

// completeFastSQL ends the running attempts $1 (sorted, distinct) of
// workers $2 (fencing, as completeAttemptsSQL) as successes with logs $3
// when their outputs ($9: bytes in all) and logs fit the task's limits,
// stores their outputs ($4 attempt, $5 name, $6 data; only for tasks still
// running: a cancelled task keeps no outputs) and marks their tasks done as
// doneSQL does ($7 head start, $8 channel), in one statement. Attempts of
// replicated tasks, and results that do not fit (completeGeneral refuses
// them), are left running and come back with replicated set;
// the others that come back were accepted, with their task's module and
// name and the time since the claim (ms), the count of notifications sent
// (the column only makes the notification happen: evaluated with the first
// accepted attempt's row; when no attempt was accepted, no task became
// ready), the ids of the workflows the statement finished, and whether the
// attempt's task was marked done (not when it was cancelled meanwhile).
// The workflows' update (wf) runs whether read or not, as every
// data-modifying WITH.
var completeFastSQL = strings.ReplaceAll(`WITH acc AS (
	UPDATE attempts a SET state = 'succeeded', ended_at = now(), log = ($3::bytea[])[array_position($1::bigint[], a.id)], reason = ''
	FROM tasks t
	WHERE a.id = ANY($1) AND a.worker_id = ($2::uuid[])[array_position($1::bigint[], a.id)] AND a.state = 'running'
		AND t.id = a.task_id AND t.max_replicas = 1 AND {fits}
	RETURNING a.id, a.task_id, t.module_id, t.name, (extract(epoch FROM now() - a.started_at) * 1000)::bigint AS ms
), outs AS (
	INSERT INTO task_outputs (task_id, name, data)
	SELECT acc.task_id, o.name, o.data FROM unnest($4::bigint[], $5::text[], $6::bytea[]) AS o(attempt, name, data)
	JOIN acc ON acc.id = o.attempt JOIN tasks t ON t.id = acc.task_id WHERE t.state COLLATE "C" = 'running'
), `+doneCTEs("IN (SELECT task_id FROM acc)", "$7")+`
SELECT acc.id, false, acc.module_id, acc.name, acc.ms, (SELECT count(*) FROM (SELECT pg_notify($8, '') FROM ready r WHERE r.n > 0) x),
	(SELECT array_agg(wf.id::text) FROM wf WHERE wf.state <> 'running'), acc.task_id IN (SELECT id FROM done)
FROM acc
UNION ALL
SELECT a.id, true, '', '', 0, 0, NULL, false FROM attempts a JOIN tasks t ON t.id = a.task_id
WHERE a.id = ANY($1) AND a.worker_id = ($2::uuid[])[array_position($1::bigint[], a.id)] AND a.state = 'running'
	AND (t.max_replicas > 1 OR NOT {fits})`, "{fits}", `(($9::bigint[])[array_position($1::bigint[], a.id)] <= t.output_bytes
		AND coalesce(octet_length(($3::bytea[])[array_position($1::bigint[], a.id)]), 0) <= t.log_bytes)`)

// doneCTEs are the common table expressions of doneSQL: done marks the
// tasks whose id is ids (an SQL condition on id) done, d and rel release
// their dependents (headStart: the parameter of the interactive head start
// in ms), c and wf count the workflows down, and ready counts the tasks
// that became ready.
//
// The update of done changes no indexed column (pending is 0 already,
// except for a replicated task whose quorum came before its last replica's
// claim), so it is a HOT update: migrations/00011_tasks_done_in_place.sql.
//
// The tasks are found by id (tasks_pkey), not through tasks_active: the
// state tests are written with COLLATE "C" (the same test for these ASCII
// states) so that they do not match tasks_active's predicate. Otherwise, with
// statistics that say few tasks run (taken when the workflow was
// submitted), PostgreSQL reads every running (or blocked) task for each
// batch.
func doneCTEs(ids, headStart string) string {
	return strings.NewReplacer("{ids}", ids, "{head}", headStart).Replace(doneCTEsTemplate)
}

var doneCTEsTemplate = `done AS (
	-- A done task needs its checkpoint no more: its bytes, or its blob
	-- (which garbage collection then removes), go.
	UPDATE tasks SET state = 'done', pending = 0, finished_at = now(), updated_at = now(), error = '', checkpoint = NULL, checkpoint_blob = NULL
	WHERE id {ids} AND state COLLATE "C" = 'running' RETURNING id, workflow_id, failed_by
), struck AS (
	-- A task done disproves the failures reported of it: each worker
	-- that reported one gets a strike (sched.Standing).
	UPDATE workers w SET ` + strikesSet("x.n") + `
	FROM (SELECT f, count(*) AS n FROM done, unnest(done.failed_by) AS f GROUP BY f ORDER BY f) x WHERE w.id = x.f
), d AS (
	SELECT ti.task_id, count(DISTINCT ti.from_task) AS n FROM task_inputs ti JOIN done ON ti.from_task = done.id GROUP BY ti.task_id
), rel AS (
	UPDATE tasks t SET deps_left = t.deps_left - d.n, updated_at = now(),
		state = CASE WHEN t.deps_left - d.n = 0 THEN 'ready' ELSE 'blocked' END,
		sort_key = CASE WHEN t.deps_left - d.n = 0 THEN
			now() - CASE WHEN t.priority = 'interactive' THEN {head} * interval '1 millisecond' ELSE interval '0' END END
	FROM d WHERE t.id = d.task_id AND t.state COLLATE "C" = 'blocked'
	RETURNING t.state = 'ready' AS ready
), c AS (
	SELECT workflow_id, count(*) AS n FROM done GROUP BY workflow_id ORDER BY workflow_id
), wf AS (
	UPDATE workflows w SET tasks_left = w.tasks_left - c.n,
		state = CASE WHEN w.tasks_left - c.n > 0 THEN w.state WHEN w.tasks_failed > 0 THEN 'failed' ELSE 'done' END,
		finished_at = CASE WHEN w.tasks_left - c.n > 0 THEN NULL ELSE now() END
	FROM c WHERE w.id = c.workflow_id AND w.state = 'running' RETURNING w.id, w.state
), ready AS (
	SELECT count(*) AS n FROM rel WHERE ready
)`

// retryable reports whether a transaction failed for a reason another try
// can fix: a deadlock or a serialization failure.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// reason is how a failed completion is written in the attempt's record.
func (c *Completion) reason() string {
	if c.Message == "" {
		return c.Reason
	}
	return c.Reason + ": " + c.Message
}

// attemptEnd is an attempt that ended without a result.
type attemptEnd struct {
	task   int64
	worker string // the attempt's worker; "" when not known
	reason string
	end    Ending
	// progressed says the attempt saved a checkpoint: a loss that moved
	// its task on does not count towards max_lost (Charge.Lost).
	progressed bool
}

// querier is what settleEnds needs of a connection in a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// requeueSQL moves on the tasks $1 of attempts that ended without a
// result ($2 reason; $3, $4, $5, $6, $9 and $10 the Charge of each end:
// attempt, lost, final, keeps place, avoid and corroborate; $7 the
// interactive head start in ms; $8 the attempt's worker): each is queued
// again, or fails when the end was final or used up the last of its
// attempts (max_attempts) or of its losses (max_lost). A failure that
// needs corroboration uses up the last attempt only when a second
// distinct worker failed the task (failed_by), or the worker is one of
// the operator's; until then the task waits for another worker. A
// volunteer the end says to avoid joins the task's avoid list. An end
// that keeps the task's place leaves sort_key, the time it first became
// ready, as it was. The tasks are found by id: the state test is written
// with COLLATE "C" (see doneCTEs), or with the statistics of a table
// analyzed while few tasks were active PostgreSQL read every active task
// for each batch.
var requeueSQL = strings.NewReplacer(
	"{exhausted}", `(u.counts AND t.attempts >= t.max_attempts AND (NOT u.corroborate OR coalesce(w.operator, false)
		OR coalesce(cardinality(t.failed_by), 0) + CASE WHEN u.worker = ANY(t.failed_by) THEN 0 ELSE 1 END >= 2))`,
	"{unconfirmed}", `(u.counts AND t.attempts >= t.max_attempts AND NOT u.final)`,
	"{lostall}", `(u.lost AND t.lost + 1 >= t.max_lost)`,
).Replace(`UPDATE tasks t SET updated_at = now(),
		attempts = CASE WHEN u.counts THEN t.attempts ELSE t.attempts - 1 END,
		lost = CASE WHEN u.lost THEN t.lost + 1 ELSE t.lost END,
		pending = CASE WHEN (u.final OR {exhausted} OR {lostall}) THEN 0 ELSE t.pending + 1 END,
		state = CASE WHEN (u.final OR {exhausted} OR {lostall}) THEN 'failed' ELSE 'ready' END,
		sort_key = CASE WHEN u.keep THEN coalesce(t.sort_key, now())
			ELSE now() - CASE WHEN t.priority = 'interactive' THEN $7 * interval '1 millisecond' ELSE interval '0' END END,
		finished_at = CASE WHEN (u.final OR {exhausted} OR {lostall}) THEN now() END,
		checkpoint = CASE WHEN (u.final OR {exhausted} OR {lostall}) THEN NULL ELSE t.checkpoint END,
		checkpoint_blob = CASE WHEN (u.final OR {exhausted} OR {lostall}) THEN NULL ELSE t.checkpoint_blob END,
		avoid = CASE WHEN u.avoid AND u.worker IS NOT NULL AND NOT coalesce(w.operator, true)
			AND NOT coalesce(u.worker = ANY(t.avoid), false) THEN array_append(t.avoid, u.worker) ELSE t.avoid END,
		failed_by = CASE WHEN u.corroborate AND u.counts AND u.worker IS NOT NULL
			AND NOT coalesce(u.worker = ANY(t.failed_by), false) THEN array_append(t.failed_by, u.worker) ELSE t.failed_by END,
		error = CASE
			WHEN u.final OR {exhausted} THEN format('failed after %s attempt%s; last: %s', t.attempts, CASE WHEN t.attempts = 1 THEN '' ELSE 's' END, u.reason)
			WHEN {lostall} THEN format('stopped: the workers running it vanished or crashed %s times (max_lost); last: %s', t.lost + 1, u.reason)
			WHEN {unconfirmed} THEN format('%s (one worker''s failure: waiting for another worker to confirm it)', u.reason)
			ELSE u.reason END
	FROM unnest($1::bigint[], $2::text[], $3::bool[], $4::bool[], $5::bool[], $6::bool[], $8::uuid[], $9::bool[], $10::bool[])
		AS u(id, reason, counts, lost, final, keep, worker, avoid, corroborate)
		LEFT JOIN workers w ON w.id = u.worker
	WHERE t.id = u.id AND t.state COLLATE "C" IN ('running', 'ready')
	RETURNING t.id, t.workflow_id::text, t.state`)

// oncePerTask splits ends (sorted by task) into the first end of each
// task, and the others.
func oncePerTask(ends []attemptEnd) (round, rest []attemptEnd) {
	for i, e := range ends {
		if i > 0 && e.task == ends[i-1].task {
			rest = append(rest, e)
		} else {
			round = append(round, e)
		}
	}
	return round, rest
}

// requeue runs requeueSQL for ends (each task at most once) and returns
// the tasks it failed and how many it queued again; delta counts the
// failed ones against their workflows.
func (s *Store) requeue(ctx context.Context, tx querier, ends []attemptEnd, delta func(wf string) *wfDelta) (failed []int64, readied int, err error) {
	ids := make([]int64, len(ends))
	reasons := make([]string, len(ends))
	counts := make([]bool, len(ends))
	lost := make([]bool, len(ends))
	final := make([]bool, len(ends))
	keep := make([]bool, len(ends))
	workers := make([]string, len(ends))
	avoid := make([]bool, len(ends))
	corroborate := make([]bool, len(ends))
	for i, e := range ends {
		c := e.end.Charges()
		ids[i], reasons[i], counts[i], lost[i], final[i], keep[i] = e.task, e.reason, c.Attempt, c.Lost && !e.progressed, c.Final, c.KeepsPlace
		workers[i], avoid[i], corroborate[i] = e.worker, c.Avoid, c.Corroborate
	}
	rows, err := tx.Query(ctx, requeueSQL, ids, reasons, counts, lost, final, keep, s.interactiveHeadStart.Milliseconds(),
		uuidParams(workers), avoid, corroborate)
	if err != nil {
		return nil, 0, fmt.Errorf("requeue tasks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var wf, state string
		if err := rows.Scan(&id, &wf, &state); err != nil {
			return nil, 0, err
		}
		if state == StateFailed {
			failed = append(failed, id)
			d := delta(wf)
			d.finished++
			d.failed++
		} else {
			readied++
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("requeue tasks: %w", err)
	}
	return failed, readied, nil
}

// wfDelta counts a workflow's tasks that reached a final state, and those
// of them that failed.
type wfDelta struct{ finished, failed int }

// settleEnds moves tasks on after attempts ended without a result: each is
// queued again, or failed after its last attempt; failed tasks fail their
// descendants, and workflows whose every task reached a final state finish.
// It runs in the caller's transaction.
func (s *Store) settleEnds(ctx context.Context, tx querier, ends []attemptEnd) error {
	deltas := map[string]*wfDelta{}
	delta := func(wf string) *wfDelta {
		d := deltas[wf]
		if d == nil {
			d = &wfDelta{}
			deltas[wf] = d
		}
		return d
	}
	readied := 0
	if len(ends) > 0 {
		slices.SortFunc(ends, func(a, b attemptEnd) int { return int(a.task - b.task) })
		// An UPDATE … FROM applies one of the rows that match a task, so
		// ends of the same task (two replicas failing together) go in
		// separate rounds, each task at most once per round.
		var failed []int64
		for rest := ends; len(rest) > 0; {
			var round []attemptEnd
			round, rest = oncePerTask(rest)
			f, r, err := s.requeue(ctx, tx, round, delta)
			if err != nil {
				return err
			}
			failed, readied = append(failed, f...), readied+r
		}
		if len(failed) > 0 {
			// Replicas of a failed task still running elsewhere are of no
			// use: stop them on their workers.
			if err := cancelRunning(ctx, tx, failed, "the task failed"); err != nil {
				return fmt.Errorf("cancel replicas of failed tasks: %w", err)
			}
			rows, err := tx.Query(ctx, `WITH RECURSIVE down(id) AS (
					SELECT task_id FROM task_inputs WHERE from_task = ANY($1)
					UNION SELECT ti.task_id FROM task_inputs ti JOIN down ON ti.from_task = down.id)
				UPDATE tasks SET state = 'upstream_failed', pending = 0, finished_at = now(), updated_at = now(), error = 'an upstream task failed'
				WHERE id IN (SELECT id FROM down) AND state COLLATE "C" = 'blocked' RETURNING workflow_id::text`, failed)
			if err != nil {
				return fmt.Errorf("fail dependents: %w", err)
			}
			wfs, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return fmt.Errorf("fail dependents: %w", err)
			}
			for _, wf := range wfs {
				d := delta(wf)
				d.finished++
				d.failed++
			}
		}
	}
	if len(deltas) > 0 {
		wfs := make([]string, 0, len(deltas))
		for wf := range deltas {
			wfs = append(wfs, wf)
		}
		slices.Sort(wfs)
		fin := make([]int32, len(wfs))
		fail := make([]int32, len(wfs))
		for i, wf := range wfs {
			fin[i], fail[i] = int32(deltas[wf].finished), int32(deltas[wf].failed)
		}
		if _, err := tx.Exec(ctx, `UPDATE workflows w SET tasks_left = w.tasks_left - c.n, tasks_failed = w.tasks_failed + c.f,
				state = CASE WHEN w.tasks_left - c.n > 0 THEN w.state WHEN w.tasks_failed + c.f > 0 THEN 'failed' ELSE 'done' END,
				finished_at = CASE WHEN w.tasks_left - c.n > 0 THEN NULL ELSE now() END
			FROM unnest($1::uuid[], $2::int[], $3::int[]) AS c(id, n, f)
			WHERE w.id = c.id AND w.state = 'running'`, wfs, fin, fail); err != nil {
			return fmt.Errorf("count down workflows: %w", err)
		}
	}
	if readied > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, ChannelReady); err != nil {
			return err
		}
	}
	return nil
}
