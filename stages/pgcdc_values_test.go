package stages

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestCDCValues decodes columns of many types from PostgreSQL's text format (as the source's
// sessions set it: DateStyle ISO, TimeZone UTC, IntervalStyle iso_8601) to their JSON.
func TestCDCValues(t *testing.T) {
	tm := pgtype.NewMap()
	for _, c := range []struct {
		oid  uint32
		text string
		want string
	}{
		{pgtype.Int2OID, "-7", `-7`},
		{pgtype.Int4OID, "42", `42`},
		{pgtype.Int8OID, "9007199254740993", `9007199254740993`},
		{pgtype.Float8OID, "1.5", `1.5`},
		{pgtype.Float4OID, "0.25", `0.25`},
		{pgtype.Float8OID, "NaN", `"NaN"`},
		{pgtype.Float8OID, "Infinity", `"Infinity"`},
		{pgtype.NumericOID, "12345678901234567890.123456789", `12345678901234567890.123456789`},
		{pgtype.NumericOID, "NaN", `"NaN"`},
		{pgtype.NumericOID, "-Infinity", `"-Infinity"`},
		{pgtype.BoolOID, "t", `true`},
		{pgtype.BoolOID, "f", `false`},
		{pgtype.TextOID, `a "quoted" ünïcode`, `"a \"quoted\" ünïcode"`},
		{pgtype.VarcharOID, "v", `"v"`},
		{pgtype.BPCharOID, "ab  ", `"ab  "`},
		{pgtype.UUIDOID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
		{pgtype.TimestamptzOID, "2024-01-02 03:04:05.123456+00", `"2024-01-02T03:04:05.123456Z"`},
		{pgtype.TimestamptzOID, "2024-01-02 03:04:05+02", `"2024-01-02T01:04:05Z"`},
		{pgtype.TimestampOID, "2024-01-02 03:04:05", `"2024-01-02T03:04:05Z"`},
		{pgtype.TimestamptzOID, "infinity", `"infinity"`},
		{pgtype.DateOID, "2024-02-29", `"2024-02-29"`},
		{pgtype.IntervalOID, "P1DT2H", `"P1DT2H"`},
		{pgtype.JSONBOID, `{"a": [1, 2.50, {"b": null}]}`, `{"a":[1,2.50,{"b":null}]}`},
		{pgtype.JSONOID, `[1,"x"]`, `[1,"x"]`},
		{pgtype.ByteaOID, `\x0102ff`, `"AQL/"`},
		{pgtype.Int4ArrayOID, "{1,2,NULL}", `[1,2,null]`},
		{pgtype.TextArrayOID, `{a,"b c"}`, `["a","b c"]`},
		{pgtype.NumericArrayOID, `{1.50,2}`, `[1.50,2]`},
		{pgtype.InetOID, "10.0.0.1/32", `"10.0.0.1/32"`},
		{pgtype.PointOID, "(1,2)", `"(1,2)"`},
		{999999, "an unknown type", `"an unknown type"`},
	} {
		b, err := json.Marshal(cdcValue(tm, c.oid, []byte(c.text)))
		if err != nil {
			t.Errorf("oid %d %q: %v", c.oid, c.text, err)
			continue
		}
		if string(b) != c.want {
			t.Errorf("oid %d %q: %s, want %s", c.oid, c.text, b, c.want)
		}
	}
}

func tuple(values ...any) *pglogrepl.TupleData {
	td := &pglogrepl.TupleData{ColumnNum: uint16(len(values))}
	for _, v := range values {
		switch v := v.(type) {
		case nil:
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull})
		case byte:
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: v})
		case string:
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte(v)})
		}
	}
	return td
}

