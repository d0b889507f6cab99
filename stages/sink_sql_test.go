package stages

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/sqltest"
)

// sqlSinkFor compiles a sql sink into db's table t with the given columns and extra attributes,
// and opens it.
func sqlSinkFor(t *testing.T, db *sqltest.DB, dsn, columns, extra string) (*sqlSink, error) {
	t.Helper()
	p := plan(t, fmt.Sprintf(`
sink "db" {
  kind    = "sql"
  input   = topic.in
  driver  = %q
  dsn     = %q
  table   = "t"
  columns = %s
  %s
}
`, db.Driver, dsn, columns, extra))
	var s *flow.Sink
	for _, x := range p.Sinks {
		if x.Name == "db" {
			s = x
		}
	}
	k, err := SinkKindOf(s)
	if err != nil {
		t.Fatal(err)
	}
	made, err := k.New(s, Env{Pipeline: "t", Clock: SystemClock{}, Redact: p.Redact})
	if err != nil {
		t.Fatal(err)
	}
	sink := made.(*sqlSink)
	t.Cleanup(func() { _ = sink.Close() })
	return sink, sink.Open(context.Background())
}

func deliveries(ids []string, payloads ...string) []Delivery {
	out := make([]Delivery, len(payloads))
	for i, p := range payloads {
		m := NewMessage("", []byte(p), nil)
		out[i] = Delivery{Message: &m}
		if ids != nil {
			out[i].ID = ids[i]
		}
	}
	return out
}

// typedTable has a column of each kind of type the sink converts to.
func typedTable(driver string) string {
	if driver == "postgres" {
		return `CREATE TABLE t (id bigint PRIMARY KEY, n integer, amount numeric(10,2), ratio double precision,
			ok boolean, name varchar(5), at timestamptz, doc jsonb, day date, note text CHECK (note <> 'bad'))`
	}
	return "CREATE TABLE t (id bigint PRIMARY KEY, n int, amount decimal(10,2), ratio double, ok boolean, " +
		"name varchar(5), at datetime(3), doc json, day date, note text CHECK (note <> 'bad'))"
}

const typedColumns = `{ id = msg.id, n = try(msg.n, null), amount = try(msg.amount, null), ratio = try(msg.ratio, null),
    ok = try(msg.ok, null), name = try(msg.name, null), at = try(msg.at, null), doc = try(msg.doc, null),
    day = try(msg.day, null), note = try(msg.note, null) }`

