// This file holds what the postgres_cdc source (source_postgres_cdc.go) makes of a row: its
// columns' values, decoded from PostgreSQL's text format by their types into what their JSON is,
// and the messages of a change ({op, table, key, before, after, lsn, committed_at}).

package stages

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// The ops of the postgres_cdc source's messages.
const (
	cdcOpInsert   = "insert"
	cdcOpUpdate   = "update"
	cdcOpDelete   = "delete"
	cdcOpSnapshot = "snapshot"
)

// cdcColumn is a column of a captured table.
type cdcColumn struct {
	name string
	oid  uint32
}

// cdcRelation is a captured table as its rows arrive: from a relation message of the replication
// stream, or from a snapshot query's columns.
type cdcRelation struct {
	table   string // schema.name
	columns []cdcColumn
	key     []int // the key columns' indexes in columns, in the key's order; nil: the table has no key
}

// newCDCRelation makes a relation of columns, whose key is the columns named in key (the table's
// primary key, or its replica identity index). A key column that is missing leaves the table
// without a key.
func newCDCRelation(table string, columns []cdcColumn, key []string) *cdcRelation {
	r := &cdcRelation{table: table, columns: columns}
	for _, k := range key {
		i := -1
		for j, c := range columns {
			if c.name == k {
				i = j
			}
		}
		if i < 0 {
			r.key = nil
			return r
		}
		r.key = append(r.key, i)
	}
	return r
}

// cdcValue converts a column's value, in PostgreSQL's text format (with the session's DateStyle
// ISO, TimeZone UTC and IntervalStyle iso_8601, which the source sets), to the value its JSON is:
// numbers as numbers (numeric with every digit), text as strings, booleans, timestamps as RFC 3339
// in UTC, dates as YYYY-MM-DD, json and jsonb as JSON, arrays as arrays, bytea as base64. What has
// no JSON of its own (NaN, infinity, intervals, geometric types, ranges...) is its text.
func cdcValue(tm *pgtype.Map, oid uint32, text []byte) any {
	switch oid {
	case pgtype.JSONOID, pgtype.JSONBOID:
		if json.Valid(text) {
			return json.RawMessage(append([]byte(nil), text...))
		}
		return string(text)
	case pgtype.NumericOID:
		return cdcNumber(string(text))
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID, pgtype.UUIDOID, pgtype.DateOID,
		pgtype.IntervalOID, pgtype.XMLOID:
		return string(text)
	}
	t, ok := tm.TypeForOID(oid)
	if !ok {
		return string(text)
	}
	v, err := t.Codec.DecodeValue(tm, oid, pgtype.TextFormatCode, text)
	if err != nil {
		return string(text)
	}
	if j, ok := cdcJSON(v); ok {
		return j
	}
	return string(text)
}

// cdcNumber is a numeric's JSON: the number with every digit, or its text when it is not a
// number (NaN, Infinity).
func cdcNumber(text string) any {
	if _, err := strconv.ParseFloat(text, 64); err != nil || strings.ContainsAny(text, "aAnN") {
		return text
	}
	return json.Number(text)
}

// cdcJSON converts a value decoded by pgx to its JSON, and false when it has none of its own.
func cdcJSON(v any) (any, bool) {
	switch x := v.(type) {
	case nil, bool, string, int16, int32, int64, []byte, json.RawMessage:
		return x, true
	case float32:
		return cdcFloat(float64(x))
	case float64:
		return cdcFloat(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), true
	case pgtype.Numeric:
		if !x.Valid {
			return nil, true
		}
		if x.NaN || x.InfinityModifier != pgtype.Finite {
			return nil, false
		}
		b, err := x.MarshalJSON()
		if err != nil {
			return nil, false
		}
		return json.Number(b), true
	case [16]byte:
		return fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16]), true
	case map[string]any:
		return x, true
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			j, ok := cdcJSON(e)
			if !ok {
				if s, isStringer := e.(fmt.Stringer); isStringer {
					j = s.String()
				} else {
					j = fmt.Sprint(e)
				}
			}
			out[i] = j
		}
		return out, true
	}
	return nil, false
}

// cdcFloat is a float's JSON: a number, or no JSON of its own for NaN and infinities.
func cdcFloat(f float64) (any, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, false
	}
	return f, true
}

