package stages

import (
	"context"
	"testing"
)

// tableStageOf compiles the stage of a table over topic "in" with the given key attribute.
func tableStageOf(t *testing.T, keyAttr string) (StatefulStage, *memState) {
	t.Helper()
	src := `
table "customers" {
  input = topic.in
  ` + keyAttr + `
}
`
	p := plan(t, src)
	st := newMemState()
	proc, err := CompileStateful(p.Table("customers").Stage, Env{Node: "customers.table"})
	if err != nil {
		t.Fatal(err)
	}
	if !proc.Absorbs {
		t.Fatal("a table's stage absorbs what it takes in")
	}
	return proc, st
}

// put processes one message of key and payload, returning its outputs and error.
func (s *memState) put(proc StatefulStage, key, payload string) ([]Output, error) {
	var outs []Output
	err := s.attempt(func() error {
		m := NewEntryMessage(key, []byte(payload), nil)
		o, err := proc.Processor.Process(context.Background(), s.state(), &m, nil)
		outs = o
		return err
	})
	return outs, err
}

// A table keeps the latest payload of each key, passes nothing on, and forgets a key on a null
// payload.
func TestTableKeepsTheLatestRow(t *testing.T) {
	proc, st := tableStageOf(t, "")
	for _, m := range []struct{ key, payload string }{
		{"c1", `{"name":"Ada"}`}, {"c2", `{"name":"Grace"}`}, {"c1", `{"name":"Ada L."}`}, {"c3", `{"name":"Linus"}`}, {"c3", ` null `},
	} {
		outs, err := st.put(proc, m.key, m.payload)
		if err != nil || len(outs) != 0 {
			t.Fatalf("%s %s: %v, %d outputs; want it kept, nothing passed on", m.key, m.payload, err, len(outs))
		}
	}
	want := map[string]string{"c1": `{"name":"Ada L."}`, "c2": `{"name":"Grace"}`}
	if len(st.values) != len(want) {
		t.Fatalf("state %q, want %q", st.values, want)
	}
	for k, v := range want {
		if got := string(st.values[k]); got != v {
			t.Fatalf("row %s = %s, want %s", k, got, v)
		}
	}
	// Deleting a key the table does not hold is no error.
	if _, err := st.put(proc, "c9", "null"); err != nil {
		t.Fatal(err)
	}
}

// A table with a key expression keys each row by it; a message without a key, or with one of
// flowrun's own, fails for good.
func TestTableKeyExpression(t *testing.T) {
	proc, st := tableStageOf(t, "key = msg.id")
	if _, err := st.put(proc, "ignored", `{"id":"c1","n":1}`); err != nil {
		t.Fatal(err)
	}
	if got := string(st.values["c1"]); got != `{"id":"c1","n":1}` {
		t.Fatalf("row c1 = %q", got)
	}
	for _, payload := range []string{`{"id":""}`, `{"id":"\u0000watermark"}`, `{"other":1}`, `[1]`} {
		if _, err := st.put(proc, "k", payload); err == nil || !IsPermanent(err) {
			t.Fatalf("%s: %v, want a permanent error", payload, err)
		}
	}
	// The topic "in" is not keyed by msg.id (and has one partition: no repartition topic), so a
	// null payload's key is not its row's: the delete cannot be applied.
	if _, err := st.put(proc, "c1", "null"); err == nil || !IsPermanent(err) {
		t.Fatalf("a delete on a table keyed otherwise than its topic: %v, want a permanent error", err)
	}
	if len(st.values) != 1 {
		t.Fatalf("state %q", st.values)
	}
	// Without a key expression, a message without a key has no row.
	plain, st2 := tableStageOf(t, "")
	if _, err := st2.put(plain, "", `{"n":1}`); err == nil || !IsPermanent(err) {
		t.Fatalf("a message without a key: %v, want a permanent error", err)
	}
}
