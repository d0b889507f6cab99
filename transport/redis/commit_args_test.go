package redis

import "testing"

// TestArgSlabFieldsAsEncodeEntry: a commit's fields made in an argSlab are EncodeEntry's, as
// go-redis writes them.
func TestArgSlabFieldsAsEncodeEntry(t *testing.T) {
	written := func(v any) string {
		switch v := v.(type) {
		case *string:
			return *v
		case []byte:
			return string(v)
		}
		return v.(string)
	}
	for _, e := range []Entry{
		{Payload: []byte(`1`)},
		{Payload: []byte(`{"a":1}`), Key: "k"},
		{Payload: []byte(`[]`), Headers: map[string]string{"b": "2", "a": "\u00e9\"\n"}},
		{Payload: []byte(`"x"`), Key: "k", Headers: map[string]string{"a": "1"}, TraceParent: goodTraceParent, TraceState: "a=b"},
		{Payload: []byte(`null`), TraceState: "a=b"},
	} {
		want, err := EncodeEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		s := newArgSlab(1)
		s.args = append(s.args, "xadd", "s", "*") // what came before
		got, err := s.fields(e)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%+v: %d fields, want %d", e, len(got), len(want))
		}
		for i := range got {
			if written(got[i]) != written(want[i]) {
				t.Fatalf("%+v: field %d is %q, want %q", e, i, written(got[i]), written(want[i]))
			}
		}
		if cap(got) != len(got) {
			t.Fatal("the fields can be appended to in place")
		}
	}
}
