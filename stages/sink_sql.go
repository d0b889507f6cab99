// This file holds the sql sink kind: its registration, spec and checks, the sink itself (opening
// the database, waiting for it at start) and DeliverBatch, which splits a refused transaction until
// the refused rows are alone. The table, the ledger, the dialects and the conversion of values are
// in the sql_*.go files beside it.

package stages

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/flowrun/flowrun/flow"
)

// The sql sink's attributes, the values of driver, and the ledger table's default name.
const (
	sqlSinkFieldDriver          = "driver"
	sqlSinkFieldDSN             = "dsn"
	sqlSinkFieldTable           = "table"
	sqlSinkFieldColumns         = "columns"
	sqlSinkFieldUpsert          = "upsert"
	sqlSinkFieldTimeout         = "timeout"
	sqlSinkFieldLedgerTable     = "ledger_table"
	sqlSinkFieldLedgerRetention = "ledger_retention"

	sqlSinkDriverPostgres = "postgres"
	sqlSinkDriverMySQL    = "mysql"

	sqlSinkDefaultLedgerTable = "flowrun_sql_ledger"
)

// The sql sink writes each message as a row of a table of PostgreSQL, or of MariaDB or MySQL: a
// read batch in one transaction (a BatchSink), with effectively-once delivery through a ledger
// of the entries it wrote, kept in the same transaction. See docs/connectors.md.
func init() {
	// The MySQL driver logs what it retries (a dead idle connection) to standard error on its own;
	// the sink reports what matters through its errors and the run's log.
	_ = mysql.SetLogger(stdlog.New(io.Discard, "", 0))
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "sql",
			Doc: "Writes each message as a row of a database table (PostgreSQL, MariaDB or MySQL), a read batch " +
				"in one transaction. Connection failures, deadlocks and serialization failures pause the sink " +
				"until the database is back; a row that the database refuses (a constraint, a wrong-typed " +
				"value) is dead-lettered on its own with the database's message. With delivery = " +
				"\"effectively_once\" no entry is written twice, through a crash or an outage.",
			Attributes: []flow.Attribute{
				{Name: sqlSinkFieldDriver, Type: flow.TypeString, Required: true, Enum: []string{sqlSinkDriverPostgres, sqlSinkDriverMySQL},
					Doc: "The database: \"postgres\" (PostgreSQL), or \"mysql\" (MariaDB and MySQL)."},
				{Name: sqlSinkFieldDSN, Type: flow.TypeString, Required: true,
					Doc: "The connection string: a URL or key=value pairs for postgres, user:password@tcp(host:port)/database for " +
						"mysql. Its password never appears in output."},
				{Name: sqlSinkFieldTable, Type: flow.TypeString, Required: true,
					Doc: "The table to write to, as its name or schema.name; used as written (quoted)."},
				{Name: sqlSinkFieldColumns, Type: flow.TypeMessageFields, Roots: []string{"msg"}, Required: true,
					Doc: "The row: an object of column names and expressions over msg. Values convert by the column's type."},
				{Name: sqlSinkFieldUpsert, Type: flow.TypeStringList,
					Doc: "The columns of a unique key: a row whose key exists updates the other columns (ON CONFLICT ... DO " +
						"UPDATE, ON DUPLICATE KEY UPDATE). Without it, rows are inserted."},
				{Name: sqlSinkFieldTimeout, Type: flow.TypeDuration, Default: 30 * time.Second,
					Doc: "How long one transaction may take."},
				{Name: sqlSinkFieldLedgerTable, Type: flow.TypeString, Default: sqlSinkDefaultLedgerTable,
					Doc: "With effectively_once: the table, created if absent, where the sink records the entries it wrote."},
				{Name: sqlSinkFieldLedgerRetention, Type: flow.TypeDuration, Default: 24 * time.Hour,
					Doc: "With effectively_once: how long the ledger remembers an entry it wrote (see docs/connectors.md)."},
			},
			Example: `sink "orders_db" {
  kind     = "sql"
  input    = topic.orders
  driver   = "postgres"
  dsn      = var.orders_dsn
  table    = "orders"
  columns  = { id = msg.order_id, customer = msg.customer_id, amount = msg.amount, at = msg.created_at }
  upsert   = ["id"]
  delivery = "effectively_once"
}`,
			Detail: func(c flow.Attrs) string { return "sql sink: " + c.String(sqlSinkFieldTable) },
			Check:  checkSQLSink,
		},
		// Inline: a partition's messages in order, one batch at a time, in the reading goroutine;
		// the batch is one transaction, and lanes would only split it.
		Traits: SinkTraits{Inline: true},
		New:    newSQLSink,
	})
}