// row decodes a tuple of the replication stream into a row: column name to value. A column that
// the tuple does not carry (an unchanged TOASTed value) takes its value from base, the row's
// before-image, or is left out when there is none. keyOnly keeps only the key columns (the old
// tuple of a table whose replica identity is its key: its other columns are nulls).
func (r *cdcRelation) row(tm *pgtype.Map, t *pglogrepl.TupleData, base map[string]any, keyOnly bool) (map[string]any, error) {
	if t == nil {
		return nil, nil
	}
	if len(t.Columns) != len(r.columns) {
		return nil, fmt.Errorf("a change to %s has %d columns, its relation %d", r.table, len(t.Columns), len(r.columns))
	}
	row := make(map[string]any, len(r.columns))
	for i, c := range t.Columns {
		if keyOnly && !r.isKey(i) {
			continue
		}
		name := r.columns[i].name
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
			row[name] = nil
		case pglogrepl.TupleDataTypeToast:
			if v, ok := base[name]; ok {
				row[name] = v
			}
		case pglogrepl.TupleDataTypeText:
			row[name] = cdcValue(tm, r.columns[i].oid, c.Data)
		default:
			return nil, fmt.Errorf("a change to %s has column %s in format %q, which the source does not read", r.table, name, c.DataType)
		}
	}
	return row, nil
}

func (r *cdcRelation) isKey(i int) bool {
	for _, k := range r.key {
		if k == i {
			return true
		}
	}
	return false
}

// cdcChange is one message of the source: a change to a row, or a row of a snapshot.
type cdcChange struct {
	op            string
	rel           *cdcRelation
	before, after map[string]any
}

// cdcChanges makes the messages of a change that the replication stream reports. An update that
// changes a row's key is a delete of the old key and an insert of the new one, so that each key's
// messages tell its whole story in its partition.
func cdcChanges(tm *pgtype.Map, rel *cdcRelation, msg pglogrepl.Message, out []cdcChange) ([]cdcChange, error) {
	switch m := msg.(type) {
	case *pglogrepl.InsertMessage:
		after, err := rel.row(tm, m.Tuple, nil, false)
		if err != nil {
			return out, err
		}
		return append(out, cdcChange{op: cdcOpInsert, rel: rel, after: after}), nil
	case *pglogrepl.UpdateMessage:
		before, err := rel.row(tm, m.OldTuple, nil, m.OldTupleType == pglogrepl.UpdateMessageTupleTypeKey)
		if err != nil {
			return out, err
		}
		after, err := rel.row(tm, m.NewTuple, before, false)
		if err != nil {
			return out, err
		}
		if before != nil && rel.key != nil && rel.keyJSON(before) != rel.keyJSON(after) {
			return append(out, cdcChange{op: cdcOpDelete, rel: rel, before: before}, cdcChange{op: cdcOpInsert, rel: rel, after: after}), nil
		}
		return append(out, cdcChange{op: cdcOpUpdate, rel: rel, before: before, after: after}), nil
	case *pglogrepl.DeleteMessage:
		before, err := rel.row(tm, m.OldTuple, nil, m.OldTupleType == pglogrepl.DeleteMessageTupleTypeKey)
		if err != nil {
			return out, err
		}
		return append(out, cdcChange{op: cdcOpDelete, rel: rel, before: before}), nil
	}
	return out, nil
}

// keyJSON is the JSON array of a row's key values, in the key's order.
func (r *cdcRelation) keyJSON(row map[string]any) string {
	vals := make([]any, len(r.key))
	for i, k := range r.key {
		vals[i] = row[r.columns[k].name]
	}
	b, err := json.Marshal(vals)
	if err != nil {
		return fmt.Sprint(vals)
	}
	return string(b)
}

// cdcPayload is the JSON of a message.
type cdcPayload struct {
	Op          string         `json:"op"`
	Table       string         `json:"table"`
	Key         map[string]any `json:"key"`
	Before      map[string]any `json:"before"`
	After       map[string]any `json:"after"`
	LSN         string         `json:"lsn"`
	CommittedAt *string        `json:"committed_at"`
}

// message makes the message of a change: its payload, and its key, the table and the JSON array of
// the row's key values ("public.orders:[42]"), or the table alone for a table without a key. lsn is
// the transaction's commit LSN (a snapshot's: the replication slot's consistent point), committedAt
// its commit time (zero for a snapshot).
func (c *cdcChange) message(lsn pglogrepl.LSN, committedAt time.Time) (Message, error) {
	p := cdcPayload{Op: c.op, Table: c.rel.table, Before: c.before, After: c.after, LSN: lsn.String()}
	if !committedAt.IsZero() {
		s := committedAt.UTC().Format(time.RFC3339Nano)
		p.CommittedAt = &s
	}
	row := c.after
	if row == nil {
		row = c.before
	}
	key := c.rel.table
	if c.rel.key != nil {
		p.Key = make(map[string]any, len(c.rel.key))
		for _, k := range c.rel.key {
			p.Key[c.rel.columns[k].name] = row[c.rel.columns[k].name]
		}
		key += ":" + c.rel.keyJSON(row)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return Message{}, fmt.Errorf("a change to %s: %w", c.rel.table, err)
	}
	return NewMessage(key, b, nil), nil
}
