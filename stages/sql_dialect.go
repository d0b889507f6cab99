// This file holds what differs between PostgreSQL and MySQL (or MariaDB) for the sql sink: the SQL
// text of its statements and its ledger, upserts, the types of columns, and how a database error
// is classified as transient (the database is away) or permanent (it refused the row). It is apart
// because it changes with the databases the sink supports.

package stages

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

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
