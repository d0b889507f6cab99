package redis

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"
)

func msg(id string, kv ...string) goredis.XMessage {
	v := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		v[kv[i]] = kv[i+1]
	}
	return goredis.XMessage{ID: id, Values: v}
}

func TestEncodeEntryFieldOrder(t *testing.T) {
	v, err := EncodeEntry(Entry{
		Payload:     []byte(`{"a":1}`),
		Key:         "k1",
		Headers:     map[string]string{"z": "1", "a": "<&>"},
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		TraceState:  "rojo=00f067aa0ba902b7",
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range v {
		got = append(got, toString(x))
	}
	want := []string{
		"payload", `{"a":1}`, "key", "k1", "headers", `{"a":"<&>","z":"1"}`,
		"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate", "rojo=00f067aa0ba902b7",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("EncodeEntry = %q\nwant %q", got, want)
	}
	v, err = EncodeEntry(Entry{Payload: []byte(`42`)})
	if err != nil || len(v) != 2 {
		t.Fatalf("minimal entry = %v, %v", v, err)
	}
	if _, err := EncodeEntry(Entry{}); err == nil {
		t.Errorf("EncodeEntry accepted an empty payload")
	}
	// Invalid JSON is not checked on the write path; the reader reports it.
	v, err = EncodeEntry(Entry{ID: "1-0", Payload: []byte(`{"a":}`)})
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]any{}
	for i := 0; i < len(v); i += 2 {
		fields[v[i].(string)] = string(v[i+1].([]byte))
	}
	if _, err := DecodeEntry(goredis.XMessage{ID: "1-0", Values: fields}); err == nil {
		t.Error("DecodeEntry accepted the invalid payload")
	}
}

func TestDecodeEntry(t *testing.T) {
	e, err := DecodeEntry(msg("1-1", "payload", `{"id":42}`, "key", "c1", "headers", `{"h":"v"}`, "traceparent", "tp", "tracestate", "ts", "other", "ignored"))
	if err != nil {
		t.Fatal(err)
	}
	want := Entry{ID: "1-1", Key: "c1", Payload: []byte(`{"id":42}`), Headers: map[string]string{"h": "v"}, TraceParent: "tp", TraceState: "ts"}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("DecodeEntry = %+v\nwant %+v", e, want)
	}
}

func TestDecodeFlatEntry(t *testing.T) {
	// What `redis-cli XADD s * type order.placed order_id 42 amount 99.5` writes.
	e, err := DecodeEntry(msg("5-0", "type", "order.placed", "order_id", "42", "amount", "99.5", "traceparent", "tp", "key", "k"))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Flat || e.TraceParent != "tp" || e.Key != "" || e.Headers != nil {
		t.Fatalf("flat entry = %+v", e)
	}
	if got := string(e.Payload); got != `{"amount":"99.5","key":"k","order_id":"42","type":"order.placed"}` {
		t.Fatalf("flat payload = %s", got)
	}
}

func TestDecodeMalformed(t *testing.T) {
	cases := []struct {
		m      goredis.XMessage
		reason string
	}{
		{msg("1-0", "payload", "{not json"), "payload is not valid JSON"},
		{msg("1-0", "payload", ""), "payload is not valid JSON"},
		{msg("1-0", "payload", "1", "headers", "[1,2]"), "headers are not a JSON object"},
		{msg("1-0", "payload", "1", "headers", `{"a":1}`), "headers are not a JSON object"},
		{goredis.XMessage{ID: "1-0"}, "no fields"},
	}
	for _, c := range cases {
		_, err := DecodeEntry(c.m)
		var me *MalformedEntryError
		if !errors.As(err, &me) {
			t.Errorf("%v: err = %v, want *MalformedEntryError", c.m, err)
			continue
		}
		if me.ID != "1-0" || !strings.Contains(me.Reason, c.reason) || !strings.Contains(me.Error(), "1-0") {
			t.Errorf("%v: %+v, want reason %q", c.m, me, c.reason)
		}
		if len(c.m.Values) > 0 && me.Fields["payload"] != c.m.Values["payload"] {
			t.Errorf("%v: raw fields not kept: %v", c.m, me.Fields)
		}
	}
}

func TestHeadersNullIsNone(t *testing.T) {
	e, err := DecodeEntry(msg("1-0", "payload", "1", "headers", "null"))
	if err != nil || e.Headers != nil {
		t.Fatalf("headers null = %v, %v", e.Headers, err)
	}
}

// FuzzDecodeEntry feeds arbitrary field lists ("name\x00value\x00name\x00value...") to
// DecodeEntry: it must not panic, and an entry it accepts must re-encode to fields that decode
// to the same entry.
func FuzzDecodeEntry(f *testing.F) {
	for _, s := range []string{
		"payload\x00{\"a\":1}",
		"payload\x00[1,2,3]\x00key\x00k\x00headers\x00{\"x\":\"y\"}\x00traceparent\x00tp\x00tracestate\x00ts",
		"type\x00order.placed\x00order_id\x0042\x00amount\x0099.5",
		"payload\x00{",
		"payload\x001\x00headers\x00[]",
		"traceparent\x00tp",
		"a\x00\xff\xfe",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		parts := strings.Split(raw, "\x00")
		m := goredis.XMessage{ID: "1-1", Values: map[string]any{}}
		for i := 0; i+1 < len(parts); i += 2 {
			m.Values[parts[i]] = parts[i+1]
		}
		if p, ok := m.Values[FieldPayload].(string); ok && gjson.Valid(p) != json.Valid([]byte(p)) {
			t.Fatalf("the payload validator disagrees with encoding/json on %q", p)
		}
		e, err := DecodeEntry(m)
		if err != nil {
			var me *MalformedEntryError
			if !errors.As(err, &me) {
				t.Fatalf("error is not a *MalformedEntryError: %v", err)
			}
			return
		}
		if len(e.Payload) == 0 {
			t.Fatal("decoded entry has no payload")
		}
		values, err := EncodeEntry(e)
		if err != nil {
			t.Fatalf("decoded entry does not encode: %v", err)
		}
		again := goredis.XMessage{ID: e.ID, Values: map[string]any{}}
		for i := 0; i < len(values); i += 2 {
			again.Values[toString(values[i])] = toString(values[i+1])
		}
		e2, err := DecodeEntry(again)
		if err != nil {
			t.Fatalf("re-encoded entry does not decode: %v", err)
		}
		if e2.Key != e.Key || string(e2.Payload) != string(e.Payload) || e2.TraceParent != e.TraceParent ||
			e2.TraceState != e.TraceState || !maps.Equal(e2.Headers, e.Headers) || e2.Flat {
			t.Fatalf("round trip changed the entry:\n%+v\n%+v", e, e2)
		}
	})
}

func BenchmarkDecodeEntry(b *testing.B) {
	m := msg("1-1", "payload", `{"customer_id":"c-42","amount":99.5,"country":"de"}`, "key", "c-42", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	for b.Loop() {
		if _, err := DecodeEntry(m); err != nil {
			b.Fatal(err)
		}
	}
}
