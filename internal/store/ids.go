package store

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// idBlock holds attempt ids drawn from attempts_id_seq ahead of the
// claims that use them (CreateWorkflowClaiming's early send, whose
// attempts go out before the claim runs), a block at a time: one round
// trip every idBlockSize attempts rather than one per submission. An id
// drawn is used at most once, or never (a server that stops leaves the
// rest of its block unused), and is never drawn again: a crash of
// PostgreSQL that takes back the sequence's advance moves the sequence
// past it (guardAttemptIDs).
type idBlock struct {
	mu  sync.Mutex
	ids []int64 // ascending
}

// idBlockSize is how many attempt ids an idBlock draws at a time.
const idBlockSize = 64

// reserveAttemptIDsSQL draws $1 attempt ids.
const reserveAttemptIDsSQL = `SELECT ARRAY(SELECT nextval('attempts_id_seq') FROM generate_series(1, $1))`

// take returns n attempt ids, ascending, all above newerThan: a block
// whose next id is not above it (drawn before an attempt that a worker
// holds now) is left unused, and a new one drawn, whose ids are above
// every id drawn before.
func (b *idBlock) take(ctx context.Context, pool *pgxpool.Pool, n int, newerThan int64) ([]int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.ids) < n || b.ids[0] <= newerThan {
		var ids []int64
		if err := pool.QueryRow(ctx, reserveAttemptIDsSQL, max(n, idBlockSize)).Scan(&ids); err != nil {
			return nil, fmt.Errorf("reserve attempt ids: %w", err)
		}
		slices.Sort(ids)
		b.ids = ids
	}
	ids := b.ids[:n:n]
	b.ids = b.ids[n:]
	return ids, nil
}
