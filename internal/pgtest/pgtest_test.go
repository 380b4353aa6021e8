package pgtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func dbOf(t *testing.T, url string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var name string
	var tables int
	if err := conn.QueryRow(ctx, "SELECT current_database(), (SELECT count(*) FROM pg_tables WHERE schemaname = 'public')").Scan(&name, &tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("database %s is not empty: %d tables", name, tables)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v int)"); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestFreshDatabases(t *testing.T) {
	t0 := time.Now()
	a := URL(t)
	t.Logf("first URL (server start included): %s", time.Since(t0))
	t0 = time.Now()
	b := URL(t)
	t.Logf("second URL: %s", time.Since(t0))
	if a == b {
		t.Fatal("same URL twice")
	}
	na, nb := dbOf(t, a), dbOf(t, b)
	if na == nb || !strings.HasPrefix(na, "t_testfreshdatabases_") {
		t.Errorf("names %s %s", na, nb)
	}
}

func TestDroppedAfterTest(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		name = dbOf(t, URL(t))
		// An open connection must not keep the database from being dropped.
		conn, err := pgx.Connect(context.Background(), URL(t))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn
	})
	s, err := get()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %s still exists", name)
	}
}

func TestParallel(t *testing.T) {
	for i := 0; i < 8; i++ {
		t.Run("p", func(t *testing.T) {
			t.Parallel()
			dbOf(t, URL(t))
		})
	}
}

func TestNames(t *testing.T) {
	n := dbName("TestX/with spaces and a very long name that goes on and on and on and on")
	if len(n) > 63 || !strings.HasPrefix(n, "t_testx_with_spaces") {
		t.Errorf("name %q (%d bytes)", n, len(n))
	}
	u, err := withDatabase("postgres://u:p@h:5/postgres?sslmode=disable&dbname=x", "t_1")
	if err != nil || u != "postgres://u:p@h:5/t_1?sslmode=disable" {
		t.Errorf("url %q %v", u, err)
	}
	if u, _ := withDatabase("host=/tmp user=u", "t_1"); u != "host=/tmp user=u dbname=t_1" {
		t.Errorf("dsn %q", u)
	}
}

// Databases made with Template start as copies of one prepared once: each
// holds what prepare made, and a change in one is not in another.
func TestTemplate(t *testing.T) {
	prepared := 0
	prepare := func(ctx context.Context, url string) error {
		prepared++
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE TABLE migrated (v int); INSERT INTO migrated VALUES (1)")
		return err
	}
	rows := func(url string) int {
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var n int
		if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM migrated").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(context.Background(), "INSERT INTO migrated VALUES (2)"); err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, b := Template(t, "test", prepare), Template(t, "test", prepare)
	if a == b {
		t.Fatal("same URL twice")
	}
	if na, nb := rows(a), rows(b); na != 1 || nb != 1 {
		t.Errorf("the copies held %d and %d rows, want the template's 1 each", na, nb)
	}
	if prepared != 1 {
		t.Errorf("prepare ran %d times, want once", prepared)
	}
}
