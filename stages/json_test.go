package stages

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/flowrun/flowrun/transport/jsonscan"
)

// referenceDecode is what DecodePayload did with encoding/json, and what it must still do.
func referenceDecode(payload []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	// Not dec.More, which the old DecodePayload used: it let a stray } or ] after the object pass.
	if len(bytes.TrimLeft(payload[dec.InputOffset():], " \t\r\n")) > 0 {
		return nil, errors.New("data after the value")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("not an object")
	}
	return obj, nil
}

// referenceEncode is what Message.Payload did with encoding/json, and what it must still do.
func referenceEncode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

var codecSeeds = []string{
	`{}`,
	` {"a" : [1, -2.5e+10, 0, 1E-7, 12345678901234567890, true, false, null, {}, []]} `,
	`{"s":"plain","e":"tab\there \"quoted\" back\\slash \/ \b\f\n\r","u":"\u00e9\u2028\u2029\u0000\u001f"}`,
	`{"pair":"\ud83d\ude00","lone":"\ud800","lowfirst":"\udc00\ud800","twohigh":"\ud83d\ud83d\ude00","bad pair":"\ud800\u0041"}`,
	`{"html":"<a href=\"x\">&amp;</a>","zoe":"Zoë","emoji":"👩‍👩‍👧","del":"\u007f"}`,
	`{"dup":1,"dup":2,"nested":{"dup":{"x":1},"dup":[1]}}`,
	`{"deep":` + strings.Repeat(`[`, 200) + strings.Repeat(`]`, 200) + `}`,
	`{"keys":{"b":1,"a":2,"é":3,"A":4,"":5}}`,
	`[1,2]`, `"str"`, `42`, `null`, `true`, ``, `{`, `{"a":1}x`, `{"a":1} {"b":2}`, `{}}`, `{}]`, `{"a":01}`, `{"a":"\x"}`,
	"{\"a\":\"\xff\"}",
}

// FuzzPayloadCodec checks that messages decode and encode as they did with encoding/json: the same
// values, the same errors for what is not a JSON object, and the same bytes out.
func FuzzPayloadCodec(f *testing.F) {
	for _, s := range codecSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		got, err := DecodePayload(p)
		if jsonscan.Check(p) != nil {
			if err == nil || !IsPermanent(err) {
				t.Fatalf("DecodePayload(%q) accepted text that is not UTF-8 or too deep", p)
			}
			return
		}
		want, wantErr := referenceDecode(p)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("DecodePayload(%q) = %v, %v; encoding/json: %v, %v", p, got, err, want, wantErr)
		}
		if err != nil {
			if !IsPermanent(err) {
				t.Fatalf("DecodePayload(%q): %v is not permanent", p, err)
			}
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodePayload(%q) = %#v, encoding/json %#v", p, got, want)
		}
		enc, err := appendJSON(nil, got)
		wantEnc, wantErr := referenceEncode(want)
		if err != nil || wantErr != nil || !bytes.Equal(enc, wantEnc) {
			t.Fatalf("encoding %q: %s, %v; encoding/json %s, %v", p, enc, err, wantEnc, wantErr)
		}
		// Written in pieces, as a large changed message is (cut in its strings too), it is the same.
		chunk := 1 + len(p)%7
		if pieces := writtenInPieces(t, &Message{Value: got}, chunk); !bytes.Equal(pieces, wantEnc) {
			t.Fatalf("WritePayload(%d) of %q: %s; encoding/json %s", chunk, p, pieces, wantEnc)
		}
		// Any string, valid UTF-8 or not, is quoted as encoding/json quotes it, whole or in chunks.
		s := string(p)
		wantEnc = must(referenceEncode(s))
		if enc := appendString(nil, s); !bytes.Equal(enc, wantEnc) {
			t.Fatalf("appendString(%q) = %s, encoding/json %s", s, enc, wantEnc)
		}
		var inChunks []byte
		sp := &spill{chunk: chunk, write: func(b []byte) error { inChunks = append(inChunks, b...); return nil }}
		if rest, err := sp.string(nil, s); err != nil || !bytes.Equal(append(inChunks, rest...), wantEnc) {
			t.Fatalf("spill.string(%q) in chunks of %d = %s, %v; encoding/json %s", s, chunk, append(inChunks, rest...), err, wantEnc)
		}
	})
}

