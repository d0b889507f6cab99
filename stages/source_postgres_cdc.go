// This file holds the postgres_cdc source kind: its registration, spec and checks, and its set-up
// (the tables, the publication, the replication slot) and snapshot. The replication stream is read
// in pgcdc_stream.go, and rows are decoded in pgcdc_values.go.

package stages

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/flowrun/flowrun/flow"
)

// The postgres_cdc source's attributes.
const (
	cdcSourceFieldDSN            = "dsn"
	cdcSourceFieldTables         = "tables"
	cdcSourceFieldSlot           = "slot"
	cdcSourceFieldPublication    = "publication"
	cdcSourceFieldSnapshot       = "snapshot"
	cdcSourceFieldStatusInterval = "status_interval"
)

// The postgres_cdc source captures the changes of PostgreSQL tables through logical replication
// (the pgoutput plugin): a message per inserted, updated or deleted row, and first, with snapshot,
// one per row the tables hold. See docs/connectors.md.
//
// What it has written to Redis is what it confirms to PostgreSQL: its recorded position (the end
// LSN of the last transaction whose messages are written, Origin.Position, which the runtime
// records with them) is what it reports to the slot as flushed, so that PostgreSQL keeps the WAL of
// everything that is not yet in Redis, and a restarted process resumes at the transaction after it.
// Each message's Origin.ID is its transaction's commit LSN and its index in the transaction, the
// same every time the transaction is read: effectively-once delivery writes it once.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "postgres_cdc",
			Doc: "Captures the changes of PostgreSQL tables through logical replication: a message {op, table, key, " +
				"before, after, lsn, committed_at} per inserted, updated or deleted row, in commit order, keyed by the " +
				"table and the row's primary key; first, with snapshot, a message per row the tables hold. The slot " +
				"confirms only what Redis has: a crash or an outage loses nothing. See docs/connectors.md for what the " +
				"database needs.",
			Attributes: []flow.Attribute{
				{Name: cdcSourceFieldDSN, Type: flow.TypeString, Required: true,
					Doc: "The connection string (a URL or key=value pairs) of the database, as a role with the REPLICATION " +
						"attribute. Its password never appears in output."},
				{Name: cdcSourceFieldTables, Type: flow.TypeStringList, Required: true,
					Doc: "The tables to capture, as schema.name or name (found on the search path)."},
				{Name: cdcSourceFieldSlot, Type: flow.TypeString, Required: true,
					Doc: "The logical replication slot, created with the pgoutput plugin if absent: lower-case letters, " +
						"digits and underscores. Drop it when the pipeline is retired (docs/connectors.md)."},
				{Name: cdcSourceFieldPublication, Type: flow.TypeString,
					Doc: "The publication of the tables, created if absent, and given the tables it lacks; default: the slot's name."},
				{Name: cdcSourceFieldSnapshot, Type: flow.TypeBool, Default: true,
					Doc: "When the slot is created, first emit the tables' current rows (op \"snapshot\"), then their changes from there."},
				{Name: cdcSourceFieldStatusInterval, Type: flow.TypeDuration, Default: 10 * time.Second,
					Doc: "How often the source tells PostgreSQL how far Redis has its changes (and so which WAL it may recycle)."},
			},
			Example: `source "shop_changes" {
  kind     = "postgres_cdc"
  dsn      = var.dsn
  tables   = ["public.orders", "public.customers"]
  slot     = "flowrun_shop"
  snapshot = true
  output   = topic.changes
}`,
			Detail: func(c flow.Attrs) string {
				return "postgres_cdc: " + strings.Join(c.Strings(cdcSourceFieldTables), ", ")
			},
			Check: checkCDCSource,
		},
		Traits: SourceTraits{Resumes: true, Finite: func(flow.Attrs) (bool, int64) { return false, -1 }},
		New:    newCDCSource,
	})
}

// cdcName is what a slot's name may be (PostgreSQL's rule), and what the source takes for a
// publication's, which it writes into commands unquoted.
var cdcName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

