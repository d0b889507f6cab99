package stages

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
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

// sqlColumn is a column the sink writes, with what its type takes.
type sqlColumn struct {
	name   string
	kind   columnKind
	typ    string // the database's name of its type, for errors
	maxLen int64  // the most characters a text column holds; 0: no limit known
}

type columnKind int

const (
	colOther columnKind = iota
	colInt
	colDecimal
	colFloat
	colBool
	colText
	colTime
	colJSON
	colBytes
)

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

// checkTable reads the table's columns and types, says which are missing, and prepares the
// sink's statement once.
func (s *sqlSink) checkTable(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, s.dialect.columnsQuery(s.schema != ""), s.dialect.columnsArgs(s.schema, s.table)...)
	if err != nil {
		return fmt.Errorf("reading the columns of table %s: %w", s.display, s.classify(err))
	}
	defer rows.Close()
	have := map[string]sqlColumn{}
	var names []string
	for rows.Next() {
		var name, dataType string
		var maxLen sql.NullInt64
		if err := rows.Scan(&name, &dataType, &maxLen); err != nil {
			return s.classify(err)
		}
		have[name] = sqlColumn{name: name, typ: dataType, kind: s.dialect.kindOf(dataType), maxLen: maxLen.Int64}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil {
		return s.classify(err)
	}
	if len(have) == 0 {
		return fmt.Errorf("table %s does not exist (or this user cannot see it)", s.display)
	}
	if s.driver == sqlSinkDriverMySQL {
		s.mariaDBJSON(ctx, have)
	}
	var missing []string
	s.columns = s.columns[:0]
	for _, f := range s.fields {
		col, ok := have[f.Name]
		if !ok {
			missing = append(missing, f.Name)
		}
		s.columns = append(s.columns, col)
	}
	if len(missing) > 0 {
		sort.Strings(names)
		return fmt.Errorf("table %s has no column %s (its columns: %s)", s.display, strings.Join(missing, ", "), strings.Join(names, ", "))
	}
	// Planning the statement checks what only the database knows, such as an upsert's key.
	rows2, err := s.db.QueryContext(ctx, "EXPLAIN "+s.insertSQL(1), make([]any, len(s.fields))...)
	if err != nil {
		return fmt.Errorf("table %s refuses the sink's statement: %w", s.display, s.classify(err))
	}
	return rows2.Close()
}

// mariaDBJSON marks MariaDB's JSON columns, which it keeps as longtext with a json_valid check.
// MySQL has JSON columns of their own, and no table_name in its check constraints: the query then
// fails, and nothing needs marking.
func (s *sqlSink) mariaDBJSON(ctx context.Context, have map[string]sqlColumn) {
	schema := any(s.schema)
	if s.schema == "" {
		schema = nil
	}
	rows, err := s.db.QueryContext(ctx, "SELECT check_clause FROM information_schema.check_constraints "+
		"WHERE constraint_schema = COALESCE(?, DATABASE()) AND table_name = ? AND check_clause LIKE 'json_valid(%'", schema, s.table)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var clause string
		if rows.Scan(&clause) != nil {
			return
		}
		name := strings.TrimSuffix(strings.TrimPrefix(clause, "json_valid("), ")")
		name = strings.ReplaceAll(strings.Trim(name, "`"), "``", "`")
		if col, ok := have[name]; ok {
			col.kind, col.typ = colJSON, "json"
			have[name] = col
		}
	}
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