// writtenInPieces returns what m.WritePayload(chunk) writes, checking that no piece but the last is
// shorter than a chunk and that none is kept: the next piece reuses its memory.
func writtenInPieces(t *testing.T, m *Message, chunk int) []byte {
	t.Helper()
	var out []byte
	var short bool
	err := m.WritePayload(chunk, func(b []byte) error {
		if short {
			t.Fatalf("WritePayload(%d) wrote a piece of %d bytes before this one", chunk, len(b))
		}
		short = len(b) < chunk
		out = append(out, b...)
		return nil
	})
	if err != nil {
		t.Fatalf("WritePayload(%d): %v", chunk, err)
	}
	return out
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestEncodeLikeEncodingJSON covers the values that only Go stage functions put in a message:
// numbers of Go types, floats at the edges of the two formats, invalid json.Numbers, and types
// encoding/json encodes on its own.
func TestEncodeLikeEncodingJSON(t *testing.T) {
	type custom struct {
		A int    `json:"a"`
		B string `json:"b,omitempty"`
	}
	values := []any{
		map[string]any{"n": 1, "i64": int64(-7), "u": uint8(3), "f32": float32(0.1), "s": []string{"a<b"}},
		[]any{1e21, 1e20, 1e-6, 1e-7, 123456789.125, math.Copysign(0, -1), 0.0, math.MaxFloat64, math.SmallestNonzeroFloat64, 5e-324},
		[]any{json.Number(""), json.Number("1.5e3"), json.Number("-0")},
		map[string]any{"custom": custom{A: 1}, "ptr": &custom{B: "<>"}, "m": map[string]string{"z": "1", "a": "2"}},
		map[string]any{"raw": json.RawMessage(`{"x": 1}`), "nil map": map[string]any(nil), "nil list": []any(nil)},
		"\xff\xfe invalid \u2028",
	}
	for _, v := range values {
		got, err := appendJSON([]byte("prefix:"), v)
		want, wantErr := referenceEncode(v)
		if err != nil || wantErr != nil || string(got) != "prefix:"+string(want) {
			t.Errorf("appendJSON(%#v) = %s, %v; encoding/json %s, %v", v, got, err, want, wantErr)
		}
	}
	for _, v := range []any{math.NaN(), math.Inf(1), json.Number("1x"), map[string]any{"f": func() {}}} {
		_, err := appendJSON(nil, v)
		_, wantErr := referenceEncode(v)
		if err == nil || wantErr == nil || err.Error() != wantErr.Error() {
			t.Errorf("appendJSON(%#v) error %v, encoding/json %v", v, err, wantErr)
		}
	}
}

// TestDecodePayloadRefusesWhatWouldChange: text that is not UTF-8 would come out of encoding/json
// with U+FFFD in place of its bytes, and text nested past MaxDepth is refused before it is
// parsed; both are permanent errors that say why.
func TestDecodePayloadRefusesWhatWouldChange(t *testing.T) {
	cases := map[string]string{
		"{\"name\":\"caf\xe9\"}":                       "payload is not valid UTF-8 (at byte 12)",
		`{"a":` + strings.Repeat("[", MaxDepth) + `]}`: "payload is nested deeper than 1000 levels of objects and arrays (at byte 1004)",
		strings.Repeat("[", 20<<20):                    "payload is nested deeper than 1000 levels",
	}
	for p, want := range cases {
		_, err := DecodePayload([]byte(p))
		if err == nil || !IsPermanent(err) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("DecodePayload(%.40q...) = %v, want a permanent error %q", p, err, want)
		}
	}
	ok := `{"a":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`
	if _, err := DecodePayload([]byte(ok)); err != nil {
		t.Errorf("nesting of exactly %d levels: %v", MaxDepth, err)
	}
}