func cdcMessages(t *testing.T, rel *cdcRelation, msg pglogrepl.Message) []string {
	t.Helper()
	changes, err := cdcChanges(pgtype.NewMap(), rel, msg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, c := range changes {
		m, err := c.message(pglogrepl.LSN(0x16B3748), at)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := m.Payload()
		out = append(out, m.Key+" "+string(p))
	}
	return out
}

// TestCDCChanges makes the messages of inserts, updates and deletes: keyed by table and key, with
// before-images as the replica identity gives them, an unchanged TOASTed value taken from the
// before-image, and an update of the key as a delete and an insert.
func TestCDCChanges(t *testing.T) {
	cols := []cdcColumn{{"id", pgtype.Int8OID}, {"name", pgtype.TextOID}, {"doc", pgtype.JSONBOID}}
	rel := newCDCRelation("public.t", cols, []string{"id"})
	const meta = `"lsn":"0/16B3748","committed_at":"2024-05-06T07:08:09Z"}`
	for _, c := range []struct {
		name string
		msg  pglogrepl.Message
		want []string
	}{
		{"insert", &pglogrepl.InsertMessage{Tuple: tuple("1", "a", `{"x":1}`)},
			[]string{`public.t:[1] {"op":"insert","table":"public.t","key":{"id":1},"before":null,"after":{"doc":{"x":1},"id":1,"name":"a"},` + meta}},
		{"update, default identity", &pglogrepl.UpdateMessage{NewTuple: tuple("1", "b", nil)},
			[]string{`public.t:[1] {"op":"update","table":"public.t","key":{"id":1},"before":null,"after":{"doc":null,"id":1,"name":"b"},` + meta}},
		{"update, full identity, unchanged toast", &pglogrepl.UpdateMessage{OldTupleType: pglogrepl.UpdateMessageTupleTypeOld,
			OldTuple: tuple("1", "a", `{"big":true}`), NewTuple: tuple("1", "b", pglogrepl.TupleDataTypeToast)},
			[]string{`public.t:[1] {"op":"update","table":"public.t","key":{"id":1},"before":{"doc":{"big":true},"id":1,"name":"a"},"after":{"doc":{"big":true},"id":1,"name":"b"},` + meta}},
		{"update of the key", &pglogrepl.UpdateMessage{OldTupleType: pglogrepl.UpdateMessageTupleTypeKey,
			OldTuple: tuple("1", nil, nil), NewTuple: tuple("2", "a", nil)},
			[]string{`public.t:[1] {"op":"delete","table":"public.t","key":{"id":1},"before":{"id":1},"after":null,` + meta,
				`public.t:[2] {"op":"insert","table":"public.t","key":{"id":2},"before":null,"after":{"doc":null,"id":2,"name":"a"},` + meta}},
		{"delete, default identity", &pglogrepl.DeleteMessage{OldTupleType: pglogrepl.DeleteMessageTupleTypeKey, OldTuple: tuple("3", nil, nil)},
			[]string{`public.t:[3] {"op":"delete","table":"public.t","key":{"id":3},"before":{"id":3},"after":null,` + meta}},
		{"delete, full identity", &pglogrepl.DeleteMessage{OldTupleType: pglogrepl.DeleteMessageTupleTypeOld, OldTuple: tuple("3", "c", nil)},
			[]string{`public.t:[3] {"op":"delete","table":"public.t","key":{"id":3},"before":{"doc":null,"id":3,"name":"c"},"after":null,` + meta}},
	} {
		got := cdcMessages(t, rel, c.msg)
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s:\n got %s\nwant %s", c.name, strings.Join(got, "\n     "), strings.Join(c.want, "\n     "))
		}
	}

	// A composite key, in the key's order; a table without one is keyed by its name.
	comp := newCDCRelation("s.c", cols, []string{"name", "id"})
	if got := cdcMessages(t, comp, &pglogrepl.InsertMessage{Tuple: tuple("5", "e", nil)}); !strings.HasPrefix(got[0], `s.c:["e",5] {"op":"insert","table":"s.c","key":{"id":5,"name":"e"}`) {
		t.Errorf("composite key: %s", got[0])
	}
	none := newCDCRelation("s.n", cols, nil)
	if got := cdcMessages(t, none, &pglogrepl.InsertMessage{Tuple: tuple("5", "e", nil)}); !strings.HasPrefix(got[0], `s.n {"op":"insert","table":"s.n","key":null`) {
		t.Errorf("no key: %s", got[0])
	}
	// A column count that does not match the relation is an error, not a wrong message.
	if _, err := cdcChanges(pgtype.NewMap(), rel, &pglogrepl.InsertMessage{Tuple: tuple("1")}, nil); err == nil {
		t.Error("a tuple of 1 column for a relation of 3 was taken")
	}
}

// TestCDCSnapshotMessage: a snapshot row has op "snapshot", the slot's consistent point as its lsn
// and no commit time.
func TestCDCSnapshotMessage(t *testing.T) {
	rel := newCDCRelation("public.t", []cdcColumn{{"id", pgtype.Int4OID}}, []string{"id"})
	c := cdcChange{op: cdcOpSnapshot, rel: rel, after: map[string]any{"id": 4}}
	m, err := c.message(pglogrepl.LSN(0x10), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := m.Payload()
	if want := `{"op":"snapshot","table":"public.t","key":{"id":4},"before":null,"after":{"id":4},"lsn":"0/10","committed_at":null}`; string(p) != want || m.Key != "public.t:[4]" {
		t.Errorf("%s %s, want public.t:[4] %s", m.Key, p, want)
	}
}

// TestCDCProgressConfirmsOnlyWhatRedisHas: the position reported to the server is what Redis has,
// and what the source is done with only once Redis has everything emitted.
func TestCDCProgressConfirmsOnlyWhatRedisHas(t *testing.T) {
	p := &cdcProgress{emitted: 100, handled: 100}
	if got := p.confirm(); got != 0 {
		t.Errorf("nothing polled from Redis yet: confirmed %s", got)
	}
	p.written = 100
	p.emitted, p.handled = 200, 250 // a transaction emitted, not yet written; another with nothing to emit
	if got := p.confirm(); got != 100 {
		t.Errorf("confirmed %s, want what Redis has, 0/64", got)
	}
	p.written = 200
	if got := p.confirm(); got != 250 {
		t.Errorf("confirmed %s, want 0/FA: Redis has all that was emitted", got)
	}
	p.idle, p.idleSeq, p.handledSeq = 300, 5, 4
	if got := p.confirm(); got != 250 {
		t.Errorf("confirmed %s before the messages sent before the keepalive were handled", got)
	}
	p.handledSeq = 5
	if got := p.confirm(); got != 300 {
		t.Errorf("confirmed %s, want the keepalive's 0/12C", got)
	}
	p.inTx = true
	if got := p.confirm(); got != 250 {
		t.Errorf("confirmed %s inside a transaction, want 0/FA", got)
	}
}