// write is one transaction: with the ledger, it locks the rows' units, skips the entries it
// records as written, and records the others with them.
func (s *sqlSink) write(ctx context.Context, rows []*sqlRow) (err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	units := map[string][][2]int64{} // unit -> the entries of its rows
	for _, r := range rows {
		if r.unit != "" {
			units[r.unit] = append(units[r.unit], [2]int64{r.ms, r.seq})
		}
	}
	for unit := range units {
		if err := s.ensureUnit(ctx, unit); err != nil {
			return err
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.classify(err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	written := map[string]map[[2]int64]bool{}
	for _, unit := range slices.Sorted(maps.Keys(units)) { // always in one order: no deadlock
		if _, err := tx.ExecContext(ctx, s.dialect.lockUnit(s.ledger), unit); err != nil {
			return s.classify(err)
		}
		got, err := s.ledgerEntries(ctx, tx, unit, units[unit])
		if err != nil {
			return err
		}
		written[unit] = got
	}
	todo := make([]*sqlRow, 0, len(rows))
	for _, r := range rows {
		r.skip = r.unit != "" && written[r.unit][[2]int64{r.ms, r.seq}]
		if !r.skip {
			todo = append(todo, r)
		}
	}
	if skipped := len(rows) - len(todo); skipped > 0 {
		s.log.Info("entries already written, per the ledger, skipped", "entries", skipped, "table", s.display)
	}
	per := max(1, min(1000, s.dialect.maxParams()/max(1, len(s.fields))))
	for start := 0; start < len(todo); start += per {
		chunk := todo[start:min(len(todo), start+per)]
		args := make([]any, 0, len(chunk)*len(s.fields))
		for _, r := range chunk {
			args = append(args, r.values...)
		}
		if _, err := tx.ExecContext(ctx, s.insertSQL(len(chunk)), args...); err != nil {
			return s.classify(err)
		}
	}
	if err := s.record(ctx, tx, todo); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return s.classify(err)
	}
	return nil
}

// ensureUnit makes the unit's lock row in the ledger, once: every transaction of the unit locks
// it, so that two processes that both think they own a partition (one has lost its lease and does
// not know yet) write its entries one after the other, and the second skips what the first wrote.
func (s *sqlSink) ensureUnit(ctx context.Context, unit string) error {
	s.mu.Lock()
	done := s.units[unit]
	s.mu.Unlock()
	if done {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, s.dialect.insertUnit(s.ledger), unit); err != nil {
		return s.classify(err)
	}
	s.mu.Lock()
	s.units[unit] = true
	s.mu.Unlock()
	return nil
}

// ledgerEntries reads which of a unit's entries the ledger records as written.
func (s *sqlSink) ledgerEntries(ctx context.Context, tx *sql.Tx, unit string, entries [][2]int64) (map[[2]int64]bool, error) {
	got := map[[2]int64]bool{}
	for start := 0; start < len(entries); start += 1000 {
		chunk := entries[start:min(len(entries), start+1000)]
		query, args := s.dialect.readLedger(s.ledger, unit, chunk)
		if err := s.readLedger(ctx, tx, query, args, got); err != nil {
			return nil, err
		}
	}
	return got, nil
}

func (s *sqlSink) readLedger(ctx context.Context, tx *sql.Tx, query string, args []any, got map[[2]int64]bool) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return s.classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var ms, seq int64
		if err := rows.Scan(&ms, &seq); err != nil {
			return s.classify(err)
		}
		got[[2]int64{ms, seq}] = true
	}
	return s.classify(rows.Err())
}

// record adds the rows' entries to the ledger, and forgets, once a minute per unit, the entries
// written longer than ledger_retention ago.
func (s *sqlSink) record(ctx context.Context, tx *sql.Tx, rows []*sqlRow) error {
	now := s.clock.Now()
	var args []any
	prune := map[string]bool{}
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		_, err := tx.ExecContext(ctx, s.dialect.insertLedger(s.ledger, len(args)/4), args...)
		args = args[:0]
		return s.classify(err)
	}
	for _, r := range rows {
		if r.unit == "" {
			continue
		}
		args = append(args, r.unit, r.ms, r.seq, now.UnixMilli())
		prune[r.unit] = true
		if len(args) >= 4*1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	for unit := range prune {
		s.mu.Lock()
		due := now.Sub(s.pruned[unit]) >= time.Minute
		if due {
			s.pruned[unit] = now
		}
		s.mu.Unlock()
		if !due {
			continue
		}
		if _, err := tx.ExecContext(ctx, s.dialect.pruneLedger(s.ledger), unit, now.Add(-s.retention).UnixMilli()); err != nil {
			return s.classify(err)
		}
	}
	return nil
}

// unit names a partition of the sink's input in the ledger: longer names are hashed, to fit its key.
func (s *sqlSink) unit(partition int) string {
	u := s.unitPrefix + strconv.Itoa(partition)
	if len(u) > 200 {
		sum := sha256.Sum256([]byte(u))
		u = u[:100] + "#" + hex.EncodeToString(sum[:])
	}
	return u
}