// TestSQLSinkConvertsByColumnType writes a batch whose values convert by their columns' types, with
// rows that the sink refuses (a value of the wrong type, a text too long) and rows that the
// database refuses (a duplicate key, a check): only those fail, each for good, with the column or
// the database's message; the others are written with their values.
func TestSQLSinkConvertsByColumnType(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, db *sqltest.DB) {
		db.Exec(t, typedTable(db.Driver))
		sink, err := sqlSinkFor(t, db, db.DSN(), typedColumns, "")
		if err != nil {
			t.Fatal(err)
		}
		batch := deliveries(nil,
			`{"id":1,"n":42,"amount":12.345,"ratio":0.5,"ok":true,"name":"ann","at":"2024-05-01T10:00:00.250+02:00","doc":{"a":[1,2]},"day":"2024-05-01","note":"x"}`,
			`{"id":2,"n":"7","amount":"3","ratio":2,"ok":false,"name":"bo","at":1714550400000,"doc":"text","day":"2024-05-02"}`,
			`{"id":3,"n":"seven"}`,
			`{"id":4,"name":"too long"}`,
			`{"id":1,"n":1}`,
			`{"id":5,"note":"bad"}`,
			`{"id":6,"n":99999999999}`,
			`{"id":7}`,
		)
		sink.DeliverBatch(context.Background(), batch)
		fails := map[int]string{2: "column n", 3: "column name", 4: "", 5: "", 6: "column n"}
		for i, d := range batch {
			what, fail := fails[i]
			switch {
			case !fail:
				if d.Err != nil {
					t.Errorf("row %d: %v", i, d.Err)
				}
			case d.Err == nil:
				t.Errorf("row %d was written", i)
			case !IsPermanent(d.Err):
				t.Errorf("row %d: %v is not permanent", i, d.Err)
			case !strings.Contains(d.Err.Error(), what):
				t.Errorf("row %d: %v does not name the %s", i, d.Err, what)
			}
		}
		t.Logf("duplicate: %v", batch[4].Err)
		t.Logf("check: %v", batch[5].Err)
		if db.Driver == "postgres" && !strings.Contains(batch[4].Err.Error(), "Key (id)=(1) already exists") {
			t.Errorf("the duplicate's error does not say which key: %v", batch[4].Err)
		}
		if db.Driver == "mysql" && !strings.Contains(batch[4].Err.Error(), "Duplicate entry '1'") {
			t.Errorf("the duplicate's error does not say which key: %v", batch[4].Err)
		}
		if n := db.Count(t, "SELECT count(*) FROM t"); n != 3 {
			t.Fatalf("%d rows, want 3", n)
		}
		var n, amount, ratio, ok, name, at, doc, day string
		q := "SELECT n, amount, ratio, ok, name, at, doc, day FROM t WHERE id = 1"
		if db.Driver == "postgres" {
			q = "SELECT n::text, amount::text, ratio::text, ok::text, name, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS'), doc::text, day::text FROM t WHERE id = 1"
		}
		if err := db.SQL.QueryRow(q).Scan(&n, &amount, &ratio, &ok, &name, &at, &doc, &day); err != nil {
			t.Fatal(err)
		}
		got := strings.Join([]string{n, amount, ratio, ok, name, at, strings.ReplaceAll(doc, " ", ""), day}, "|")
		wantRow := map[string]string{
			"postgres": `42|12.35|0.5|true|ann|2024-05-01 08:00:00.250|{"a":[1,2]}|2024-05-01`,
			"mysql":    `42|12.35|0.5|1|ann|2024-05-01 08:00:00.250|{"a":[1,2]}|2024-05-01`,
		}[db.Driver]
		if got != wantRow {
			t.Errorf("row 1 reads %s, want %s", got, wantRow)
		}
		q = "SELECT n, at, doc FROM t WHERE id = 2"
		if db.Driver == "postgres" {
			q = "SELECT n::text, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS'), doc::text FROM t WHERE id = 2"
		}
		if err := db.SQL.QueryRow(q).Scan(&n, &at, &doc); err != nil {
			t.Fatal(err)
		}
		if got, want := n+"|"+at+"|"+doc, `7|2024-05-01 08:00:00.000|"text"`; got != want {
			t.Errorf("row 2 reads %s, want %s", got, want)
		}
	})
}

// TestSQLSinkUpserts updates the rows whose key exists, and inserts the others.
func TestSQLSinkUpserts(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, db *sqltest.DB) {
		db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, v integer)", "INSERT INTO t VALUES (1, 10)")
		sink, err := sqlSinkFor(t, db, db.DSN(), `{ id = msg.id, v = msg.v }`, `upsert = ["id"]`)
		if err != nil {
			t.Fatal(err)
		}
		batch := deliveries(nil, `{"id":1,"v":11}`, `{"id":2,"v":20}`, `{"id":2,"v":21}`)
		sink.DeliverBatch(context.Background(), batch)
		for i, d := range batch {
			if d.Err != nil {
				t.Errorf("row %d: %v", i, d.Err)
			}
		}
		if got := db.Count(t, "SELECT sum(v) FROM t"); got != 11+21 {
			t.Errorf("the values sum to %d, want 32", got)
		}
	})
}

