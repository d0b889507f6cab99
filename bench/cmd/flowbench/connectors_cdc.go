package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowrun/flowrun/internal/pgtest"
)

// The CDC scenario: flowrun's postgres_cdc source on a private PostgreSQL with wal_level = logical
// (the machine's server does not have it), started once by the tests' own harness, pgtest.

const cdcHCL = `# Written by flowbench: a table's changes into a topic of 4 partitions.
pipeline "bench" {
  key_prefix = "fb"
}
variable "dsn" { default = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" } # the harness sets its server
source "cdc" {
  kind   = "postgres_cdc"
  dsn    = var.dsn
  tables = ["public.cdc_rows"]
  slot   = "flowbench"
  output = topic.changes
}
topic "changes" { partitions = 4 }
`

// cdcTxRows is the number of rows of each of the writer's transactions.
const cdcTxRows = 100

// privatePostgres is a PostgreSQL of the harness's own. pgtest is written for tests: tb stands in
// for their testing.TB, turning a failure into a panic that start recovers, and keeping the
// cleanups (the server's stop and its directory's removal) for the harness's end.
type privatePostgres struct {
	srv *pgtest.Server
	tb  *harnessTB
}

type harnessTB struct {
	testing.TB // never called: every method pgtest uses is below
	cleanups   []func()
}

type tbFailure string

func (t *harnessTB) Helper()           {}
func (t *harnessTB) Cleanup(f func())  { t.cleanups = append(t.cleanups, f) }
func (t *harnessTB) Fatal(args ...any) { panic(tbFailure(fmt.Sprint(args...))) }
func (t *harnessTB) Fatalf(format string, args ...any) {
	panic(tbFailure(fmt.Sprintf(format, args...)))
}
func (t *harnessTB) Skipf(format string, args ...any) { panic(tbFailure(fmt.Sprintf(format, args...))) }

// privatePG starts the private PostgreSQL at first use.
func (h *harness) privatePG() (pg *privatePostgres, err error) {
	if h.pg != nil {
		return h.pg, nil
	}
	tb := &harnessTB{}
	h.cleanups = append(h.cleanups, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	})
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(tbFailure)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("a PostgreSQL with wal_level = logical: %s", string(f))
		}
	}()
	h.pg = &privatePostgres{srv: pgtest.Start(tb), tb: tb}
	return h.pg, nil
}

// runCDC starts the source on an empty table, inserts a warm-up's rows and waits for their
// changes, stops the process (SIGSTOP), commits cfg.flat/2 rows in transactions of cdcTxRows,
// and times from the process's resumption until the topic holds every change.
func (h *harness) runCDC(ctx context.Context, sc scenario) (res result) {
	pg, err := h.privatePG()
	if err != nil {
		return result{failed: err.Error()}
	}
	dsn := pg.srv.DSN("postgres")
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return result{failed: err.Error()}
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// A run starts on an empty Redis (FLUSHALL): the slot of the last run goes too.
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'flowbench'`); err != nil {
		return result{failed: err.Error()}
	}
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS cdc_rows; CREATE TABLE cdc_rows (id int PRIMARY KEY, k text NOT NULL, amount int NOT NULL, note text)`); err != nil {
		return result{failed: err.Error()}
	}
	c, err := startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(), "--var", "dsn="+dsn)
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	entries := func() (int, error) {
		n := 0
		for p := range 4 {
			l, err := h.rdb.XLen(ctx, fmt.Sprintf("%s:{changes:%d}", fwPrefix, p)).Result()
			if err != nil {
				return 0, err
			}
			n += int(l)
		}
		return n, nil
	}
	until := func(want int, deadline time.Duration) error {
		for end := time.Now().Add(deadline); ; time.Sleep(10 * time.Millisecond) {
			n, err := entries()
			if err != nil || n >= want {
				return err
			}
			if c.exited() {
				return fmt.Errorf("the process exited: %s", c.logTail())
			}
			if time.Now().After(end) {
				return fmt.Errorf("%d of %d changes within %s", n, want, deadline)
			}
		}
	}
	insert := func(from, n int) error {
		for i := from; i < from+n; i += cdcTxRows {
			if _, err := conn.Exec(ctx, `INSERT INTO cdc_rows SELECT i, 'k' || (i % 1000), i % 10000, 'row ' || i FROM generate_series($1::int, $2::int) i`,
				i, min(i+cdcTxRows, from+n)-1); err != nil {
				return err
			}
		}
		return nil
	}
	// The slot exists once the source streams: a warm-up's changes arrive.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var active bool
		err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = 'flowbench'`).Scan(&active)
		if err != nil {
			return result{failed: err.Error()}
		}
		if active {
			break
		}
		if c.exited() || time.Now().After(deadline) {
			return result{failed: "the slot is not active: " + c.logTail()}
		}
	}
	warm, flat := h.cfg.warm, h.cfg.flat/2
	if err := insert(0, warm); err != nil {
		return result{failed: err.Error()}
	}
	if err := until(warm, time.Minute); err != nil {
		return result{failed: "warm-up: " + err.Error()}
	}
	if err := c.pause(); err != nil {
		return result{failed: err.Error()}
	}
	if err := insert(warm, flat); err != nil {
		return result{failed: err.Error()}
	}
	cpu0 := h.cpus(c)
	t0 := time.Now()
	if err := c.signal(syscall.SIGCONT); err != nil {
		return result{failed: err.Error()}
	}
	if err := until(warm+flat, 5*time.Minute); err != nil {
		return result{failed: err.Error()}
	}
	res = h.measured(c, flat, t0, time.Now(), cpu0)
	if n, err := entries(); err != nil || n != warm+flat {
		return result{failed: fmt.Sprintf("%d changes in the topic (%v), want %d", n, err, warm+flat)}
	}
	res.note("changes/s, in transactions of %d rows", cdcTxRows)
	return res
}
