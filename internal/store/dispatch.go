package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Claimed is a task attempt created by Claim, with everything a worker needs
// to run it.
type Claimed struct {
	Attempt     int64
	Worker      string
	TaskID      int64
	WorkflowID  string
	Name        string
	Module      string
	Args        []string
	Stdin       []byte
	Priority    string
	TimeoutMS   int64
	MemoryPages int
	OutputBytes int64
	LogBytes    int64
	CkptMS      int64
	Seed        int64
	Restore     []byte
	Inputs      []Input
	// Missing names an input whose upstream output does not exist; such an
	// attempt must be failed instead of sent.
	Missing string

	hasInputs bool
}

// Input is one input file of a claimed task; Name "" is stdin.
type Input struct {
	Name string
	Data []byte
}

// Claim takes up to len(slots) ready tasks, highest priority and oldest
// first, and creates one attempt for each, leased to the worker of its slot
// until now+lease. slots holds a worker id per free slot; several replicas
// may claim at once (FOR UPDATE SKIP LOCKED), each task goes to one of them.
func (s *Store) Claim(ctx context.Context, slots []string, lease time.Duration) ([]Claimed, error) {
	if len(slots) == 0 {
		return nil, nil
	}
	// The claim commits synchronously: attempt ids fence results, and a
	// claim lost in a crash could let the sequence hand the same id out
	// again. BEGIN, the claim and COMMIT travel in one round trip.
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(claimSQL, slots, len(slots), lease.Milliseconds())
	b.Queue("COMMIT")
	br := s.pool.SendBatch(ctx, b)
	var cs []Claimed
	var err error
	if _, err = br.Exec(); err == nil {
		{
			var rows pgx.Rows
			if rows, err = br.Query(); err == nil {
				cs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claimed, error) {
					var c Claimed
					err := r.Scan(&c.Attempt, &c.Worker, &c.TaskID, &c.WorkflowID, &c.Name, &c.Module, &c.Args, &c.Stdin, &c.Priority,
						&c.TimeoutMS, &c.MemoryPages, &c.OutputBytes, &c.LogBytes, &c.CkptMS, &c.Seed, &c.Restore, &c.hasInputs)
					return c, err
				})
			}
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("claim ready tasks: %w", err)
	}
	if len(cs) == 0 {
		return nil, nil
	}
	if err := s.loadInputs(ctx, cs); err != nil {
		return cs, err
	}
	return cs, nil
}

// loadInputs fills in the input files of claimed tasks. Outputs never change
// once written, so this needs no transaction.
func (s *Store) loadInputs(ctx context.Context, cs []Claimed) error {
	var ids []int64
	byTask := make(map[int64]*Claimed, len(cs))
	for i := range cs {
		if cs[i].hasInputs {
			ids = append(ids, cs[i].TaskID)
			byTask[cs[i].TaskID] = &cs[i]
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, `SELECT ti.task_id, ti.name, ti.output, up.name, o.data
		FROM task_inputs ti JOIN tasks up ON up.id = ti.from_task
		LEFT JOIN task_outputs o ON o.task_id = ti.from_task AND o.name = ti.output
		WHERE ti.task_id = ANY($1) ORDER BY ti.task_id, ti.name`, ids)
	if err != nil {
		return fmt.Errorf("load inputs: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var name, output, upstream string
		var data []byte
		if err := rows.Scan(&id, &name, &output, &upstream, &data); err != nil {
			return fmt.Errorf("load inputs: %w", err)
		}
		c := byTask[id]
		if data == nil && c.Missing == "" {
			what := fmt.Sprintf("input %q", name)
			if name == "" {
				what = "stdin"
			}
			c.Missing = fmt.Sprintf("%s: task %q produced no output %q", what, upstream, output)
		}
		if name == "" {
			c.Stdin = data
		} else {
			c.Inputs = append(c.Inputs, Input{Name: name, Data: data})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load inputs: %w", err)
	}
	return nil
}

// claimSQL picks ready tasks in dispatch order, skipping those another
// replica is claiming, marks them running and creates their attempts, one
// per slot ($1: worker ids, one per slot; $2: how many; $3: lease in ms).
const claimSQL = `
WITH slots AS (
	SELECT w, ord FROM unnest($1::uuid[]) WITH ORDINALITY AS s(w, ord)
), picked AS (
	SELECT id, row_number() OVER (ORDER BY sort_key, id) AS rn FROM (
		SELECT id, sort_key FROM tasks WHERE state = 'ready' ORDER BY sort_key, id LIMIT $2 FOR UPDATE SKIP LOCKED
	) p
), upd AS (
	UPDATE tasks t SET state = 'running', attempts = t.attempts + 1, started_at = coalesce(t.started_at, now()), updated_at = now()
	FROM picked WHERE t.id = picked.id
	RETURNING t.id, picked.rn, t.workflow_id, t.name, t.module_id, t.args, t.stdin, t.priority, t.timeout_ms, t.memory_pages,
		t.output_bytes, t.log_bytes, t.ckpt_ms, t.seed, t.checkpoint, t.checkpoint_seq
), ins AS (
	INSERT INTO attempts (task_id, worker_id, lease_until, restored_seq)
	SELECT upd.id, slots.w, now() + $3 * interval '1 millisecond', upd.checkpoint_seq FROM upd JOIN slots ON slots.ord = upd.rn
	RETURNING id, task_id, worker_id
)
SELECT ins.id, ins.worker_id::text, upd.id, upd.workflow_id::text, upd.name, upd.module_id, upd.args, upd.stdin, upd.priority,
	upd.timeout_ms, upd.memory_pages, upd.output_bytes, upd.log_bytes, upd.ckpt_ms, upd.seed, upd.checkpoint,
	EXISTS (SELECT 1 FROM task_inputs ti WHERE ti.task_id = upd.id)
FROM ins JOIN upd ON upd.id = ins.task_id ORDER BY ins.id`
