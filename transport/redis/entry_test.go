package redis

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	goredis "github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"

	"github.com/flowrun/flowrun/transport/jsonscan"
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

const validTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func TestDecodeEntry(t *testing.T) {
	e, err := DecodeEntry(msg("1-1", "payload", `{"id":42}`, "key", "c1", "headers", `{"h":"v"}`, "traceparent", validTP, "tracestate", "ts", "other", "ignored"))
	if err != nil {
		t.Fatal(err)
	}
	want := Entry{ID: "1-1", Key: "c1", Payload: []byte(`{"id":42}`), Headers: map[string]string{"h": "v"}, TraceParent: validTP, TraceState: "ts"}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("DecodeEntry = %+v\nwant %+v", e, want)
	}
}

func TestDecodeFlatEntry(t *testing.T) {
	// What `redis-cli XADD s * type order.placed order_id 42 amount 99.5` writes.
	e, err := DecodeEntry(msg("5-0", "type", "order.placed", "order_id", "42", "amount", "99.5", "traceparent", validTP, "key", "k"))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Flat || e.TraceParent != validTP || e.Key != "" || e.Headers != nil {
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
		// encoding/json and gjson accept invalid UTF-8 in strings; the first encoder to write the
		// message would replace it with U+FFFD.
		{msg("1-0", "payload", "{\"a\":\"\xff\"}"), "payload is not valid UTF-8 (at byte 6)"},
		{msg("1-0", "payload", "\"caf\xe9\""), "payload is not valid UTF-8 (at byte 4)"},
		{msg("1-0", "payload", `{"a":1}`, "key", "k\xff"), "key is not valid UTF-8"},
		{msg("1-0", "payload", `{"a":1}`, "headers", "{\"h\":\"\xfe\"}"), "headers are not valid UTF-8"},
		{msg("1-0", "order_id", "42", "note", "caf\xe9"), `field "note" is not valid UTF-8`},
		{msg("1-0", "order_id", "42", "n\xffte", "x"), `field "n\xffte" is not valid UTF-8`},
		{msg("1-0", "payload", strings.Repeat("[", MaxDepth+1)+strings.Repeat("]", MaxDepth+1)),
			"payload is nested deeper than 1000 levels of objects and arrays (at byte 1000)"},
		// 20 MB of brackets: gjson's validator alone would overflow the goroutine's stack.
		{msg("1-0", "payload", strings.Repeat("[", 20<<20)), "payload is nested deeper than 1000 levels"},
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
		if _, ok := c.m.Values["payload"]; ok && me.Fields["payload"] != c.m.Values["payload"] {
			t.Errorf("%v: raw fields not kept: %v", c.m, me.Fields)
		}
	}
}

// TestDecodeEntryDepthLimit accepts nesting up to MaxDepth, which every decoder of the pipeline
// (encoding/json, the expression engine) survives.
func TestDecodeEntryDepthLimit(t *testing.T) {
	p := `{"a":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`
	if _, err := DecodeEntry(msg("1-0", "payload", p)); err != nil {
		t.Fatalf("nesting of %d levels: %v", MaxDepth, err)
	}
	var v any
	if err := json.Unmarshal([]byte(p), &v); err != nil {
		t.Fatalf("encoding/json refuses what DecodeEntry accepts: %v", err)
	}
}

