package server

import (
	"context"
	"net/http"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
)

// A replica remembers the operator keys it accepted, so that the
// operator's machines reconnecting at once cost no query each, and
// remembers no refusal, so that a key made meanwhile works at once.
func TestOperatorKeysAcceptedAreRemembered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	_, wsURL := runServer(t, f)
	db, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	// dial connects with key and returns the HTTP status of the upgrade.
	dial := func(key string) int {
		t.Helper()
		ws, resp, err := websocket.DefaultDialer.DialContext(ctx, wsURL, http.Header{"Authorization": {"Bearer " + key}})
		if err == nil {
			ws.Close()
		}
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		return resp.StatusCode
	}
	if err := f.st.AddOperatorKey(ctx, "key-a"); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name string
		do   func() error
		key  string
		want int
	}{
		{"a known key", nil, "key-a", http.StatusSwitchingProtocols},
		{"the same key, its row gone", func() error {
			_, err := db.Exec(ctx, `DELETE FROM operator_keys`)
			return err
		}, "key-a", http.StatusSwitchingProtocols},
		{"an unknown key", nil, "key-b", http.StatusUnauthorized},
		{"that key, made since", func() error { return f.st.AddOperatorKey(ctx, "key-b") }, "key-b", http.StatusSwitchingProtocols},
	} {
		if step.do != nil {
			if err := step.do(); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
		}
		if got := dial(step.key); got != step.want {
			t.Errorf("%s: status %d, want %d", step.name, got, step.want)
		}
	}
}