// insertSQL is the statement that writes n rows.
func (s *sqlSink) insertSQL(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	if s.schema != "" {
		b.WriteString(s.dialect.quote(s.schema) + ".")
	}
	b.WriteString(s.dialect.quote(s.table) + " (")
	for i, f := range s.fields {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s.dialect.quote(f.Name))
	}
	b.WriteString(") VALUES ")
	p := 0
	for r := 0; r < n; r++ {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for i := range s.fields {
			if i > 0 {
				b.WriteString(", ")
			}
			p++
			b.WriteString(s.dialect.placeholder(p))
		}
		b.WriteByte(')')
	}
	if len(s.upsert) > 0 {
		keys := map[string]bool{}
		for _, k := range s.upsert {
			keys[k] = true
		}
		var others []string
		for _, f := range s.fields {
			if !keys[f.Name] {
				others = append(others, f.Name)
			}
		}
		b.WriteString(s.dialect.upsert(s.upsert, others))
	}
	return b.String()
}

// values evaluates a message's columns and converts them for the database.
func (s *sqlSink) values(m *Message) ([]any, error) {
	if err := m.Decode(); err != nil {
		return nil, err
	}
	env := expr.Env{Msg: m.Value}
	out := make([]any, len(s.fields))
	for i, f := range s.fields {
		v, err := f.Expr.Eval(&env)
		if err != nil {
			return nil, evalError(fmt.Errorf("column %s: %w", f.Name, err))
		}
		var col sqlColumn
		if i < len(s.columns) {
			col = s.columns[i]
		}
		if out[i], err = convertColumn(col, v.Interface()); err != nil {
			return nil, Permanent(fmt.Errorf("table %s, column %s (%s): %w", s.display, f.Name, col.typ, err))
		}
	}
	return out, nil
}

// convertColumn converts a JSON value for a column of the given kind.
func convertColumn(col sqlColumn, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch col.kind {
	case colInt:
		n, err := wholeNumber(v)
		if err != nil {
			return nil, err
		}
		if lo, hi, ok := intRange(col.typ); ok && (n < lo || n > hi) {
			return nil, fmt.Errorf("%d is out of the column's range [%d, %d]", n, lo, hi)
		}
		return n, nil
	case colDecimal:
		switch x := v.(type) {
		case json.Number:
			return string(x), nil
		case float64:
			return strconv.FormatFloat(x, 'f', -1, 64), nil
		case string:
			if _, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err != nil {
				return nil, fmt.Errorf("%q is not a number", x)
			}
			return strings.TrimSpace(x), nil
		}
		return nil, fmt.Errorf("%s is not a number", describeJSON(v))
	case colFloat:
		switch x := v.(type) {
		case json.Number:
			return x.Float64()
		case float64:
			return x, nil
		case string:
			f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
			if err != nil {
				return nil, fmt.Errorf("%q is not a number", x)
			}
			return f, nil
		}
		return nil, fmt.Errorf("%s is not a number", describeJSON(v))
	case colBool:
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			if b, err := strconv.ParseBool(x); err == nil {
				return b, nil
			}
		}
		return nil, fmt.Errorf("%s is not a boolean", describeJSON(v))
	case colTime:
		return timeValue(v)
	case colJSON:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		return string(b), nil
	case colBytes:
		if x, ok := v.(string); ok {
			return []byte(x), nil
		}
		return json.Marshal(v)
	case colText:
		text, err := textOf(v)
		if err != nil {
			return nil, err
		}
		if col.maxLen > 0 && int64(len([]rune(text))) > col.maxLen {
			return nil, fmt.Errorf("%d characters do not fit in %d", len([]rune(text)), col.maxLen)
		}
		return text, nil
	}
	switch v.(type) {
	case string, bool:
		return v, nil
	}
	return textOf(v)
}