// checkSQLSink checks what spans the attributes, and hides the connection string's password.
func checkSQLSink(c *flow.KindCheck) {
	if !c.Config.Has(sqlSinkFieldDriver) || !c.Config.Has(sqlSinkFieldDSN) {
		return
	}
	password, err := dsnPassword(c.Config.String(sqlSinkFieldDriver), c.Config.String(sqlSinkFieldDSN))
	if err != nil {
		c.Errorf(sqlSinkFieldDSN, "Invalid dsn", "The %s connection string cannot be read: %s", c.Config.String(sqlSinkFieldDriver), err)
	}
	c.Secret(password)
	if c.Config.Has(sqlSinkFieldTable) {
		if _, _, err := splitTable(c.Config.String(sqlSinkFieldTable)); err != nil {
			c.Errorf(sqlSinkFieldTable, "Invalid table", "%s", err)
		}
	}
	if c.Config.Duration(sqlSinkFieldTimeout) <= 0 {
		c.Errorf(sqlSinkFieldTimeout, "Invalid timeout", "A transaction needs some time: give a duration such as \"30s\".")
	}
	if c.Config.Duration(sqlSinkFieldLedgerRetention) < time.Minute {
		c.Errorf(sqlSinkFieldLedgerRetention, "Ledger retention too short", "The ledger must remember an entry at least a minute (default \"24h\"): "+
			"an entry is delivered again while it is pending, which may last as long as a process takes to be replaced.")
	}
	if !c.Config.Has(sqlSinkFieldColumns) {
		return
	}
	columns := map[string]bool{}
	for _, f := range c.Config.Fields(sqlSinkFieldColumns) {
		columns[f.Name] = true
	}
	if len(columns) == 0 {
		c.Errorf(sqlSinkFieldColumns, "No columns", "Name at least one column to write, such as columns = { id = msg.id }.")
	}
	if c.Config.Has(sqlSinkFieldUpsert) {
		keys := c.Config.Strings(sqlSinkFieldUpsert)
		if len(keys) == 0 {
			c.Errorf(sqlSinkFieldUpsert, "Empty upsert", "Name the columns of a unique key, or leave upsert out to insert.")
		}
		for _, k := range keys {
			if !columns[k] {
				c.Errorf(sqlSinkFieldUpsert, "Upsert column not written", "upsert names %q, which columns does not set: the key of a row must be among its columns.", k)
			}
		}
	}
}

// dsnPassword reads the password of a connection string.
func dsnPassword(driverName, dsn string) (string, error) {
	switch driverName {
	case sqlSinkDriverPostgres:
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return "", errors.New("not a PostgreSQL connection string (a URL or key=value pairs)")
		}
		return cfg.Password, nil
	case sqlSinkDriverMySQL:
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return "", err
		}
		return cfg.Passwd, nil
	}
	return "", fmt.Errorf("unknown driver %q", driverName)
}

// splitTable splits schema.name.
func splitTable(table string) (schema, name string, err error) {
	parts := strings.Split(table, ".")
	switch {
	case len(parts) == 1 && parts[0] != "":
		return "", parts[0], nil
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return parts[0], parts[1], nil
	}
	return "", "", fmt.Errorf("%q is not a table name: write name or schema.name", table)
}

func newSQLSink(s *flow.Sink, env Env) (Sink, error) {
	c := s.Config
	schema, table, err := splitTable(c.String(sqlSinkFieldTable))
	if err != nil {
		return nil, err
	}
	password, err := dsnPassword(c.String(sqlSinkFieldDriver), c.String(sqlSinkFieldDSN))
	if err != nil {
		return nil, err
	}
	redact := env.Redact
	if redact == nil {
		redact = func(s string) string { return s }
	}
	k := &sqlSink{
		driver: c.String(sqlSinkFieldDriver), dsn: c.String(sqlSinkFieldDSN), schema: schema, table: table, display: c.String(sqlSinkFieldTable),
		fields: c.Fields(sqlSinkFieldColumns), upsert: c.Strings(sqlSinkFieldUpsert), timeout: c.Duration(sqlSinkFieldTimeout),
		once: s.Delivery == flow.EffectivelyOnce, ledger: c.String(sqlSinkFieldLedgerTable), retention: c.Duration(sqlSinkFieldLedgerRetention),
		clock: env.Clock, units: map[string]bool{}, pruned: map[string]time.Time{}, log: env.Logger,
	}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	if k.clock == nil {
		k.clock = SystemClock{}
	}
	k.redact = func(text string) string {
		if len(password) > 0 {
			text = strings.ReplaceAll(text, password, "(password)")
		}
		return redact(text)
	}
	if s.Input != nil {
		k.unitPrefix = env.Pipeline + "/" + s.Name + "/" + s.Input.Name + "/"
	}
	if k.driver == sqlSinkDriverPostgres {
		k.dialect = postgresDialect{}
	} else {
		k.dialect = mysqlDialect{}
	}
	return k, nil
}

