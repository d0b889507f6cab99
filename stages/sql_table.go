// This file holds what the sql sink knows of its table: the columns it writes and their kinds, as
// read from the database when the sink opens, and the statement that writes rows. It is apart from
// sink_sql.go because it changes with the schema the sink supports, not with how batches are
// delivered.

package stages

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
)

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

// checkTable reads the table's columns and types, says which are missing, and prepares the
// sink's statement once.
func (s *sqlSink) checkTable(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, s.dialect.columnsQuery(s.schema != ""), s.dialect.columnsArgs(s.schema, s.table)...)
	if err != nil {
		return fmt.Errorf("reading the columns of table %s: %w", s.display, s.classify(err))
	}
	defer func() { _ = rows.Close() }()
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
	defer func() { _ = rows.Close() }()
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