func checkCDCSource(c *flow.KindCheck) {
	if c.Config.Has(cdcSourceFieldDSN) {
		cfg, err := pgx.ParseConfig(c.Config.String(cdcSourceFieldDSN))
		if err != nil {
			c.Errorf(cdcSourceFieldDSN, "Invalid dsn", "The connection string cannot be read: write a URL (postgres://user:password@host/db) or key=value pairs.")
		} else {
			c.Secret(cfg.Password)
		}
	}
	for _, name := range []string{cdcSourceFieldSlot, cdcSourceFieldPublication} {
		if c.Config.Has(name) && !cdcName.MatchString(c.Config.String(name)) {
			c.Errorf(name, "Invalid "+name, "%q is not a %s name PostgreSQL takes: use 1 to 63 lower-case letters, digits and underscores.",
				c.Config.String(name), name)
		}
	}
	if c.Config.Has(cdcSourceFieldTables) {
		tables := c.Config.Strings(cdcSourceFieldTables)
		if len(tables) == 0 {
			c.Errorf(cdcSourceFieldTables, "No tables", "Name at least one table to capture, such as tables = [\"public.orders\"].")
		}
		for _, t := range tables {
			if _, _, err := splitTable(t); err != nil {
				c.Errorf(cdcSourceFieldTables, "Invalid table", "%s", err)
			}
		}
	}
	if c.Config.Duration(cdcSourceFieldStatusInterval) < 100*time.Millisecond {
		c.Errorf(cdcSourceFieldStatusInterval, "Invalid status_interval", "Give a duration of 100ms or more, well under the server's wal_sender_timeout (60s by default).")
	}
}

func newCDCSource(s *flow.Source, env Env) (Source, error) {
	c := s.Config
	dsn := c.String(cdcSourceFieldDSN)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("the dsn is not a PostgreSQL connection string")
	}
	redact := env.Redact
	if redact == nil {
		redact = func(s string) string { return s }
	}
	password := cfg.Password
	k := &cdcSource{
		dsn: dsn, tables: c.Strings(cdcSourceFieldTables), slot: c.String(cdcSourceFieldSlot), publication: c.String(cdcSourceFieldSlot),
		snapshot: c.Bool(cdcSourceFieldSnapshot), status: c.Duration(cdcSourceFieldStatusInterval), clock: env.Clock, log: env.Logger,
		redact: func(text string) string {
			if len(password) > 0 {
				text = strings.ReplaceAll(text, password, "(password)")
			}
			return redact(text)
		},
	}
	if c.Has(cdcSourceFieldPublication) {
		k.publication = c.String(cdcSourceFieldPublication)
	}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	k.log = k.log.With("source", s.Name, "slot", k.slot)
	if k.clock == nil {
		k.clock = SystemClock{}
	}
	return k, nil
}

// cdcSource is a postgres_cdc source.
type cdcSource struct {
	dsn         string
	tables      []string
	slot        string
	publication string
	snapshot    bool
	status      time.Duration
	clock       Clock
	log         *slog.Logger
	redact      func(string) string
}

// cdcPosition is the source's recorded position.
type cdcPosition struct {
	Slot string `json:"slot"`
	// LSN is where streaming starts again: the end of the last transaction written, or the slot's
	// consistent point before the first.
	LSN string `json:"lsn"`
	// Snapshot names the snapshot being read (the epoch in its messages' IDs) until it is complete;
	// "" after, or when none is taken.
	Snapshot string `json:"snapshot,omitempty"`
}

func (p cdcPosition) String() string {
	b, _ := json.Marshal(p) // strings only
	return string(b)
}

// cdcRun is the state of a source's run that outlives its sessions (a session ends when the
// connection to PostgreSQL fails, and the next one starts where the last stopped).
type cdcRun struct {
	// pos is where the next session starts: the position of the last message emitted (which the
	// runtime will write, unless the process dies, when Resume has where to start); nil when there
	// is none yet.
	pos *cdcPosition
	// emitted: the run has emitted messages (a slot that disappears after that is an error).
	emitted bool
	// skipLSN and skipN: the first skipN messages of the transaction committed at skipLSN were
	// emitted, and not the transaction's last: a session that reads it again skips them.
	skipLSN pglogrepl.LSN
	skipN   int
}

// cdcEmitError is an error of the Emitter, which the source returns as it is (the run stops, or the
// source's lease was lost).
type cdcEmitError struct{ err error }

func (e cdcEmitError) Error() string { return e.err.Error() }
func (e cdcEmitError) Unwrap() error { return e.err }

// cdcConfigError is a problem with the source's configuration or the database's, which waiting does
// not mend: it ends the run.
type cdcConfigError struct{ msg string }

func (e cdcConfigError) Error() string { return e.msg }

// The waits between sessions that failed.
const (
	cdcRetryFirst   = 500 * time.Millisecond
	cdcRetryLongest = 30 * time.Second
)