// TestSQLSinkWritesAnEntryOnce delivers a batch with effectively_once, then the same entries again
// with new ones, as after a crash between the commit and the ack: each entry is written once.
func TestSQLSinkWritesAnEntryOnce(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, db *sqltest.DB) {
		db.Exec(t, "CREATE TABLE t (id bigint, v integer)")
		sink, err := sqlSinkFor(t, db, db.DSN(), `{ id = msg.id, v = try(msg.v, null) }`, `delivery = "effectively_once"`)
		if err != nil {
			t.Fatal(err)
		}
		first := deliveries([]string{"1-0", "1-1", "2-0"}, `{"id":1}`, `{"id":2}`, `{"id":3}`)
		sink.DeliverBatch(context.Background(), first)
		again := deliveries([]string{"1-1", "2-0", "3-5"}, `{"id":2}`, `{"id":3}`, `{"id":4}`)
		sink.DeliverBatch(context.Background(), again)
		for _, d := range append(first, again...) {
			if d.Err != nil {
				t.Fatal(d.Err)
			}
		}
		if got := db.Count(t, "SELECT count(*) FROM t"); got != 4 {
			t.Errorf("%d rows, want 4", got)
		}
		// Another partition's entries with the same IDs are other entries.
		other := deliveries([]string{"1-0"}, `{"id":5}`)
		other[0].Partition = 1
		sink.DeliverBatch(context.Background(), other)
		if got := db.Count(t, "SELECT count(*) FROM t"); got != 5 || other[0].Err != nil {
			t.Errorf("%d rows (%v), want 5", got, other[0].Err)
		}
	})
}

// TestSQLSinkChecksTheTableAtStart: a missing table or column is named when the sink opens, and so
// is an upsert key that is not a unique key (PostgreSQL checks it when the statement is prepared).
func TestSQLSinkChecksTheTableAtStart(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, db *sqltest.DB) {
		if _, err := sqlSinkFor(t, db, db.DSN(), `{ id = msg.id }`, ""); err == nil || !strings.Contains(err.Error(), "table t does not exist") {
			t.Errorf("no table: %v", err)
		}
		db.Exec(t, "CREATE TABLE t (id bigint, v integer)")
		_, err := sqlSinkFor(t, db, db.DSN(), `{ id = msg.id, value = msg.v, w = 1 }`, "")
		if err == nil || !strings.Contains(err.Error(), "table t has no column value, w (its columns: id, v)") {
			t.Errorf("missing columns: %v", err)
		}
		if db.Driver == "postgres" {
			_, err := sqlSinkFor(t, db, db.DSN(), `{ id = msg.id, v = msg.v }`, `upsert = ["id"]`)
			if err == nil || !strings.Contains(err.Error(), "ON CONFLICT") {
				t.Errorf("an upsert without a unique key: %v", err)
			}
		}
	})
}

// TestSQLSinkHidesThePassword: a connection string's password appears in no error, and the plan
// hides it (graphs, logs, dead letters).
func TestSQLSinkHidesThePassword(t *testing.T) {
	for driver, dsn := range map[string]string{
		"postgres": "postgres://flowrun:s3cret-pw@127.0.0.1:1/nowhere?connect_timeout=1",
		"mysql":    "flowrun:s3cret-pw@tcp(127.0.0.1:1)/nowhere?timeout=1s",
	} {
		t.Run(driver, func(t *testing.T) {
			p := plan(t, fmt.Sprintf(`
sink "db" {
  kind    = "sql"
  input   = topic.in
  driver  = %q
  dsn     = %q
  table   = "t"
  columns = { id = msg.id }
}
`, driver, dsn))
			if got := p.Redact("dsn " + dsn); strings.Contains(got, "s3cret") {
				t.Errorf("the plan does not hide the password: %s", got)
			}
			if d := fmt.Sprint(p.Describe()); strings.Contains(d, "s3cret") {
				t.Errorf("the plan's description shows the password: %s", d)
			}
			s := p.Sinks[0]
			k, _ := SinkKindOf(s)
			made, err := k.New(s, Env{Pipeline: "t", Redact: p.Redact})
			if err != nil {
				t.Fatal(err)
			}
			sink := made.(*sqlSink)
			if err := sink.openDB(); err != nil { // a valid DSN opens without connecting
				t.Fatal(err)
			}
			defer sink.Close()
			err = sink.prepare(context.Background()) // what Open waits on while the database is away
			if err == nil {
				t.Fatal("opened a sink on port 1")
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows the password: %v", err)
			}
			if !IsTransient(err) {
				t.Errorf("a refused connection is not transient: %v", err)
			}
		})
	}
}