// textOf is a JSON value as text: a string as it is, anything else as JSON.
func textOf(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return string(x), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// wholeNumber reads an integer column's value: a whole number, or a string that holds one.
func wholeNumber(v any) (int64, error) {
	var text string
	switch x := v.(type) {
	case json.Number:
		text = string(x)
	case float64:
		if x != math.Trunc(x) || math.IsInf(x, 0) || x > math.MaxInt64 || x < math.MinInt64 {
			return 0, fmt.Errorf("%v is not a whole number", x)
		}
		return int64(x), nil
	case string:
		text = strings.TrimSpace(x)
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	default:
		return 0, fmt.Errorf("%s is not a number", describeJSON(v))
	}
	if n, err := strconv.ParseInt(text, 10, 64); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil || f != math.Trunc(f) || f > math.MaxInt64 || f < math.MinInt64 {
		return 0, fmt.Errorf("%s is not a whole number", strconv.Quote(text))
	}
	return int64(f), nil
}

// intRange is the range of an integer type by its name.
func intRange(typ string) (lo, hi int64, ok bool) {
	switch strings.ToLower(typ) {
	case "smallint":
		return math.MinInt16, math.MaxInt16, true
	case "integer", "int":
		return math.MinInt32, math.MaxInt32, true
	case "tinyint":
		return math.MinInt8, math.MaxInt8, true
	case "mediumint":
		return -1 << 23, 1<<23 - 1, true
	}
	return 0, 0, false
}

// timeValue reads a timestamp: an RFC 3339 string, a date (2006-01-02), or Unix milliseconds.
func timeValue(v any) (any, error) {
	switch x := v.(type) {
	case string:
		if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
			return t.UTC(), nil
		}
		if t, err := time.Parse(time.DateOnly, x); err == nil {
			return t, nil
		}
		return nil, fmt.Errorf("%q is not an RFC 3339 time (2006-01-02T15:04:05Z) or a date", x)
	case json.Number, float64:
		n, err := wholeNumber(x)
		if err != nil {
			return nil, fmt.Errorf("%v is not a time in Unix milliseconds", x)
		}
		return time.UnixMilli(n).UTC(), nil
	}
	return nil, fmt.Errorf("%s is not a time", describeJSON(v))
}

func describeJSON(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case bool:
		return fmt.Sprint(v)
	}
	s, _ := textOf(v)
	return strconv.Quote(s)
}

// parseEntryID splits a stream entry ID, ms-seq.
func parseEntryID(id string) (ms, seq int64, ok bool) {
	a, b, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseInt(a, 10, 64)
	seq, err2 := strconv.ParseInt(b, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}

// classify marks a database error: transient when the database went away or asked to try again
// (a connection refused or cut, a deadlock, a serialization failure, too many connections),
// permanent when it refused the row (a constraint, a wrong-typed value), neither otherwise. An
// error that the server did not send (a connection that failed) is transient.
func (s *sqlSink) classify(err error) error {
	if err == nil {
		return nil
	}
	described := s.describe(err)
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch {
		case pg.Code == "40001", pg.Code == "40P01", strings.HasPrefix(pg.Code, "08"), strings.HasPrefix(pg.Code, "53"),
			strings.HasPrefix(pg.Code, "57P"), pg.Code == "55P03", pg.Code == "57014":
			return Transient(described)
		case strings.HasPrefix(pg.Code, "23"), strings.HasPrefix(pg.Code, "22"):
			return Permanent(described)
		}
		return described
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		switch my.Number {
		case 1040, 1053, 1205, 1213, 1203, 1226, 1927, 2002, 2003, 2006, 2013, 1158, 1159, 1160, 1161, 1317, 4031:
			return Transient(described)
		case 1048, 1062, 1216, 1217, 1451, 1452, 1406, 1264, 1265, 1366, 1292, 1364, 1690, 3819, 4025, 1411, 1367, 3140:
			return Permanent(described)
		}
		return described
	}
	if errors.Is(err, context.Canceled) {
		return described
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, sql.ErrConnDone) || IsTransient(err) {
		return Transient(described)
	}
	// No answer from the server at all: the connection, not the row.
	return Transient(described)
}

// describe is a database error as a dead letter or a log says it: the table, the database's
// message, the column or constraint it names; never the connection string's password.
func (s *sqlSink) describe(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		text := fmt.Sprintf("table %s: %s (SQLSTATE %s)", s.display, pg.Message, pg.Code)
		if pg.ColumnName != "" {
			text += "; column " + pg.ColumnName
		}
		if pg.ConstraintName != "" {
			text += "; constraint " + pg.ConstraintName
		}
		if pg.Detail != "" {
			text += "; " + pg.Detail
		}
		return errors.New(s.redact(text))
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return errors.New(s.redact(fmt.Sprintf("table %s: %s (error %d)", s.display, my.Message, my.Number)))
	}
	return redactedError{text: s.redact("table " + s.display + ": " + err.Error()), err: err}
}