func (s *cdcSource) Produce(ctx context.Context, out Emitter) error {
	run := &cdcRun{}
	raw, found, err := out.Resume(ctx)
	if err != nil {
		return err
	}
	if found {
		var pos cdcPosition
		if err := json.Unmarshal([]byte(raw), &pos); err != nil {
			s.log.Warn("postgres_cdc: the recorded position cannot be read; starting from the slot", "err", err)
		} else if pos.Slot != s.slot {
			s.log.Info("postgres_cdc: the recorded position is another slot's; starting from this slot", "recorded_slot", pos.Slot)
		} else {
			run.pos = &pos
		}
	}
	wait := cdcRetryFirst
	for {
		progressed, err := s.session(ctx, out, run)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var emitErr cdcEmitError
		var cfgErr cdcConfigError
		switch {
		case errors.As(err, &emitErr):
			return emitErr.err
		case errors.As(err, &cfgErr), cdcPermanent(err):
			return errors.New(s.redact("postgres_cdc: " + err.Error()))
		}
		if progressed {
			wait = cdcRetryFirst
		}
		s.log.Warn("postgres_cdc: the database connection failed; trying again", "err", s.redact(err.Error()), "in", wait)
		if err := Sleep(ctx, s.clock, wait); err != nil {
			return err
		}
		wait = min(2*wait, cdcRetryLongest)
	}
}

// cdcPermanent reports whether an error of PostgreSQL is one that waiting does not mend: a refused
// login, a missing database, table or privilege, a server without wal_level = logical.
func cdcPermanent(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch {
	case strings.HasPrefix(pg.Code, "28"), strings.HasPrefix(pg.Code, "3D"), strings.HasPrefix(pg.Code, "42"), strings.HasPrefix(pg.Code, "0A"):
		return true
	case pg.Code == "55000": // object_not_in_prerequisite_state: wal_level, a slot of another plugin
		return true
	}
	return false
}

// cdcTable is a captured table as the database has it.
type cdcTable struct {
	name   string // schema.name, as the relation messages name it
	quoted string
	key    []string // the primary key's columns (or the replica identity index's); nil: none
}

// connConfig is the connection's configuration, with the session settings that the values'
// decoding expects; replication makes it a replication connection.
func (s *cdcSource) connConfig(replication bool) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(s.dsn)
	if err != nil {
		return nil, cdcConfigError{"the dsn is not a PostgreSQL connection string"}
	}
	cfg.RuntimeParams["DateStyle"] = "ISO"
	cfg.RuntimeParams["TimeZone"] = "UTC"
	cfg.RuntimeParams["IntervalStyle"] = "iso_8601"
	cfg.RuntimeParams["extra_float_digits"] = "3"
	cfg.RuntimeParams["application_name"] = "flowrun " + s.slot
	if replication {
		cfg.RuntimeParams["replication"] = "database"
	}
	return cfg, nil
}