// TestDecodeEntryTraceContext drops a traceparent that is not valid W3C trace context, and the
// tracestate with it: it is neither used nor passed on, and the entry says so.
func TestDecodeEntryTraceContext(t *testing.T) {
	future := "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cases := []struct {
		traceParent string
		valid       bool
	}{
		{validTP, true},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", true},
		{future, true},                       // a later version, read by the prefix of version 00
		{future + "-what-comes-later", true}, // a later version with more fields
		{future + "x", false},                // more without a dash
		{validTP + "-x", false},              // version 00 is exactly 55 characters
		{"ff" + validTP[2:], false},          // version ff is invalid
		{"0g" + validTP[2:], false},          // not hex
		{strings.ToUpper(validTP), false},    // uppercase hex
		{"00-00000000000000000000000000000000-b7ad6b7169203331-01", false}, // zero trace id
		{"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", false}, // zero span id
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0x", false},
		{"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false},
		{validTP[:54], false},
		{"tp", false},
		{"", false},
	}
	for _, c := range cases {
		for _, m := range []goredis.XMessage{
			msg("1-0", "payload", `{"a":1}`, "traceparent", c.traceParent, "tracestate", "rojo=00f067aa0ba902b7"),
			msg("1-0", "a", "1", "traceparent", c.traceParent, "tracestate", "rojo=00f067aa0ba902b7"), // flat
		} {
			e, err := DecodeEntry(m)
			if err != nil {
				t.Fatalf("%q: %v", c.traceParent, err)
			}
			if c.valid && (e.TraceParent != c.traceParent || e.TraceState != "rojo=00f067aa0ba902b7" || e.TraceDropped) {
				t.Errorf("%q (flat %v): kept as %+v, want it as it came", c.traceParent, e.Flat, e)
			}
			if !c.valid && (e.TraceParent != "" || e.TraceState != "" || !e.TraceDropped) {
				t.Errorf("%q (flat %v): kept as %+v, want it dropped with the tracestate", c.traceParent, e.Flat, e)
			}
			if e.Flat && string(e.Payload) != `{"a":"1"}` {
				t.Errorf("%q: flat payload %s", c.traceParent, e.Payload)
			}
		}
	}
	// An invalid tracestate alone is dropped; the traceparent stays.
	e, err := DecodeEntry(msg("1-0", "payload", `{"a":1}`, "traceparent", validTP, "tracestate", "rojo=\x01"))
	if err != nil || e.TraceParent != validTP || e.TraceState != "" || e.TraceDropped {
		t.Errorf("invalid tracestate: %+v, %v", e, err)
	}
	// Without a traceparent, nothing is dropped: the message simply has no trace context.
	e, err = DecodeEntry(msg("1-0", "payload", `{"a":1}`))
	if err != nil || e.TraceDropped {
		t.Errorf("no trace context: %+v, %v", e, err)
	}
}