// redactedError keeps what an error wraps (a network error is transient) with a text that hides
// secrets.
type redactedError struct {
	text string
	err  error
}

func (e redactedError) Error() string { return e.text }
func (e redactedError) Unwrap() error { return e.err }

// sqlDialect is what differs between PostgreSQL and MySQL.
type sqlDialect interface {
	quote(name string) string
	placeholder(n int) string
	maxParams() int
	upsert(keys, others []string) string
	columnsQuery(withSchema bool) string
	columnsArgs(schema, table string) []any
	kindOf(dataType string) columnKind
	createLedger(table string) []string
	insertUnit(table string) string
	lockUnit(table string) string
	readLedger(table, unit string, entries [][2]int64) (string, []any)
	insertLedger(table string, rows int) string
	pruneLedger(table string) string
}

type postgresDialect struct{}

func (postgresDialect) quote(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}
func (postgresDialect) placeholder(n int) string { return "$" + strconv.Itoa(n) }
func (postgresDialect) maxParams() int           { return 65535 }

func (d postgresDialect) upsert(keys, others []string) string {
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = d.quote(k)
	}
	if len(others) == 0 {
		return " ON CONFLICT (" + strings.Join(quoted, ", ") + ") DO NOTHING"
	}
	set := make([]string, len(others))
	for i, c := range others {
		set[i] = d.quote(c) + " = EXCLUDED." + d.quote(c)
	}
	return " ON CONFLICT (" + strings.Join(quoted, ", ") + ") DO UPDATE SET " + strings.Join(set, ", ")
}

func (postgresDialect) columnsQuery(withSchema bool) string {
	schema := "current_schema()"
	if withSchema {
		schema = "$2"
	}
	return "SELECT column_name, data_type, character_maximum_length FROM information_schema.columns " +
		"WHERE table_name = $1 AND table_schema = " + schema
}

func (postgresDialect) columnsArgs(schema, table string) []any {
	if schema != "" {
		return []any{table, schema}
	}
	return []any{table}
}

func (postgresDialect) kindOf(t string) columnKind {
	switch t {
	case "smallint", "integer", "bigint":
		return colInt
	case "numeric":
		return colDecimal
	case "real", "double precision":
		return colFloat
	case "boolean":
		return colBool
	case "text", "character varying", "character", "uuid", "name", "citext":
		return colText
	case "timestamp with time zone", "timestamp without time zone", "date":
		return colTime
	case "json", "jsonb":
		return colJSON
	case "bytea":
		return colBytes
	}
	return colOther
}

func (d postgresDialect) createLedger(table string) []string {
	t := d.quote(table)
	return []string{
		"CREATE TABLE IF NOT EXISTS " + t + " (unit varchar(255) NOT NULL, entry_ms bigint NOT NULL, " +
			"entry_seq bigint NOT NULL, written_ms bigint NOT NULL, PRIMARY KEY (unit, entry_ms, entry_seq))",
		"CREATE INDEX IF NOT EXISTS " + d.quote(table+"_written") + " ON " + t + " (unit, written_ms)",
	}
}

func (d postgresDialect) insertUnit(table string) string {
	return "INSERT INTO " + d.quote(table) + " (unit, entry_ms, entry_seq, written_ms) VALUES ($1, -1, -1, 0) ON CONFLICT DO NOTHING"
}

func (d postgresDialect) lockUnit(table string) string {
	return "SELECT 1 FROM " + d.quote(table) + " WHERE unit = $1 AND entry_ms = -1 AND entry_seq = -1 FOR UPDATE"
}

func (d postgresDialect) readLedger(table, unit string, entries [][2]int64) (string, []any) {
	// Two arrays, not a list of pairs: PostgreSQL plans a long IN list slowly.
	ms, seq := make([]int64, len(entries)), make([]int64, len(entries))
	for i, e := range entries {
		ms[i], seq[i] = e[0], e[1]
	}
	return "SELECT entry_ms, entry_seq FROM " + d.quote(table) + " WHERE unit = $1 AND (entry_ms, entry_seq) IN " +
		"(SELECT * FROM unnest($2::bigint[], $3::bigint[]))", []any{unit, ms, seq}
}

func (d postgresDialect) insertLedger(table string, rows int) string {
	return ledgerInsert(d.quote(table), rows, d.placeholder)
}