// TestSQLSinkValidates checks the attributes that span each other.
func TestSQLSinkValidates(t *testing.T) {
	for _, c := range []struct{ attrs, want string }{
		{`driver = "postgres"
  dsn = "postgres://u@h/db"
  columns = { id = msg.id }
  upsert = ["key"]`, `upsert names "key", which columns does not set`},
		{`driver = "mysql"
  dsn = "not a dsn"
  columns = { id = msg.id }`, "The mysql connection string cannot be read"},
		{`driver = "oracle"
  dsn = "x"
  columns = { id = msg.id }`, "oracle"},
		{`driver = "postgres"
  dsn = "postgres://u@h/db"
  table = "a.b.c"
  columns = { id = msg.id }`, "not a table name"},
	} {
		src := `
pipeline "t" {}
topic "in" {}
source "s" {
  kind   = "stdin"
  output = topic.in
}
sink "db" {
  kind  = "sql"
  input = topic.in
  table = "t"
  ` + c.attrs + `
}
`
		src = strings.Replace(src, "table = \"t\"\n  driver = \"postgres\"\n  dsn = \"postgres://u@h/db\"\n  table = \"a.b.c\"", "driver = \"postgres\"\n  dsn = \"postgres://u@h/db\"\n  table = \"a.b.c\"", 1)
		cfg, diags := flow.LoadSource(map[string][]byte{"t.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{})
		}
		if !diags.HasErrors() || !strings.Contains(diags.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.attrs, diags, c.want)
		}
	}
}

// BenchmarkSQLSink writes batches of 1000 rows (an id, a text, a decimal, a timestamp, a JSON
// document), one transaction each, with and without the ledger, and reports rows/s:
// go test ./stages -run '^$' -bench SQLSink.
func BenchmarkSQLSink(b *testing.B) {
	for _, driver := range []string{"postgres", "mysql"} {
		for _, delivery := range []string{"at_least_once", "effectively_once"} {
			b.Run(driver+"/"+delivery, func(b *testing.B) {
				db := sqltest.New(b, driver)
				table := "CREATE TABLE t (id bigint PRIMARY KEY, k varchar(20), amount numeric(14,2), at timestamptz, doc jsonb)"
				if driver == "mysql" {
					table = "CREATE TABLE t (id bigint PRIMARY KEY, k varchar(20), amount decimal(14,2), at datetime(3), doc json)"
				}
				db.Exec(b, table)
				p := plan(b, fmt.Sprintf(`
sink "db" {
  kind     = "sql"
  input    = topic.in
  driver   = %q
  dsn      = %q
  table    = "t"
  columns  = { id = msg.id, k = msg.k, amount = msg.amount, at = msg.at, doc = msg.doc }
  delivery = %q
}
`, driver, db.DSN(), delivery))
				k, _ := SinkKindOf(p.Sinks[0])
				made, err := k.New(p.Sinks[0], Env{Pipeline: "bench", Clock: SystemClock{}})
				if err != nil {
					b.Fatal(err)
				}
				sink := made.(*sqlSink)
				if err := sink.Open(context.Background()); err != nil {
					b.Fatal(err)
				}
				defer sink.Close()
				const rows = 1000
				next := 0
				b.ResetTimer()
				for range b.N {
					batch := make([]Delivery, rows)
					for i := range batch {
						m := NewMessage("", []byte(fmt.Sprintf(`{"id":%d,"k":"k%d","amount":%d.25,"at":"2024-05-01T10:00:00Z","doc":{"i":%d}}`,
							next, next%50, next, next)), nil)
						batch[i] = Delivery{Message: &m, ID: fmt.Sprintf("%d-0", next), Partition: 0}
						next++
					}
					sink.DeliverBatch(context.Background(), batch)
					for _, d := range batch {
						if d.Err != nil {
							b.Fatal(d.Err)
						}
					}
				}
				b.ReportMetric(float64(b.N*rows)/b.Elapsed().Seconds(), "rows/s")
			})
		}
	}
}
