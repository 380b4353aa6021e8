package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cyclepool/cyclepool/internal/pgembed"
	"github.com/cyclepool/cyclepool/internal/store"
)

// runToken creates owner tokens, directly in the database.
func runToken(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "create" {
		return errors.New("usage: cyclepool token create NAME [--data-dir DIR | --database-url URL]")
	}
	fs := flag.NewFlagSet("token create", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	dataDir := fs.String("data-dir", "data", "data dir of a server using the embedded PostgreSQL")
	if _, err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: cyclepool token create NAME")
	}
	if *dbURL == "" {
		u, stop, err := embeddedURL(ctx, filepath.Join(*dataDir, "postgres"))
		if err != nil {
			return err
		}
		defer stop()
		*dbURL = u
	}
	st, err := store.Open(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer st.Close()
	tok, err := st.CreateOwner(ctx, fs.Arg(0))
	if err != nil {
		return err
	}
	fmt.Println(tok)
	return nil
}

// embeddedURL connects to the embedded cluster of a data dir: the running
// one when a server holds it, else one started for this command.
func embeddedURL(ctx context.Context, dir string) (string, func(), error) {
	port, err1 := os.ReadFile(filepath.Join(dir, "port"))
	pw, err2 := os.ReadFile(filepath.Join(dir, "password"))
	c, err := pgembed.Start(ctx, pgembed.Config{Dir: dir})
	if err == nil {
		return c.URL(), func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Stop(sctx)
		}, nil
	}
	if !strings.Contains(err.Error(), "in use") || err1 != nil || err2 != nil {
		return "", nil, fmt.Errorf("open the embedded PostgreSQL in %s: %w", dir, err)
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(pgembed.Role, strings.TrimSpace(string(pw))),
		Host: "127.0.0.1:" + strings.TrimSpace(string(port)), Path: "/" + pgembed.Database, RawQuery: "sslmode=disable"}
	return u.String(), func() {}, nil
}
