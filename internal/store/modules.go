package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Module describes a stored task module.
type Module struct {
	ID        string
	Name      string // the file name it was pushed with ("" when not given)
	Size      int
	Imports   []string
	CreatedAt time.Time
}

// PutModule stores a validated module for owner. created is false when the
// owner had already pushed the same bytes.
func (s *Store) PutModule(ctx context.Context, ownerID int64, id string, body []byte, imports []string) (m Module, created bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO modules (id, size, imports, body) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING`,
			id, len(body), imports, body); err != nil {
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
		return m, false, fmt.Errorf("store module %s: %w", id, err)
	}
	return m, created, nil
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
