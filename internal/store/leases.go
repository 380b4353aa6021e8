package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Renewal is one running attempt reported in a heartbeat.
type Renewal struct {
	Attempt  int64
	Worker   string
	Progress float64
}

// Renew extends the leases of a batch of attempts to now+lease and records
// their progress. It returns the attempts of the batch that are no longer
// running on the worker that reported them: the worker must stop those.
func (s *Store) Renew(ctx context.Context, rs []Renewal, lease time.Duration) (lost []int64, err error) {
	if len(rs) == 0 {
		return nil, nil
	}
	slices.SortFunc(rs, func(a, b Renewal) int { return int(a.Attempt - b.Attempt) })
	ids := make([]int64, len(rs))
	workers := make([]string, len(rs))
	progress := make([]float32, len(rs))
	for i, r := range rs {
		ids[i], workers[i], progress[i] = r.Attempt, r.Worker, float32(r.Progress)
	}
	// A renewal need not survive a crash (the lease would lapse a little
	// sooner), so it commits without waiting for the WAL flush.
	var held []int64
	err = s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE attempts a SET lease_until = now() + $4 * interval '1 millisecond', progress = u.p
			FROM unnest($1::bigint[], $2::uuid[], $3::real[]) AS u(id, w, p)
			WHERE a.id = u.id AND a.worker_id = u.w AND a.state = 'running' RETURNING a.id`, ids, uuidParams(workers), progress, lease.Milliseconds())
		if err != nil {
			return err
		}
		held, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(rs), err)
	}
	slices.Sort(held)
	for _, id := range ids {
		if _, ok := slices.BinarySearch(held, id); !ok {
			lost = append(lost, id)
		}
	}
	return lost, nil
}

// SaveCheckpoint stores state as the latest checkpoint of the task of
// attempt, if the attempt still runs on worker, and renews its lease. It
// returns false when the attempt no longer holds its lease.
func (s *Store) SaveCheckpoint(ctx context.Context, attempt int64, worker string, state []byte, lease time.Duration) (bool, error) {
	var saved bool
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var task int64
		err := tx.QueryRow(ctx, `UPDATE attempts SET lease_until = now() + $3 * interval '1 millisecond'
			WHERE id = $1 AND worker_id = $2 AND state = 'running' RETURNING task_id`, attempt, worker, lease.Milliseconds()).Scan(&task)
		if err == pgx.ErrNoRows {
			saved = false
			return nil
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE tasks SET checkpoint = $2, checkpoint_seq = checkpoint_seq + 1, checkpoint_at = now(), updated_at = now()
			WHERE id = $1`, task, state)
		saved = err == nil
		return err
	})
	if err != nil {
		return false, fmt.Errorf("save checkpoint of attempt %d: %w", attempt, err)
	}
	return saved, nil
}

// ExpireLeases ends running attempts whose lease has lapsed as lost and
// queues their tasks again (from their latest checkpoint), or fails them
// after their last attempt. It handles at most limit attempts per call and
// returns how many it ended.
func (s *Store) ExpireLeases(ctx context.Context, limit int) (int, error) {
	n := 0
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, hotPathSettingsSQL); err != nil {
			return err
		}
		// running_attempts lists the attempts that may still run; those
		// that ended (or are gone) are deleted from it here, in the same
		// pass.
		if _, err := tx.Exec(ctx, `DELETE FROM running_attempts r
			WHERE NOT EXISTS (SELECT 1 FROM attempts a WHERE a.id = r.attempt_id AND a.state = 'running')`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE attempts a SET state = 'lost', ended_at = now(),
				reason = 'lost: no heartbeat from worker ' || a.worker_id::text || ' before the lease expired'
			WHERE a.id IN (SELECT x.id FROM running_attempts r JOIN attempts x ON x.id = r.attempt_id
				WHERE x.state = 'running' AND x.lease_until < now()
				ORDER BY x.id LIMIT $1 FOR UPDATE OF x SKIP LOCKED)
			RETURNING a.task_id, a.reason, a.worker_id::text`, limit)
		if err != nil {
			return err
		}
		var ends []attemptEnd
		lostBy := map[string]int{}
		for rows.Next() {
			var e attemptEnd
			var w string
			if err := rows.Scan(&e.task, &e.reason, &w); err != nil {
				rows.Close()
				return err
			}
			ends = append(ends, e)
			lostBy[w]++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		n = len(ends)
		if n == 0 {
			return nil
		}
		ws := make([]string, 0, len(lostBy))
		for w := range lostBy {
			ws = append(ws, w)
		}
		slices.Sort(ws)
		counts := make([]int32, len(ws))
		for i, w := range ws {
			counts[i] = int32(lostBy[w])
		}
		if _, err := tx.Exec(ctx, `UPDATE workers w SET tasks_lost = w.tasks_lost + c.n
			FROM unnest($1::uuid[], $2::int[]) AS c(id, n) WHERE w.id = c.id`, ws, counts); err != nil {
			return err
		}
		return s.settleEnds(ctx, tx, ends)
	})
	if err != nil {
		return 0, fmt.Errorf("expire leases: %w", err)
	}
	return n, nil
}

// TryLead makes holder the leader called name until now+ttl if nobody else
// holds an unexpired lead, or extends holder's own lead. It reports whether
// holder leads.
func (s *Store) TryLead(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	var got string
	err := s.pool.QueryRow(ctx, `INSERT INTO leaders (name, holder, expires_at) VALUES ($1, $2, now() + $3 * interval '1 millisecond')
		ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
		WHERE leaders.holder = EXCLUDED.holder OR leaders.expires_at < now()
		RETURNING holder`, name, holder, ttl.Milliseconds()).Scan(&got)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("elect %s leader: %w", name, err)
	}
	return got == holder, nil
}

// Resign gives up holder's lead, so that another replica takes over at once.
func (s *Store) Resign(ctx context.Context, name, holder string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM leaders WHERE name = $1 AND holder = $2`, name, holder)
	if err != nil {
		return fmt.Errorf("resign %s lead: %w", name, err)
	}
	return nil
}