// TestDecodeEntrySizeLimit refuses an entry larger than the limit before decoding any of it, and
// keeps only the start of each field for its dead letter.
func TestDecodeEntrySizeLimit(t *testing.T) {
	payload := `{"blob":"` + strings.Repeat("x", 5000) + `"}`
	size := int64(len("payload") + len(payload) + len("key") + len("k1"))
	for _, m := range []goredis.XMessage{
		msg("1-0", "payload", payload, "key", "k1"),
		msg("1-0", "payload", payload[:len(payload)-1], "key", "k1"), // invalid JSON: not even looked at
	} {
		_, err := decodeEntry(m, size-2)
		var me *MalformedEntryError
		if !errors.As(err, &me) || !strings.Contains(me.Reason, "larger than the limit of") ||
			!strings.Contains(me.Reason, "(max_message_size)") {
			t.Fatalf("entry over the limit: %v", err)
		}
		if len(me.Fields["payload"]) > 1100 || !strings.Contains(me.Fields["payload"], "bytes in all)") || me.Fields["key"] != "k1" {
			t.Errorf("the dead letter keeps %d bytes of the payload: %.80q...", len(me.Fields["payload"]), me.Fields["payload"])
		}
	}
	if _, err := decodeEntry(msg("1-0", "payload", payload, "key", "k1"), size); err != nil {
		t.Errorf("entry at the limit: %v", err)
	}
	// Fields of other names count too, and so do a flat entry's.
	if _, err := decodeEntry(msg("1-0", "payload", `{}`, "other", payload), size-2); err == nil {
		t.Error("an entry large by a field of another name passed")
	}
	if _, err := decodeEntry(msg("1-0", "a", payload), int64(len(payload))); err == nil {
		t.Error("a large flat entry passed")
	}
	e := Entry{Payload: []byte(payload), Key: "k1", Headers: map[string]string{"h": "v"}, TraceParent: validTP}
	values, err := EncodeEntry(e)
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]any{}
	var stored int64
	for i := 0; i < len(values); i += 2 {
		fields[values[i].(string)] = toString(values[i+1])
		stored += int64(len(values[i].(string)) + len(toString(values[i+1])))
	}
	if got := EntrySize(e); got != stored || messageSize(goredis.XMessage{Values: fields}) != stored {
		t.Errorf("EntrySize = %d, messageSize = %d, want the %d bytes XADD stores", got, messageSize(goredis.XMessage{Values: fields}), stored)
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
		"payload\x00{}\x00traceparent\x0000-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\x00tracestate\x00a=b",
		"payload\x00\"\xff\"",
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
		e, err := DecodeEntry(m)
		if p, ok := m.Values[FieldPayload].(string); ok && jsonscan.Check([]byte(p)) == nil && gjson.Valid(p) != json.Valid([]byte(p)) {
			t.Fatalf("the payload validator disagrees with encoding/json on %q", p)
		}
		if err == nil && (!utf8.Valid(e.Payload) || !json.Valid(e.Payload)) {
			t.Fatalf("accepted a payload that is not valid UTF-8 JSON: %q", e.Payload)
		}
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

// BenchmarkDecodeEntryLimited is BenchmarkDecodeEntry with the size limit every node reads with.
func BenchmarkDecodeEntryLimited(b *testing.B) {
	m := msg("1-1", "payload", `{"customer_id":"c-42","amount":99.5,"country":"de"}`, "key", "c-42", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	for b.Loop() {
		if _, err := decodeEntry(m, 64<<20); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMarshalStringsIsJSON: headers encode to what encoding/json (without HTML escaping) writes,
// with sorted keys, whether their strings take the plain path or not.
func TestMarshalStringsIsJSON(t *testing.T) {
	for _, m := range []map[string]string{
		{},
		{"flowrun-side": "left", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"q": `say "hi"`, "b": `a\b`, "nl": "a\nb", "tab": "\t", "del": "\x7f", "html": "<a&b>"},
		{"é": "café", "line": "a\u2028b", "bad": "\xff", "": ""},
	} {
		got, err := marshalStrings(m)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(m); err != nil { // encoding/json sorts map keys
			t.Fatal(err)
		}
		if want := strings.TrimSuffix(buf.String(), "\n"); string(got) != want {
			t.Errorf("marshalStrings(%q) = %s, want %s", m, got, want)
		}
	}
}

// TestPlainStringsDecodesAsJSONDoes: the fast decoding of headers gives what json.Unmarshal gives,
// or leaves the text to it.
func TestPlainStringsDecodesAsJSONDoes(t *testing.T) {
	for _, text := range []string{
		`{}`, `{"a":"b"}`, `{"flowrun-watermark:msg.dateTime":"1767225600004","k":""}`, `{"a":"1","a":"2"}`,
		`{"é":"\u2028 <&>"}`, `{"a":"b",}`, `{"a":1}`, `{"a":"b"} `, ` {"a":"b"}`, `{"a" :"b"}`, `{"a":"b\"c"}`,
		`{"a":"tab	here"}`, `{"a"}`, `{"a":"b"`, `{`, `null`, `{"a":"b""c":"d"}`, `{"":""}`,
	} {
		got, plain := plainStrings([]byte(text))
		if !plain {
			continue
		}
		var want map[string]string
		if err := json.Unmarshal([]byte(text), &want); err != nil {
			t.Errorf("%s: decoded as %v, but json.Unmarshal says %v", text, got, err)
			continue
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: %v, json.Unmarshal %v", text, got, want)
		}
	}
	if _, plain := plainStrings([]byte(`{"a":"b"}`)); !plain {
		t.Error("plain headers were left to json.Unmarshal")
	}
}