func (d postgresDialect) pruneLedger(table string) string {
	return "DELETE FROM " + d.quote(table) + " WHERE unit = $1 AND entry_ms >= 0 AND written_ms < $2"
}

type mysqlDialect struct{}

func (mysqlDialect) quote(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }
func (mysqlDialect) placeholder(int) string   { return "?" }
func (mysqlDialect) maxParams() int           { return 65535 }

func (d mysqlDialect) upsert(keys, others []string) string {
	if len(others) == 0 {
		k := d.quote(keys[0])
		return " ON DUPLICATE KEY UPDATE " + k + " = " + k
	}
	set := make([]string, len(others))
	for i, c := range others {
		set[i] = d.quote(c) + " = VALUES(" + d.quote(c) + ")"
	}
	return " ON DUPLICATE KEY UPDATE " + strings.Join(set, ", ")
}

func (mysqlDialect) columnsQuery(withSchema bool) string {
	schema := "DATABASE()"
	if withSchema {
		schema = "?"
	}
	return "SELECT column_name, data_type, character_maximum_length FROM information_schema.columns " +
		"WHERE table_name = ? AND table_schema = " + schema
}

func (mysqlDialect) columnsArgs(schema, table string) []any {
	if schema != "" {
		return []any{table, schema}
	}
	return []any{table}
}

func (mysqlDialect) kindOf(t string) columnKind {
	switch strings.ToLower(t) {
	case "tinyint", "smallint", "mediumint", "int", "bigint", "year":
		return colInt
	case "decimal":
		return colDecimal
	case "float", "double":
		return colFloat
	case "char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set":
		return colText
	case "datetime", "timestamp", "date":
		return colTime
	case "json":
		return colJSON
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		return colBytes
	}
	return colOther
}

func (d mysqlDialect) createLedger(table string) []string {
	return []string{"CREATE TABLE IF NOT EXISTS " + d.quote(table) + " (unit varchar(255) NOT NULL, entry_ms bigint NOT NULL, " +
		"entry_seq bigint NOT NULL, written_ms bigint NOT NULL, PRIMARY KEY (unit, entry_ms, entry_seq), " +
		"INDEX written (unit, written_ms)) ENGINE=InnoDB"}
}

func (d mysqlDialect) insertUnit(table string) string {
	return "INSERT IGNORE INTO " + d.quote(table) + " (unit, entry_ms, entry_seq, written_ms) VALUES (?, -1, -1, 0)"
}

func (d mysqlDialect) lockUnit(table string) string {
	return "SELECT 1 FROM " + d.quote(table) + " WHERE unit = ? AND entry_ms = -1 AND entry_seq = -1 FOR UPDATE"
}

func (d mysqlDialect) readLedger(table, unit string, entries [][2]int64) (string, []any) {
	args := make([]any, 0, 1+2*len(entries))
	args = append(args, unit)
	for _, e := range entries {
		args = append(args, e[0], e[1])
	}
	// A locking read sees what was committed before the lock, whatever the transaction's snapshot.
	return "SELECT entry_ms, entry_seq FROM " + d.quote(table) + " WHERE unit = ? AND (entry_ms, entry_seq) IN (" +
		entryPairs(len(entries), 2, d.placeholder) + ") FOR UPDATE", args
}

func (d mysqlDialect) insertLedger(table string, rows int) string {
	return ledgerInsert(d.quote(table), rows, d.placeholder)
}

func (d mysqlDialect) pruneLedger(table string) string {
	return "DELETE FROM " + d.quote(table) + " WHERE unit = ? AND entry_ms >= 0 AND written_ms < ?"
}

// entryPairs is "($a, $b), ($c, $d), ..." for n pairs of placeholders from the first-th on.
func entryPairs(n, first int, placeholder func(int) string) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%s, %s)", placeholder(first+2*i), placeholder(first+2*i+1))
	}
	return b.String()
}

func ledgerInsert(table string, rows int, placeholder func(int) string) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + table + " (unit, entry_ms, entry_seq, written_ms) VALUES ")
	for r := 0; r < rows; r++ {
		if r > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%s, %s, %s, %s)", placeholder(4*r+1), placeholder(4*r+2), placeholder(4*r+3), placeholder(4*r+4))
	}
	return b.String()
}
