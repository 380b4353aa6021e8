package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Module describes a stored task module.
type Module struct {
	ID        string
	Name      string // the file name it was pushed with ("" when not given)
	Size      int
	Imports   []string
	CreatedAt time.Time
}

// PutModule stores a validated module for owner, who may keep quota bytes
// in blobs and modules. created is false when the owner had already pushed
// the same bytes. A module new to the owner fails with a *QuotaError when
// its bytes would take the owner past its quota; one the owner keeps
// already (on its list, or used by one of its workflows) costs nothing.
func (s *Store) PutModule(ctx context.Context, ownerID, quota int64, id string, body []byte, imports []string) (m Module, created bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		// Pushes of one owner at once (modules, and data: BeginBlobUpload)
		// would each count the others out.
		if _, err := tx.Exec(ctx, lockOwnerSQL, ownerID); err != nil {
			return err
		}
		var held bool
		var used int64
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM owner_modules WHERE owner_id = $1 AND module_id = $2)
				OR EXISTS (SELECT 1 FROM workflows w JOIN workflow_modules wm ON wm.workflow_id = w.id WHERE w.owner_id = $1 AND wm.module_id = $2),
			(`+ownerBytesSQL("$1", "''")+`)`, ownerID, id).Scan(&held, &used); err != nil {
			return err
		}
		if !held && used+int64(len(body)) > quota {
			return &QuotaError{Quota: quota, Used: used, Size: int64(len(body))}
		}
		if err := insertModule(ctx, tx, id, body, imports); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO owner_modules (owner_id, module_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, ownerID, id)
		if err != nil {
			return err
		}
		created = tag.RowsAffected() == 1
		return tx.QueryRow(ctx, `SELECT m.id, om.name, m.size, m.imports, om.created_at FROM modules m JOIN owner_modules om ON om.module_id = m.id
			WHERE m.id = $1 AND om.owner_id = $2`, id, ownerID).Scan(&m.ID, &m.Name, &m.Size, &m.Imports, &m.CreatedAt)
	})
	if err != nil {
		var qe *QuotaError
		if errors.As(err, &qe) {
			return m, false, err
		}
		return m, false, fmt.Errorf("store module %s: %w", id, err)
	}
	return m, created, nil
}

// insertModule makes sure module id's row is there, and keeps it there for
// the rest of tx (FOR KEY SHARE: dropUnusedModules waits for tx before it
// decides whether anything holds the module). The row may be going at the
// same time, deleted by another owner's RemoveModule: it is then written
// again.
func insertModule(ctx context.Context, tx pgx.Tx, id string, body []byte, imports []string) error {
	for range 3 {
		if _, err := tx.Exec(ctx, `INSERT INTO modules (id, size, imports, body) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING`,
			id, len(body), imports, body); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `SELECT 1 FROM modules WHERE id = $1 FOR KEY SHARE`, id).Scan(new(int))
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	return errors.New("the module was deleted three times while it was stored")
}

// RemoveModule takes module id off the owner's list (and out of its
// quota), or returns ErrNotFound, whether or not another owner has it. The
// module is deleted once nothing holds it any more: at once when no other
// owner lists it and no workflow uses it, else when the last of these
// goes (another owner's RemoveModule, or DeleteWorkflow). While one of
// the owner's workflows uses it, it still counts against the owner's
// quota.
func (s *Store) RemoveModule(ctx context.Context, ownerID int64, id string) error {
	if !ValidText(id) {
		return ErrNotFound
	}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockOwnerSQL, ownerID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM owner_modules WHERE owner_id = $1 AND module_id = $2`, ownerID, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		return dropUnusedModules(ctx, tx, []string{id})
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("remove module %s: %w", id, err)
	}
	return err
}

// moduleUnused is the condition on a modules row m that nothing holds it:
// no owner lists it and no workflow uses it (a workflow's tasks use only
// its workflow's modules).
const moduleUnused = `NOT EXISTS (SELECT 1 FROM owner_modules om WHERE om.module_id = m.id)
	AND NOT EXISTS (SELECT 1 FROM workflow_modules wm WHERE wm.module_id = m.id)`

// dropUnusedModules deletes those of the modules ids that nothing holds, in
// tx. The foreign keys of workflow_modules and owner_modules would refuse
// the delete of a module in use, failing tx; so the modules that look
// unused are locked first, which waits for the transactions that are
// taking one up (their key checks hold it FOR KEY SHARE: insertModule,
// CreateWorkflow), and are looked at again by a statement of its own (in
// READ COMMITTED, it sees what those committed). A transaction that takes
// up a module after the lock waits for tx, and finds it gone.
func dropUnusedModules(ctx context.Context, tx pgx.Tx, ids []string) error {
	rows, err := tx.Query(ctx, `SELECT id FROM modules m WHERE id = ANY($1) AND `+moduleUnused+` ORDER BY id FOR UPDATE`, ids)
	if err != nil {
		return err
	}
	unused, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(unused) == 0 {
		return err
	}
	_, err = tx.Exec(ctx, `DELETE FROM modules m WHERE id = ANY($1) AND `+moduleUnused, unused)
	return err
}

// NameModule sets the file name the owner pushed module id with.
func (s *Store) NameModule(ctx context.Context, ownerID int64, id, name string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE owner_modules SET name = $3 WHERE owner_id = $1 AND module_id = $2`, ownerID, id, name); err != nil {
		return fmt.Errorf("name module %s: %w", id, err)
	}
	return nil
}

// Modules lists the modules an owner has pushed, newest first.
func (s *Store) Modules(ctx context.Context, ownerID int64) ([]Module, error) {
	rows, err := s.pool.Query(ctx, `SELECT m.id, om.name, m.size, m.imports, om.created_at FROM modules m JOIN owner_modules om ON om.module_id = m.id
		WHERE om.owner_id = $1 ORDER BY om.created_at DESC, m.id`, ownerID)
	if err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Module, error) {
		var m Module
		err := r.Scan(&m.ID, &m.Name, &m.Size, &m.Imports, &m.CreatedAt)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	return ms, nil
}

// ModuleSize returns the length of module id's body, without reading it,
// or ErrNotFound.
func (s *Store) ModuleSize(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT size FROM modules WHERE id = $1`, id).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("read the size of module %s: %w", id, err)
	}
	return n, nil
}

// ModuleBody returns the bytes of a module, or ErrNotFound.
func (s *Store) ModuleBody(ctx context.Context, id string) ([]byte, error) {
	var body []byte
	err := s.pool.QueryRow(ctx, `SELECT body FROM modules WHERE id = $1`, id).Scan(&body)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", id, err)
	}
	return body, nil
}

// MissingModules returns those of ids that the owner has not pushed.
func (s *Store) MissingModules(ctx context.Context, ownerID int64, ids []string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT u.id FROM unnest($2::text[]) AS u(id)
		WHERE NOT EXISTS (SELECT 1 FROM owner_modules om WHERE om.owner_id = $1 AND om.module_id = u.id)`, ownerID, ids)
	if err != nil {
		return nil, fmt.Errorf("check modules: %w", err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("check modules: %w", err)
	}
	return missing, nil
}

// ModuleGone reports whether err is that of a workflow written with a
// module that no longer exists: removed (RemoveModule) and deleted after
// the owner was found to have it.
func ModuleGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503" && pgErr.ConstraintName == "workflow_modules_module_id_fkey"
}