// sqlSink is a sql sink: it implements BatchSink, Opener, io.Closer and Timeouter.
type sqlSink struct {
	driver, dsn   string
	schema, table string // table's parts; schema "" is the connection's
	display       string // the table as the pipeline names it, for errors
	fields        []flow.Field
	upsert        []string
	timeout       time.Duration
	once          bool // effectively_once: the ledger
	ledger        string
	retention     time.Duration
	unitPrefix    string // "<pipeline>/<sink>/<topic>/": a unit in the ledger is this and the partition
	clock         Clock
	redact        func(string) string
	dialect       sqlDialect
	log           *slog.Logger

	db      *sql.DB
	columns []sqlColumn // by field

	mu     sync.Mutex
	units  map[string]bool      // units whose lock row exists
	pruned map[string]time.Time // when each unit's ledger was last pruned
}

func (s *sqlSink) Timeout() time.Duration { return s.timeout }

// Open connects, checks that the table and its columns exist, that the statement the sink will run
// is one the database accepts (an upsert's key, say), and creates the ledger when it needs one.
func (s *sqlSink) Open(ctx context.Context) error {
	if err := s.openDB(); err != nil {
		return err
	}
	// A database that is away at start is waited for, as during a run; a table that is not what
	// the sink needs stops the run at once.
	wait := 100 * time.Millisecond
	for {
		err := s.prepare(ctx)
		if err == nil || !IsTransient(err) || ctx.Err() != nil {
			return err
		}
		s.log.Warn("the database is away; the pipeline starts once the sink can reach it", "table", s.display,
			"err", err.Error(), "retry_in", wait)
		t := s.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C():
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// openDB makes the connection pool; it connects when it is first used.
func (s *sqlSink) openDB() error {
	switch s.driver {
	case sqlSinkDriverPostgres:
		cfg, err := pgx.ParseConfig(s.dsn)
		if err != nil {
			return errors.New("the dsn is not a PostgreSQL connection string")
		}
		s.db = stdlib.OpenDB(*cfg)
	default:
		cfg, err := mysql.ParseDSN(s.dsn)
		if err != nil {
			return err
		}
		cfg.InterpolateParams = true // one round trip per statement, not a prepare and an execute
		cfg.Loc = time.UTC
		cfg.ParseTime = true
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return s.describe(err)
		}
		s.db = sql.OpenDB(conn)
	}
	s.db.SetMaxOpenConns(8)
	s.db.SetMaxIdleConns(8)
	s.db.SetConnMaxIdleTime(5 * time.Minute)
	return nil
}

// prepare checks the table and creates the ledger, within the sink's timeout.
func (s *sqlSink) prepare(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.checkTable(ctx); err != nil {
		return err
	}
	if s.once {
		for _, stmt := range s.dialect.createLedger(s.ledger) {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("creating the ledger table %s: %w", s.ledger, s.classify(err))
			}
		}
	}
	return nil
}

func (s *sqlSink) Close() error {
	if s.db == nil {
		return nil
	}
	return s.db.Close()
}

// Deliver writes one message, without the ledger (the runtime calls DeliverBatch).
func (s *sqlSink) Deliver(ctx context.Context, m *Message, out []Write) ([]Write, error) {
	batch := []Delivery{{Message: m}}
	s.DeliverBatch(ctx, batch)
	return out, batch[0].Err
}

// sqlRow is a message of a batch on its way to the table.
type sqlRow struct {
	d       *Delivery
	values  []any
	unit    string // its ledger unit; "" when it has none
	ms, seq int64  // its entry ID
	skip    bool   // the ledger says it was written
}

// DeliverBatch writes the batch's rows in one transaction. A transaction that the database refuses
// for a row's sake is split in halves, each its own transaction, until the rows it refuses are
// alone: those fail, the others are written.
func (s *sqlSink) DeliverBatch(ctx context.Context, batch []Delivery) {
	rows := make([]*sqlRow, 0, len(batch))
	for i := range batch {
		d := &batch[i]
		d.Err = nil
		values, err := s.values(d.Message)
		if err != nil {
			d.Err = err
			continue
		}
		r := &sqlRow{d: d, values: values}
		if s.once && d.ID != "" {
			ms, seq, ok := parseEntryID(d.ID)
			if !ok {
				d.Err = Permanent(fmt.Errorf("entry ID %q cannot be recorded in the ledger", d.ID))
				continue
			}
			r.unit, r.ms, r.seq = s.unit(d.Partition), ms, seq
		}
		rows = append(rows, r)
	}
	s.deliverRows(ctx, rows)
}

// deliverRows writes rows in one transaction, or splits them.
func (s *sqlSink) deliverRows(ctx context.Context, rows []*sqlRow) {
	if len(rows) == 0 {
		return
	}
	err := s.write(ctx, rows)
	switch {
	case err == nil:
		return
	case IsTransient(err) || len(rows) == 1 || ctx.Err() != nil:
		for _, r := range rows {
			r.d.Err = err
		}
		return
	}
	half := len(rows) / 2
	s.deliverRows(ctx, rows[:half])
	for _, r := range rows[:half] {
		if r.d.Err != nil && IsTransient(r.d.Err) {
			for _, later := range rows[half:] {
				later.d.Err = r.d.Err // the database went away: the rest waits
			}
			return
		}
	}
	s.deliverRows(ctx, rows[half:])
}