// TestLargeStringsShareOnlyReadOnlyPayloads: a message read from a stream (NewEntryMessage) decodes
// its large strings without copying them, and decodes to the same value as a copy would; any other
// message's payload may be a buffer its maker reuses, so its strings are copies.
func TestLargeStringsShareOnlyReadOnlyPayloads(t *testing.T) {
	payload := func() []byte { return []byte(`{"id":"d1","body":"` + strings.Repeat("x", 1000) + `"}`) }
	entry := NewEntryMessage("", payload(), nil)
	if err := entry.Decode(); err != nil {
		t.Fatal(err)
	}
	want, err := referenceDecode(payload())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(entry.Value, want) {
		t.Fatalf("an entry message decodes to %.60v, want %.60v", entry.Value, want)
	}
	within := func(s string, p []byte) bool {
		start := uintptr(unsafe.Pointer(&p[0]))
		at := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		return at >= start && at < start+uintptr(len(p))
	}
	if !within(entry.Value["body"].(string), entry.Unchanged()) {
		t.Errorf("an entry message's body was copied, not shared with its payload")
	}
	if within(entry.Value["id"].(string), entry.Unchanged()) {
		t.Errorf("an entry message's small string shares its payload: it would keep the payload alive")
	}

	buf := payload()
	other := NewMessage("", buf, nil)
	if err := other.Decode(); err != nil {
		t.Fatal(err)
	}
	if within(other.Value["body"].(string), buf) {
		t.Errorf("a message's body shares the buffer it was made from")
	}
	copy(buf, bytes.Repeat([]byte("y"), len(buf))) // the maker reuses its buffer
	if !reflect.DeepEqual(other.Value, want) {
		t.Errorf("a message's decoded value changed with the buffer it was made from")
	}
}

// FuzzFields checks that the fields an expression reads decode alone as they do in the whole
// message: for every payload Decode accepts, Fields(names) is Decode's value cut to names, whatever
// the names (present or not, repeated in the payload, escaped in it), and a payload Decode refuses
// Fields refuses too.
func FuzzFields(f *testing.F) {
	for _, s := range codecSeeds {
		f.Add([]byte(s), "a", "b")
	}
	f.Add([]byte(`{"a":1,"b":{"c":[1,{"d":"}]\""}]},"a":2}`), "a", "x")
	f.Add([]byte(`{"x":"\"a\\","a\u0062":[[],{}],"e":-1.5e3 , "z":null}`), "ab", "e")
	f.Add([]byte(`{ "a" : true , "b" : false }`), "b", "")
	f.Add([]byte(`null`), "a", "b")
	f.Add([]byte(` [{"a":1}]`), "a", "b")
	// A name found, then the same name again later (fields stops only when it cannot be).
	f.Add([]byte(`{"a":1,"b":2,"a":3}`), "a", "a")
	f.Add([]byte(`{"a":1,"b":2,"\u0061":3}`), "a", "a")
	f.Add([]byte(`{"a":1,"b":{"a":2}}`), "a", "a")
	f.Fuzz(func(t *testing.T, p []byte, n1, n2 string) {
		names := []string{n1, n2}
		whole := NewMessage("", p, nil)
		err := whole.Decode()
		for _, m := range []Message{NewMessage("", p, nil), NewEntryMessage("", p, nil)} {
			if m.checked && (jsonscan.Check(p) != nil || !gjson.ValidBytes(p)) {
				continue // reading an entry refuses it (DecodeEntry), but not one that is no object
			}
			got, gotErr := m.Fields(names, false)
			if (gotErr == nil) != (err == nil) {
				t.Fatalf("Fields(%q, %q): %v; Decode: %v", p, names, gotErr, err)
			}
			if err != nil {
				continue
			}
			want := map[string]any{}
			for _, n := range names {
				if v, ok := whole.Value[n]; ok {
					want[n] = v
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Fields(%q, %q) = %#v; Decode cut to them: %#v", p, names, got, want)
			}
		}
	})
}

// TestFieldsStopOnlyWhereNoNameCanFollow: Fields stops reading an object once it has every name
// asked for and nothing after can repeat one (decoder.fields); a member named again after, plainly or
// with escapes, still wins, as in Decode, and a name's bytes in a value or a nested object are no
// member of the outermost.
func TestFieldsStopOnlyWhereNoNameCanFollow(t *testing.T) {
	for _, c := range []struct {
		payload string
		names   []string
		want    map[string]any
	}{
		{`{"auction":1002,"bidder":1000,"url":"https://example.com/item/1"}`, []string{"auction"}, map[string]any{"auction": json.Number("1002")}},
		{`{"a":1,"b":2,"a":3}`, []string{"a"}, map[string]any{"a": json.Number("3")}},
		{`{"a":1,"b":2,"\u0061":3}`, []string{"a"}, map[string]any{"a": json.Number("3")}},
		{`{"a":1,"b":"a","c":{"a":4}}`, []string{"a"}, map[string]any{"a": json.Number("1")}},
		{`{"a":1,"b":2,"a":3}`, []string{"a", "a"}, map[string]any{"a": json.Number("3")}},
		{`{"a":1,"b":2,"c":3}`, []string{"c", "a"}, map[string]any{"a": json.Number("1"), "c": json.Number("3")}},
		{`{"a":1,"b":2}`, []string{"a", "x"}, map[string]any{"a": json.Number("1")}},
		{`{"":1,"b":2,"":5}`, []string{""}, map[string]any{"": json.Number("5")}},
	} {
		for _, m := range []Message{NewMessage("", []byte(c.payload), nil), NewEntryMessage("", []byte(c.payload), nil)} {
			got, err := m.Fields(c.names, false)
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Errorf("Fields(%s, %q) = %#v, %v; want %#v", c.payload, c.names, got, err, c.want)
			}
		}
	}
}

