package store

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func explain(t *testing.T, tx pgx.Tx, sql string, args ...any) {
	rows, err := tx.Query(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		rows.Scan(&s)
		fmt.Fprintln(os.Stderr, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestZZExplain(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	tasks := make([]NewTask, 20000)
	for i := range tasks {
		tasks[i] = f.task(fmt.Sprintf("t%d", i))
	}
	f.submit(t, "batch", tasks...)
	var cs []Claimed
	for range 20 {
		cs = append(cs, f.claim(t, 100, time.Minute)...)
	}
	// complete 1000 the normal way to get churn
	comps := make([]Completion, 0)
	for _, c := range cs[:1000] {
		comps = append(comps, ok(c, ""))
	}
	if _, err := f.s.Complete(ctx, comps); err != nil {
		t.Fatal(err)
	}
	cs = cs[1000:]
	n := 100
	ids := make([]int64, n)
	workers := make([]string, n)
	oks := make([]bool, n)
	logs := make([][]byte, n)
	reasons := make([]string, n)
	for i := range n {
		ids[i], workers[i], oks[i], logs[i] = cs[i].Attempt, cs[i].Worker, true, []byte{}
	}
	tx, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tx.Exec(ctx, hotPathSettingsSQL)
	fmt.Fprintln(os.Stderr, "=== completeAttemptsSQL")
	explain(t, tx, completeAttemptsSQL, ids, uuidParams(workers), oks, logs, reasons)
	var tids []int64
	for i := range n {
		tids = append(tids, cs[i].TaskID)
	}
	fmt.Fprintln(os.Stderr, "=== insertOutputs")
	names := make([]string, n)
	datas := make([][]byte, n)
	for i := range names {
		names[i] = "stdout"
		datas[i] = []byte{}
	}
	explain(t, tx, insertOutputsSQL, tids, names, datas)
	fmt.Fprintln(os.Stderr, "=== doneSQL")
	explain(t, tx, doneSQL, tids, int64(0), ChannelReady)
	// claim
	cands, err := f.s.Candidates(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	var ptasks []int64
	var pw []string
	var ck []int64
	var solo []bool
	for _, c := range cands[:64] {
		ptasks = append(ptasks, c.TaskID)
		pw = append(pw, f.worker)
		ck = append(ck, 0)
		solo = append(solo, false)
	}
	fmt.Fprintln(os.Stderr, "=== claim")
	explain(t, tx, claimPicksSQL, ptasks, uuidParams(pw), ck, solo, int64(60000))
}