// session connects, sets up what is missing (publication, slot), reads the snapshot if one is due,
// and streams the changes until an error. progressed says whether it emitted anything.
func (s *cdcSource) session(ctx context.Context, out Emitter, run *cdcRun) (progressed bool, err error) {
	pcfg, err := s.connConfig(false)
	if err != nil {
		return false, err
	}
	ccfg, err := pgx.ParseConfig(s.dsn)
	if err != nil {
		return false, cdcConfigError{"the dsn is not a PostgreSQL connection string"}
	}
	ccfg.Config = *pcfg
	conn, err := pgx.ConnectConfig(ctx, ccfg)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.Background()) }() // a read-only session: nothing to lose
	tables, err := s.lookupTables(ctx, conn)
	if err != nil {
		return false, err
	}
	if err := s.ensurePublication(ctx, conn, tables); err != nil {
		return false, err
	}
	var exists bool
	var plugin, database, current string
	var confirmed *string
	err = conn.QueryRow(ctx, `SELECT coalesce(plugin, ''), coalesce(database, ''), confirmed_flush_lsn::text, current_database()
		FROM pg_replication_slots WHERE slot_name = $1`, s.slot).Scan(&plugin, &database, &confirmed, &current)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return false, err
	default:
		exists = true
		if plugin != "pgoutput" || database != current {
			return false, cdcConfigError{fmt.Sprintf("the replication slot %s exists, for the plugin %q on database %q: the source needs a slot of "+
				"the pgoutput plugin on this database (drop it, or name another slot)", s.slot, plugin, database)}
		}
	}

	rcfg, err := s.connConfig(true)
	if err != nil {
		return false, err
	}
	repl, err := pgconn.ConnectConfig(ctx, rcfg)
	if err != nil {
		return false, err
	}
	defer func() { _ = repl.Close(context.Background()) }()

	var start pglogrepl.LSN
	var exported string
	created := false
	if !exists {
		if run.emitted {
			return false, cdcConfigError{fmt.Sprintf("the replication slot %s disappeared while the source read it: changes may be missing; "+
				"start the pipeline again to create it anew (with snapshot, the tables are read again)", s.slot)}
		}
		action := "NOEXPORT_SNAPSHOT"
		if s.snapshot {
			action = "EXPORT_SNAPSHOT"
		}
		res, err := pglogrepl.CreateReplicationSlot(ctx, repl, s.slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: action})
		if err != nil {
			return false, fmt.Errorf("creating the replication slot %s: %w", s.slot, err)
		}
		if start, err = pglogrepl.ParseLSN(res.ConsistentPoint); err != nil {
			return false, fmt.Errorf("creating the replication slot %s: %w", s.slot, err)
		}
		exported, created = res.SnapshotName, true
		if run.pos != nil {
			s.log.Warn("postgres_cdc: the replication slot was missing and is created anew: changes between the recorded position and now were not captured",
				"recorded", run.pos.LSN, "now", start.String(), "snapshot", s.snapshot)
		} else {
			s.log.Info("postgres_cdc: replication slot created", "at", start.String())
		}
	} else {
		switch {
		case run.pos != nil:
			start, err = pglogrepl.ParseLSN(run.pos.LSN)
		case confirmed != nil:
			start, err = pglogrepl.ParseLSN(*confirmed)
		}
		if err != nil {
			return false, fmt.Errorf("the slot's position: %w", err)
		}
	}

	if s.snapshot && (created || run.pos == nil || run.pos.Snapshot != "") {
		epoch := NewRunID()
		if !created && run.pos != nil && run.pos.Snapshot != "" {
			// A snapshot that a crash or a failure interrupted: read again, under its epoch, so that
			// its messages that were written are not written again under effectively-once.
			epoch = run.pos.Snapshot
			s.log.Info("postgres_cdc: reading the interrupted snapshot again; the slot's changes since it was created follow it", "from", start.String())
		}
		pos := cdcPosition{Slot: s.slot, LSN: start.String(), Snapshot: epoch}
		if err := out.Record(ctx, pos.String()); err != nil {
			return false, cdcEmitError{err}
		}
		run.pos = &pos
		n, err := s.readSnapshot(ctx, conn, exported, tables, epoch, start, out, run)
		if n > 0 {
			progressed = true
		}
		if err != nil {
			return progressed, err
		}
		s.log.Info("postgres_cdc: snapshot read", "rows", n)
	}
	if run.pos == nil {
		// Streaming from the slot's position, with nothing recorded: record it, so that what the
		// source confirms to the server starts there (see cdcProgress).
		pos := cdcPosition{Slot: s.slot, LSN: start.String()}
		if err := out.Record(ctx, pos.String()); err != nil {
			return progressed, cdcEmitError{err}
		}
		run.pos = &pos
	}
	// The snapshot connection is done; the replication connection streams from here.
	_ = conn.Close(ctx)
	p, err := s.stream(ctx, repl, out, run, start, tables)
	return progressed || p, err
}