// TestFieldsOfAnEntryThatIsNoObject: reading a stream checks that an entry's payload is valid JSON,
// not that it is an object (a table's delete is null), so Fields must refuse a checked payload
// that is no object as Decode does, rather than read past its end.
func TestFieldsOfAnEntryThatIsNoObject(t *testing.T) {
	for _, p := range []string{`null`, ` [1,2]`, `"abc"`, `123`, `true`, `[{"a":1}]`, `[]`} {
		m := NewEntryMessage("", []byte(p), nil)
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("Fields(%q) panicked: %v", p, r)
				}
			}()
			_, err = m.Fields([]string{"a"}, false)
		}()
		whole := NewEntryMessage("", []byte(p), nil)
		want := whole.Decode()
		if err == nil || want == nil || err.Error() != want.Error() || !IsPermanent(err) {
			t.Errorf("Fields(%q): %v; Decode: %v", p, err, want)
		}
	}
}

// TestDecodeFieldsKeepsOnlyThoseNamed: a message decoded for some fields (decodeFields) holds
// exactly those of them that the payload has, as Decode makes them, whatever the values skipped
// (nested, escaped, repeated names); naming more decodes those too; Decode, PassedOn and Changed
// see the whole.
func TestDecodeFieldsKeepsOnlyThoseNamed(t *testing.T) {
	seeds := append([]string{
		`{"skip":{"a":[1,{"b":"}]\"{["}],"c":"x"},"key":"k1","n":[1,2],"s\u006bip":"\"","at":12,"key":"k2","t":true,"z":null}`,
		`{"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx","key" : "k" , "at":-1.5e3 }`,
	}, codecSeeds...)
	for _, p := range seeds {
		all, err := DecodePayload([]byte(p))
		if err != nil {
			continue
		}
		var names []string
		for k := range all {
			names = append(names, k)
		}
		for _, fields := range [][]string{{}, {"key"}, {"key", "at", "missing"}, names} {
			m := NewEntryMessage("", []byte(p), nil)
			if err := m.decodeFields(fields); err != nil {
				t.Fatalf("%s: decodeFields(%q): %v", p, fields, err)
			}
			want := map[string]any{}
			for _, f := range fields {
				if v, ok := all[f]; ok {
					want[f] = v
				}
			}
			if !reflect.DeepEqual(m.Value, want) {
				t.Errorf("%s: decodeFields(%q) = %#v, want %#v", p, fields, m.Value, want)
			}
		}
	}
	m := NewEntryMessage("", []byte(`{"a":1,"b":"x","c":[true]}`), nil)
	if err := m.decodeFields([]string{"a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.decodeFields([]string{"b"}); err != nil || len(m.Value) != 2 {
		t.Errorf("naming b after a: %v, %v; want a and b", m.Value, err)
	}
	passed := PassedOn("", m.Unchanged(), nil, &m)
	if err := passed.Decode(); err != nil || len(passed.Value) != 3 {
		t.Errorf("a message passed on from one decoded in part, decoded: %v, %v; want every field", passed.Value, err)
	}
	m.Value["a"] = "changed"
	m.Changed()
	if payload, err := m.Payload(); err != nil || string(payload) != `{"a":"changed","b":"x","c":[true]}` {
		t.Errorf("changed after a part was decoded: %s, %v; want the other fields kept", payload, err)
	}
}

// TestFieldsReadsWhatDecodeFieldsKept: Fields finds the fields a kind decoded and kept, and decodes
// nothing more for them; naming others, it reads the payload.
func TestFieldsReadsWhatDecodeFieldsKept(t *testing.T) {
	m := NewEntryMessage("", []byte(`{"a":1,"b":"x","c":[true]}`), nil)
	if err := m.decodeFields([]string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	if v, err := m.Fields([]string{"b"}, false); err != nil || v["b"] != "x" || len(m.Value) != 2 {
		t.Errorf("Fields(b) = %v, %v; Value %v; want the kept a and b", v, err, m.Value)
	}
	if v, err := m.Fields([]string{"c"}, false); err != nil || v["c"] == nil {
		t.Errorf("Fields(c) = %v, %v; want c read from the payload", v, err)
	}
}

// TestDecodeFieldsOfAnEntryThatIsNoObject: a kind's decodeFields refuses a checked payload that is
// no object as Decode does (TestFieldsOfAnEntryThatIsNoObject).
func TestDecodeFieldsOfAnEntryThatIsNoObject(t *testing.T) {
	for _, p := range []string{`null`, ` [1,2]`, `"abc"`, `123`, `true`} {
		m := NewEntryMessage("", []byte(p), nil)
		err := m.decodeFields([]string{"a"})
		whole := NewEntryMessage("", []byte(p), nil)
		if want := whole.Decode(); err == nil || want == nil || err.Error() != want.Error() {
			t.Errorf("decodeFields(%q): %v; Decode: %v", p, err, want)
		}
	}
}

// TestBorrowFieldsAsFields: BorrowFields reads what Fields reads, and a map given back and lent
// again keeps nothing of the message it held.
func TestBorrowFieldsAsFields(t *testing.T) {
	payloads := []string{`{"a":1,"b":"x"}`, `{"b":{"c":[1]}}`, `{}`, `{"a":null,"a":2}`, `null`, `{"c":3}`}
	for range 3 {
		for _, p := range payloads {
			for _, names := range [][]string{{"a"}, {"a", "b"}, {"c"}} {
				for _, m := range []Message{NewMessage("", []byte(p), nil), NewEntryMessage("", []byte(p), nil)} {
					want, wantErr := m.Fields(names, false)
					got, lent, err := m.BorrowFields(names, false)
					if (err == nil) != (wantErr == nil) || !reflect.DeepEqual(got, want) {
						t.Fatalf("BorrowFields(%s, %q) = %#v, %v; Fields: %#v, %v", p, names, got, err, want, wantErr)
					}
					if err != nil && lent != nil {
						t.Fatalf("BorrowFields(%s) failed and lent a map", p)
					}
					ReturnFields(lent)
				}
			}
		}
	}
	// Fields decoded already (a stateful kind's, decodeFields) are the message's own: none is lent.
	m := NewEntryMessage("", []byte(`{"a":1,"b":2}`), nil)
	if err := m.decodeFields([]string{"a"}); err != nil {
		t.Fatal(err)
	}
	got, lent, err := m.BorrowFields([]string{"a"}, false)
	if err != nil || lent != nil || !reflect.DeepEqual(got, map[string]any{"a": json.Number("1")}) {
		t.Fatalf("BorrowFields of a message decoded in part = %#v, %v, lent %v", got, err, lent)
	}
}

// FuzzPlainField checks that a field read from the payload as it came (PlainField) is the key that
// decoding the payload finds (PlainKey of the decoded field), whenever PlainField says it can tell.
func FuzzPlainField(f *testing.F) {
	for _, s := range codecSeeds {
		f.Add([]byte(s), "a")
	}
	f.Add([]byte(`{"k":"a","k":"b"}`), "k")
	f.Add([]byte(`{"k":"a","\u006b":-12}`), "k")
	f.Add([]byte(`{"k":007,"j":{"k":"x"}}`), "k")
	f.Add([]byte(`{"k":"a\"b","k":1.5}`), "k")
	f.Fuzz(func(t *testing.T, p []byte, name string) {
		m := NewEntryMessage("", p, nil)
		if !m.checked || jsonscan.Check(p) != nil || !gjson.ValidBytes(p) {
			return // reading an entry refuses it first
		}
		got, ok := m.PlainField(name)
		if !ok {
			return
		}
		whole := NewMessage("", p, nil)
		if err := whole.Decode(); err != nil {
			t.Fatalf("PlainField(%q) of %q = %q, but the payload does not decode: %v", name, p, got, err)
		}
		want, plain := PlainKey(whole.Value[name])
		if !plain || got != want {
			t.Fatalf("PlainField(%q) of %q = %q; decoded, the field is %#v (PlainKey %q, %v)", name, p, got, whole.Value[name], want, plain)
		}
	})
}
