package stages

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// fakeTable is a TableReader over a map, counting its reads.
type fakeTable struct {
	rows  map[string]string
	reads int
	err   error
}

func (f *fakeTable) Get(_ context.Context, key string) ([]byte, bool, error) {
	f.reads++
	if f.err != nil {
		return nil, false, f.err
	}
	row, ok := f.rows[key]
	return []byte(row), ok, nil
}

func (f *fakeTable) GetMany(ctx context.Context, keys []string) ([][]byte, error) {
	rows := make([][]byte, len(keys))
	for i, key := range keys {
		row, found, err := f.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		if found {
			rows[i] = row
		}
	}
	return rows, nil
}

func (f *fakeTable) GetAsOf(ctx context.Context, key string, _ time.Time) ([]byte, bool, error) {
	return f.Get(ctx, key)
}

func lookupProcessor(t *testing.T, missing string, table *fakeTable) Processor {
	t.Helper()
	p := plan(t, `
table "customers" {
  input = topic.b
}
stage "enriched" {
  kind    = "lookup"
  input   = topic.in
  output  = topic.a
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
  missing = "`+missing+`"
}
`+sinkA)
	proc, err := Compile(p.Stage("enriched"), Env{Tables: map[string]TableReader{"customers": table}})
	if err != nil {
		t.Fatal(err)
	}
	return proc
}

func TestLookupAddsTheRow(t *testing.T) {
	table := &fakeTable{rows: map[string]string{"c1": `{"name":"Ada","tier":"gold","n":12345678901234567890}`}}
	proc := lookupProcessor(t, "null", table)
	outs, err := process(t, proc, `{"order_id":"o1","customer_id":"c1"}`)
	if err != nil || len(outs) != 1 {
		t.Fatalf("%v, %d outputs", err, len(outs))
	}
	if got, want := payloadOf(t, outs[0]), `{"customer":{"n":12345678901234567890,"name":"Ada","tier":"gold"},"customer_id":"c1","order_id":"o1"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if outs[0].Message.Key != "k" || outs[0].DeadLetter != "" || outs[0].Topic.Name != "a" {
		t.Fatalf("output %+v: the lookup keeps the key and goes to its output", outs[0])
	}
}

func TestLookupMissing(t *testing.T) {
	table := &fakeTable{rows: map[string]string{}}
	outs, err := process(t, lookupProcessor(t, "null", table), `{"customer_id":"c9"}`)
	if err != nil || len(outs) != 1 || payloadOf(t, outs[0]) != `{"customer":null,"customer_id":"c9"}` {
		t.Fatalf("null: %v %v", err, outs)
	}
	outs, err = process(t, lookupProcessor(t, "drop", table), `{"customer_id":"c9"}`)
	if err != nil || len(outs) != 0 {
		t.Fatalf("drop: %v, %d outputs; want nothing passed on (filtered)", err, len(outs))
	}
	outs, err = process(t, lookupProcessor(t, "dead_letter", table), `{"customer_id":"c9"}`)
	if err != nil || len(outs) != 1 || outs[0].DeadLetter != `table customers has no row of key "c9"` {
		t.Fatalf("dead_letter: %v %+v", err, outs)
	}
	// No row has an empty key or one of flowrun's own: those are not even read.
	reads := table.reads
	for _, payload := range []string{`{"customer_id":""}`, `{"customer_id":"\u0000watermark"}`} {
		if outs, err := process(t, lookupProcessor(t, "null", table), payload); err != nil || len(outs) != 1 ||
			!strings.Contains(payloadOf(t, outs[0]), `"customer":null`) {
			t.Fatalf("%s: %v %v", payload, err, outs)
		}
	}
	if table.reads != reads {
		t.Fatalf("%d reads of keys no row has", table.reads-reads)
	}
}

func TestLookupErrors(t *testing.T) {
	table := &fakeTable{rows: map[string]string{"c1": `not json`}}
	proc := lookupProcessor(t, "null", table)
	if _, err := process(t, proc, `{"customer_id":"c1"}`); err == nil || !IsPermanent(err) || !strings.Contains(err.Error(), "table customers") {
		t.Fatalf("an unreadable row: %v, want a permanent error naming the table", err)
	}
	if _, err := process(t, proc, `{"other":1}`); err == nil || !IsPermanent(err) {
		t.Fatalf("a key that cannot evaluate: %v, want a permanent error", err)
	}
	table.err = errors.New("connection refused")
	if _, err := process(t, proc, `{"customer_id":"c1"}`); err == nil || IsPermanent(err) {
		t.Fatalf("a failed read: %v, want an error that is retried", err)
	}
	// A runtime that gives no reader of the table cannot make the stage.
	p := plan(t, `
table "customers" {
  input = topic.b
}
stage "enriched" {
  kind   = "lookup"
  input  = topic.in
  output = topic.a
  table  = table.customers
  key    = msg.customer_id
  as     = "customer"
}
`+sinkA)
	if _, err := Compile(p.Stage("enriched"), Env{}); err == nil {
		t.Fatal("a lookup without its table's reader compiles")
	}
}

// A lookup reads the rows of a batch's keys at once (BatchReader): each distinct key once, none
// of the keys no row has; Process then finds its row, or its absence, without reading, and reads
// for itself a key the batch did not read (a message made by a stage fused before it).
func TestLookupReadsABatchAtOnce(t *testing.T) {
	table := &fakeTable{rows: map[string]string{"c1": `{"name":"Ada"}`}}
	proc := lookupProcessor(t, "null", table)
	reader, ok := proc.(BatchReader)
	if !ok {
		t.Fatal("the lookup is no BatchReader")
	}
	var batch []*Message
	for _, payload := range []string{`{"customer_id":"c1"}`, `{"customer_id":"c2"}`, `{"customer_id":"c1"}`, `{"customer_id":""}`, `{"other":1}`} {
		m := NewMessage("k", []byte(payload), nil)
		batch = append(batch, &m)
	}
	read, err := reader.ReadBatch(context.Background(), batch)
	if err != nil || table.reads != 2 {
		t.Fatalf("ReadBatch: %v, %d keys read, want c1 and c2", err, table.reads)
	}
	ctx := WithBatched(context.Background(), read)
	for i, want := range []string{`{"customer":{"name":"Ada"},"customer_id":"c1"}`, `{"customer":null,"customer_id":"c2"}`} {
		outs, err := proc.Process(ctx, batch[i], nil)
		if err != nil || len(outs) != 1 || payloadOf(t, outs[0]) != want {
			t.Fatalf("message %d: %v %v, want %s", i, err, outs, want)
		}
	}
	if table.reads != 2 {
		t.Fatalf("%d reads after the batch's, want none", table.reads-2)
	}
	m := NewMessage("k", []byte(`{"customer_id":"c3"}`), nil)
	if _, err := proc.Process(ctx, &m, nil); err != nil || table.reads != 3 {
		t.Fatalf("a key the batch did not read: %v, %d reads, want it read", err, table.reads-2)
	}
}