// lookupTables finds the tables and their keys.
func (s *cdcSource) lookupTables(ctx context.Context, conn *pgx.Conn) ([]cdcTable, error) {
	var tables []cdcTable
	var missing []string
	for _, name := range s.tables {
		var oid uint32
		var t cdcTable
		err := conn.QueryRow(ctx, `SELECT c.oid, n.nspname || '.' || c.relname, quote_ident(n.nspname) || '.' || quote_ident(c.relname)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, name).Scan(&oid, &t.name, &t.quoted)
		if errors.Is(err, pgx.ErrNoRows) {
			missing = append(missing, name)
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, which := range []string{"indisprimary", "indisreplident"} {
			rows, err := conn.Query(ctx, `SELECT a.attname FROM pg_index i JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
				JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
				WHERE i.indrelid = $1 AND i.`+which+` ORDER BY k.ord`, oid)
			if err != nil {
				return nil, err
			}
			if t.key, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				return nil, err
			}
			if len(t.key) > 0 {
				break
			}
		}
		if len(t.key) == 0 {
			t.key = nil
			s.log.Warn("postgres_cdc: the table has no primary key: its messages are keyed by the table alone", "table", t.name)
		}
		tables = append(tables, t)
	}
	if len(missing) > 0 {
		return nil, cdcConfigError{"no such table: " + strings.Join(missing, ", ")}
	}
	return tables, nil
}

// ensurePublication creates the publication of the tables, or adds to it those it lacks.
func (s *cdcSource) ensurePublication(ctx context.Context, conn *pgx.Conn, tables []cdcTable) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", s.publication).Scan(&exists); err != nil {
		return err
	}
	quoted := make([]string, len(tables))
	for i, t := range tables {
		quoted[i] = t.quoted
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE PUBLICATION "+s.publication+" FOR TABLE "+strings.Join(quoted, ", ")+" WITH (publish = 'insert, update, delete')")
		if err != nil {
			return fmt.Errorf("creating the publication %s: %w", s.publication, err)
		}
		s.log.Info("postgres_cdc: publication created", "publication", s.publication)
		return nil
	}
	rows, err := conn.Query(ctx, "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1", s.publication)
	if err != nil {
		return err
	}
	has, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var add []string
	for i, t := range tables {
		found := false
		for _, h := range has {
			found = found || h == t.name
		}
		if !found {
			add = append(add, quoted[i])
		}
	}
	if len(add) > 0 {
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+s.publication+" ADD TABLE "+strings.Join(add, ", ")); err != nil {
			return fmt.Errorf("adding tables to the publication %s: %w", s.publication, err)
		}
		s.log.Info("postgres_cdc: tables added to the publication; their changes are captured from now on, without a snapshot",
			"publication", s.publication, "tables", strings.Join(add, ", "))
	}
	return nil
}

// readSnapshot emits every row of the tables as op "snapshot", as of the exported snapshot of the
// slot's creation, or, for a snapshot read again (exported ""), as of now. The last row carries the
// position that says the snapshot is complete. It returns how many rows it emitted.
func (s *cdcSource) readSnapshot(ctx context.Context, conn *pgx.Conn, exported string, tables []cdcTable, epoch string, at pglogrepl.LSN,
	out Emitter, run *cdcRun) (int, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // read only
	if exported != "" {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+exported+"'"); err != nil {
			return 0, fmt.Errorf("reading the snapshot: %w", err)
		}
	}
	tm := pgtype.NewMap()
	n := 0
	var held *cdcChange
	var heldID string
	emit := func(c *cdcChange, id string, position string) error {
		m, err := c.message(at, time.Time{})
		if err != nil {
			return err
		}
		if err := out.Emit(ctx, m, Origin{ID: id, Position: position}); err != nil {
			return cdcEmitError{err}
		}
		run.emitted = true
		n++
		return nil
	}
	for _, t := range tables {
		rows, err := tx.Query(ctx, "SELECT * FROM "+t.quoted, pgx.QueryResultFormats{pgx.TextFormatCode})
		if err != nil {
			return n, fmt.Errorf("reading %s: %w", t.name, err)
		}
		fds := rows.FieldDescriptions()
		cols := make([]cdcColumn, len(fds))
		for i, fd := range fds {
			cols[i] = cdcColumn{name: fd.Name, oid: fd.DataTypeOID}
		}
		rel := newCDCRelation(t.name, cols, t.key)
		for i := 0; rows.Next(); i++ {
			raw := rows.RawValues()
			row := make(map[string]any, len(cols))
			for j, v := range raw {
				if v == nil {
					row[cols[j].name] = nil
				} else {
					row[cols[j].name] = cdcValue(tm, cols[j].oid, v)
				}
			}
			if held != nil {
				if err := emit(held, heldID, ""); err != nil {
					rows.Close()
					return n, err
				}
			}
			c := cdcChange{op: cdcOpSnapshot, rel: rel, after: row}
			held = &c
			// The ID of a row of a keyed table is its key: a snapshot read again after a crash
			// emits a row that was written once under effectively-once.
			if rel.key != nil {
				heldID = epoch + ":" + t.name + ":" + rel.keyJSON(row)
			} else {
				heldID = fmt.Sprintf("%s:%s:#%d", epoch, t.name, i)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return n, fmt.Errorf("reading %s: %w", t.name, err)
		}
	}
	done := cdcPosition{Slot: s.slot, LSN: at.String()}
	if held != nil {
		if err := emit(held, heldID, done.String()); err != nil {
			return n, err
		}
	} else if err := out.Record(ctx, done.String()); err != nil {
		return n, cdcEmitError{err}
	}
	run.pos = &done
	return n, nil
}
