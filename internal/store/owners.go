package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Owner is a project owner, known by a token.
type Owner struct {
	ID   int64
	Name string
}

// NewToken returns a fresh random secret prefixed with prefix.
func NewToken(prefix string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// HashToken is how tokens are kept in the database: only their sha256.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// CreateOwner creates an owner named name and returns its token, which is
// shown once and stored only as a hash.
func (s *Store) CreateOwner(ctx context.Context, name string) (string, error) {
	if name == "" || len(name) > 100 {
		return "", errors.New("create owner: name must be 1 to 100 characters")
	}
	token := NewToken("cp_")
	_, err := s.pool.Exec(ctx, `INSERT INTO owners (name, token_hash) VALUES ($1, $2)`, name, HashToken(token))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return "", fmt.Errorf("create owner: an owner named %q already exists", name)
	}
	if err != nil {
		return "", fmt.Errorf("create owner %q: %w", name, err)
	}
	return token, nil
}

// OwnerByToken finds the owner holding token, or returns ErrNotFound.
func (s *Store) OwnerByToken(ctx context.Context, token string) (Owner, error) {
	var o Owner
	err := s.pool.QueryRow(ctx, `SELECT id, name FROM owners WHERE token_hash = $1`, HashToken(token)).Scan(&o.ID, &o.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return o, ErrNotFound
	}
	if err != nil {
		return o, fmt.Errorf("look up owner token: %w", err)
	}
	return o, nil
}

// SessionGeneration is the owner's dashboard session generation: a session
// made under another one has ended (EndSessions).
func (s *Store) SessionGeneration(ctx context.Context, ownerID int64) (int64, error) {
	var gen int64
	err := s.pool.QueryRow(ctx, `SELECT session_gen FROM owners WHERE id = $1`, ownerID).Scan(&gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("read the session generation of owner %d: %w", ownerID, err)
	}
	return gen, nil
}

// EndSessions ends every dashboard session of the owner, on every replica:
// it moves the owner's session generation on.
func (s *Store) EndSessions(ctx context.Context, ownerID int64) error {
	if _, err := s.pool.Exec(ctx, `UPDATE owners SET session_gen = session_gen + 1 WHERE id = $1`, ownerID); err != nil {
		return fmt.Errorf("end the sessions of owner %d: %w", ownerID, err)
	}
	return nil
}
