package stages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/transport/jsonscan"
)

// Message is one message as a stage function sees it.
type Message struct {
	// Key is the message's key: it picks the partition and orders the messages of one key. A function
	// may change it, unless it is registered with KeepsKey; the output topic's key expression, if
	// any, recomputes it.
	Key string
	// Value is the message's JSON payload, decoded: strings, json.Number numbers (which keep every
	// digit of large ids), bools, nil, []any and map[string]any. A function may modify and return it.
	Value map[string]any
	// Headers travel with the message from hop to hop (trace context is carried separately).
	Headers map[string]string
	// EntryTime is when the message's entry was added to the stream it was read from (its ID's
	// time): the event time of a message that carries none. Zero for a message a kind made.
	EntryTime time.Time

	// raw is the payload as it arrived, kept while it still describes the message so that it can be
	// passed on without decoding and encoding it again.
	raw []byte
	// checked: raw was checked as it was read (NewEntryMessage), so Decode need not check it again.
	checked bool
	// sizeHint is the length of the payload the message arrived with, once raw no longer holds it.
	sizeHint int
	// only names the fields Value holds when decodeFields decoded only those (the payload may
	// have others); nil when Value holds them all.
	only []string
	// timeBy and timeAt are the event time that EventTime last read with the expression timeBy:
	// the runtime reads a stateful stage's messages' times before the kind does (the watermark,
	// the state keys to read ahead), and an expression is evaluated once per message, not thrice.
	// Changed forgets it.
	timeBy *expr.Program
	timeAt time.Time
	// keyBy and keyOf are, likewise, the state key that stateKey last read with the expression
	// keyBy (a dedupe's key, an aggregate's group_by): StateKeys reads it before Process does.
	keyBy *expr.Program
	keyOf string
}

// NewMessage returns a message whose payload is decoded only when something needs its fields, so
// that a stage that passes messages on unchanged never pays for JSON.
func NewMessage(key string, payload []byte, headers map[string]string) Message {
	return Message{Key: key, Headers: headers, raw: payload}
}

// NewEntryMessage is NewMessage for the payload of an entry read from a stream, which reading
// checked already (transport/redis DecodeEntry: valid JSON and UTF-8, nested at most MaxDepth
// deep, the rules DecodePayload checks), or a line CheckPayload passed: decoding it does not check
// it again. The payload must never be modified (a reply's memory is not): the decoded value's
// largest strings may share it. Any other payload takes NewMessage.
func NewEntryMessage(key string, payload []byte, headers map[string]string) Message {
	return Message{Key: key, Headers: headers, raw: payload, checked: true}
}

// Decode parses the payload into Value, if that has not happened yet. The payload must be a JSON
// object. Numbers decode as json.Number, which keeps every digit of large ids.
func (m *Message) Decode() error {
	if m.Value != nil && m.only == nil || m.raw == nil {
		if m.Value == nil {
			m.Value = map[string]any{}
		}
		return nil
	}
	v, err := decodePayload(m.raw, m.checked)
	if err != nil {
		return err
	}
	m.Value, m.only = v, nil
	return nil
}

// Fields returns what an expression that reads the message's top-level fields named (and no
// others: expr.Program.Fields) needs of it: those fields decoded as Decode would decode them,
// skipping the rest of the payload, without keeping them. For a key or a condition that reads a
// field or two of a message passed on as it arrived, which then never pays for decoding the rest.
// With Value decoded already, or more (the expression may read any field), it is Decode's Value.
func (m *Message) Fields(names []string, more bool) (map[string]any, error) {
	fields, _, err := m.fieldsInto(nil, names, more)
	return fields, err
}

// BorrowFields is Fields for a reader that keeps nothing of the map once it is done with it (of
// its values it may keep anything): an expression evaluated to a bool or a string, a filter's
// where or a topic's key, at every hop for every message. The fields may be decoded into a map
// lent for the time of the reading, which the reader gives back with ReturnFields(lent); lent is
// nil when they were not. A new map each time was a tenth of a filter stage's hop.
func (m *Message) BorrowFields(names []string, more bool) (fields, lent map[string]any, err error) {
	lent = fieldMaps.Get().(map[string]any)
	fields, used, err := m.fieldsInto(lent, names, more)
	if !used {
		fieldMaps.Put(lent)
		lent = nil
	}
	return fields, lent, err
}

// ReturnFields gives back a map that BorrowFields lent (nil: none).
func ReturnFields(lent map[string]any) {
	if lent != nil {
		clear(lent)
		fieldMaps.Put(lent)
	}
}

// fieldMaps are the maps that BorrowFields lends.
var fieldMaps = sync.Pool{New: func() any { return map[string]any{} }}

// fieldsInto is Fields, decoding the fields into into (empty) when that is not nil; used says that
// the fields are in it.
func (m *Message) fieldsInto(into map[string]any, names []string, more bool) (fields map[string]any, used bool, err error) {
	if !more && m.only != nil && containsAll(m.only, names) {
		return m.Value, false, nil // decoded in part (decodeFields), those names with it
	}
	if more || m.Value != nil || m.raw == nil {
		if err := m.Decode(); err != nil {
			return nil, false, err
		}
		return m.Value, false, nil
	}
	if !m.checked {
		if err := CheckPayload(m.raw); err != nil {
			return nil, false, err
		}
	}
	d := decoder{data: m.raw, share: m.checked}
	d.space()
	// A checked payload is valid JSON, but not necessarily an object (an entry's may be null, a
	// list, ...): decoding its fields would read past its end.
	if err := notObject(m.raw, d.i); err != nil {
		return nil, false, err
	}
	if into == nil {
		return d.fields(make(map[string]any, len(names)), names), false, nil
	}
	return d.fields(into, names), true, nil
}

// notObject is the error of a valid JSON payload whose value, at i, is not an object.
func notObject(payload []byte, i int) error {
	if payload[i] != '{' {
		return Permanent(fmt.Errorf("payload is a JSON %s, not an object", jsonKind(payload[i])))
	}
	return nil
}

// decodeFields is Fields for a kind that reads the same fields of a message several times (a
// stateful kind, before and while it processes it): it keeps what it decodes as Value, noting that
// Value holds only those fields (only), so that the next read of them decodes nothing. Naming more
// decodes them too; Decode, and Changed, decode the whole payload. Only a reader that changes
// nothing may read a message so: a kind that changes Value calls Decode first.
func (m *Message) decodeFields(names []string) error {
	switch {
	case m.raw == nil:
		return m.Decode()
	case m.Value != nil && (m.only == nil || containsAll(m.only, names)):
		return nil
	}
	if !m.checked {
		if err := CheckPayload(m.raw); err != nil {
			return err
		}
	}
	want := names
	if m.only != nil {
		want = append(slices.Clip(m.only), names...)
	}
	d := decoder{data: m.raw, share: m.checked}
	d.space()
	if err := notObject(m.raw, d.i); err != nil { // as in Fields
		return err
	}
	m.Value, m.only = d.fields(make(map[string]any, len(want)), want), want
	return nil
}

// fieldsRead returns the top-level fields of a message that the expressions read (nil ones read
// none), for decodeFields; nil when one may read any, and the message must be decoded whole.
func fieldsRead(exprs ...*expr.Program) []string {
	fields := []string{}
	for _, e := range exprs {
		f, more := e.Fields()
		if more {
			return nil
		}
		fields = append(fields, f...)
	}
	return fields
}

// decodeRead decodes the fields of m that a kind reads (fieldsRead): all of them when fields is nil.
func decodeRead(m *Message, fields []string) error {
	if fields == nil {
		return m.Decode()
	}
	return m.decodeFields(fields)
}

// stateKey is the string that the expression e, which reads the fields reads of m (fieldsRead),
// makes of m: the key of a kind's state (a dedupe's key, an aggregate's group_by), evaluated once
// per message although the runtime asks for it first (StateKeys) and the kind again (Process).
func stateKey(e *expr.Program, reads []string, m *Message) (string, error) {
	if m.keyBy == e {
		return m.keyOf, nil
	}
	if err := decodeRead(m, reads); err != nil {
		return "", err
	}
	env := borrowEnv(m.Value)
	key, err := e.EvalString(env)
	returnEnv(env)
	if err != nil {
		return "", evalError(err)
	}
	m.keyBy, m.keyOf = e, key
	return key, nil
}

// scannedStateKey is stateKey for a kind that reads nothing of a message but its key and its
// event time by the expression at (nil: the entry's time), a dedupe: when the key is a field
// (msg.id) that holds a string without escapes, it is read from the payload as it arrived, which
// is then never decoded; the event time is read with it when it is a field that holds a plain time
// (scannedEventTime), and kept for EventTime.
func scannedStateKey(e, at *expr.Program, reads []string, m *Message) (string, error) {
	if m.keyBy == e {
		return m.keyOf, nil
	}
	keyField, ok := e.Field()
	if !ok || !m.checked || m.Value != nil || len(m.raw) == 0 {
		return stateKey(e, reads, m)
	}
	timeField, timed := at.Field()
	var raw [2][]byte
	if !scanFields(m.raw, []string{keyField, timeField}, raw[:]) || !isPlainString(raw[0]) {
		return stateKey(e, reads, m)
	}
	m.keyBy, m.keyOf = e, string(raw[0][1:len(raw[0])-1])
	if t, ok := scannedEventTime(raw[1]); timed && ok {
		m.timeBy, m.timeAt = at, t
	}
	return m.keyOf, nil
}

// PlainKey returns the key that a topic keyed by a field (key = msg.NAME) gets from the field's
// decoded value v, when that is v itself: a string, or the JSON text of an integer that a number
// prints as (no sign but a minus, no leading zero, at most 15 digits: exact in a float64, which
// prints it with the same digits). Anything else (other numbers, a missing field, null, a bool, a
// list) is for the expression to convert or refuse. It spares a keyed source's every message an
// evaluation, a parse of its number, and the number's digits made again.
func PlainKey(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		digits := string(v)
		if len(digits) > 0 && digits[0] == '-' {
			digits = digits[1:]
		}
		if len(digits) == 0 || len(digits) > 15 || digits[0] == '0' && (len(digits) > 1 || len(v) > 1) {
			return "", false // "0" is plain; "-0" prints as "0", "007" as "7"
		}
		for i := 0; i < len(digits); i++ {
			if digits[i] < '0' || digits[i] > '9' {
				return "", false
			}
		}
		return string(v), true
	}
	return "", false
}

// PlainField is PlainKey of a top-level field of the payload as it came, read without decoding it
// (scanFields): the text between the quotes of a string without escapes, or a plain integer's
// digits. False when it cannot tell so (the message was decoded or changed, its payload is not an
// object or names a field with escapes, or the field is missing or holds anything else): the
// caller decodes the field.
func (m *Message) PlainField(name string) (string, bool) {
	if !m.checked || m.Value != nil || len(m.raw) == 0 {
		return "", false
	}
	var raw [1][]byte
	if !scanFields(m.raw, []string{name}, raw[:]) || raw[0] == nil {
		return "", false
	}
	if isPlainString(raw[0]) {
		return string(raw[0][1 : len(raw[0])-1]), true
	}
	if c := raw[0][0]; c != '-' && (c < '0' || c > '9') {
		return "", false
	}
	return PlainKey(json.Number(raw[0]))
}

// scanFields finds top-level fields of a payload that reading checked (NewEntryMessage), decoding
// nothing (decoder.rawMembers); false when the payload is no object, or a field's name has escapes.
func scanFields(payload []byte, names []string, values [][]byte) bool {
	d := decoder{data: payload}
	d.space()
	return d.i < len(payload) && payload[d.i] == '{' && d.rawMembers(names, values)
}

// isPlainString reports whether the JSON text of a value is a string without escapes: the string
// is the text between its quotes.
func isPlainString(raw []byte) bool {
	return len(raw) >= 2 && raw[0] == '"' && bytes.IndexByte(raw[1:len(raw)-1], '\\') < 0
}

// msgEnvs are the environments that a stateful kind's key and event time are evaluated in, for
// every message before its batch is processed: an Env given to an expression escapes (its nodes
// are called through function values), and a new one each time was an allocation per message for
// each expression.
var msgEnvs = sync.Pool{New: func() any { return new(expr.Env) }}

// borrowEnv lends an environment of the message msg, which returnEnv gives back once nothing
// reads it any more.
func borrowEnv(msg map[string]any) *expr.Env {
	env := msgEnvs.Get().(*expr.Env)
	env.Msg = msg
	return env
}

func returnEnv(env *expr.Env) {
	env.Msg = nil // kept by the pool, it must not keep the message alive
	msgEnvs.Put(env)
}

// decodeFor decodes what the expression e reads of the message: the fields it names when the
// message was decoded in part already (by a kind, decodeFields), all of it otherwise.
func (m *Message) decodeFor(e *expr.Program) error {
	if m.only != nil {
		if fields, more := e.Fields(); !more {
			return m.decodeFields(fields)
		}
	}
	return m.Decode()
}

// containsAll reports whether every one of names is in have.
func containsAll(have, names []string) bool {
	for _, n := range names {
		if !slices.Contains(have, n) {
			return false
		}
	}
	return true
}

// DecodePayload parses a JSON object, with numbers as json.Number. A payload that is not one is a
// permanent error: retrying cannot fix it. So is a payload that is not valid UTF-8 (encoding/json
// would turn the bytes into U+FFFD, and the message would change on its way) and one nested more
// than MaxDepth deep.
func DecodePayload(payload []byte) (map[string]any, error) { return decodePayload(payload, false) }

// CheckPayload checks a payload by DecodePayload's rules (a JSON object, valid UTF-8, nested at most
// MaxDepth deep) without decoding it: for a source that refuses what it cannot pass on before it
// passes anything on.
func CheckPayload(payload []byte) error {
	if err := jsonscan.Check(payload); err != nil {
		return Permanent(fmt.Errorf("payload is %w", err))
	}
	if !gjson.ValidBytes(payload) {
		return invalidPayload(payload)
	}
	if c := firstByte(payload); c != '{' {
		return Permanent(fmt.Errorf("payload is a JSON %s, not an object", jsonKind(c)))
	}
	return nil
}

// firstByte returns the first byte of a valid JSON text that is not white space.
func firstByte(p []byte) byte {
	for _, c := range p {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c
		}
	}
	return 0
}

// decodePayload is DecodePayload, without the checks of a payload that was checked (checked).
func decodePayload(payload []byte, checked bool) (map[string]any, error) {
	if !checked {
		if err := jsonscan.Check(payload); err != nil {
			return nil, Permanent(fmt.Errorf("payload is %w", err))
		}
		if !gjson.ValidBytes(payload) {
			return nil, invalidPayload(payload)
		}
	}
	d := decoder{data: payload, share: checked}
	d.space()
	if err := notObject(payload, d.i); err != nil {
		return nil, err
	}
	return d.object(), nil
}

// MaxDepth is how deeply objects and arrays may nest in a payload; see jsonscan.MaxDepth for why.
const MaxDepth = jsonscan.MaxDepth

// invalidPayload says what encoding/json finds wrong with a payload that is not valid JSON.
func invalidPayload(payload []byte) error {
	dec := json.NewDecoder(bytes.NewReader(payload))
	var v any
	if err := dec.Decode(&v); err != nil {
		return Permanent(fmt.Errorf("payload is not valid JSON: %w", err))
	}
	return Permanent(errors.New("payload is not valid JSON: data after the value"))
}

// jsonKind names the kind of the JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case 'n':
		return "null"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	}
	return "number"
}

// Payload returns the message's JSON: the bytes it arrived with when nothing may have changed them,
// and Value encoded otherwise.
func (m *Message) Payload() ([]byte, error) {
	if m.raw != nil {
		return m.raw, nil
	}
	if m.Value == nil {
		return []byte("{}"), nil
	}
	// Sized after the payload the message arrived with, which a change rarely makes much longer:
	// a large message is then written once, without the copies of a growing buffer.
	b, err := appendJSON(make([]byte, 0, m.sizeHint+m.sizeHint/64+64), m.Value)
	if err != nil {
		return nil, Permanent(fmt.Errorf("cannot encode the message as JSON: %w", err))
	}
	return b, nil
}

// WritePayload passes the message's JSON, as Payload makes it, to write in pieces of about chunk
// bytes while it encodes Value (a string longer than a chunk is cut too), reusing one piece's
// memory for the next: for a large changed message that is written on in pieces, so that its
// encoding is never whole in memory (transport/redis stages it in Redis). write must not keep a
// piece. With chunk <= 0 the JSON is one piece, made whole, which write may keep.
func (m *Message) WritePayload(chunk int, write func([]byte) error) error {
	if m.raw != nil || m.Value == nil || chunk <= 0 {
		b, err := m.Payload()
		if err != nil {
			return err
		}
		return write(b)
	}
	s := &spill{chunk: chunk, write: write}
	// Room for a chunk and the value that takes it past its end, which is at most a chunk's worth
	// of a long string (escaped, it may grow, and then the buffer grows once).
	b, err := appendJSONSpilling(make([]byte, 0, 2*chunk+64), m.Value, s)
	if err != nil {
		return Permanent(fmt.Errorf("cannot encode the message as JSON: %w", err))
	}
	return write(b) // the rest, which ends with the closing brace
}

// SizeHint returns the length of the payload the message arrived with, whether or not it changed
// since: what its JSON is likely to be about as long as.
func (m *Message) SizeHint() int {
	if m.raw != nil {
		return len(m.raw)
	}
	return m.sizeHint
}

// PassedOn returns the message of key, payload and headers that a stage made of from: when
// payload is from's payload as it arrived, the message shares from's decoded fields, if any, and
// its checks, instead of doing them again (a fused chain hands a filter's messages to the next
// stage so). Decoding the payload would give the same fields.
func PassedOn(key string, payload []byte, headers map[string]string, from *Message) Message {
	m := NewMessage(key, payload, headers)
	if len(payload) > 0 && len(from.raw) == len(payload) && &from.raw[0] == &payload[0] {
		// The very bytes from arrived with: decoded as from was, checked if from was.
		m.Value, m.only, m.checked = from.Value, from.only, from.checked
	}
	return m
}

// IsNull reports whether the message's payload, as it arrived, is the JSON null: a table's delete
// of the message's key (a tombstone), which is no object to decode.
func (m *Message) IsNull() bool { return isNullPayload(m.raw) }

// Unchanged returns the payload as it arrived while it still describes the message (nothing
// changed it since), or nil.
func (m *Message) Unchanged() []byte { return m.raw }

// Changed records that Value may differ from the payload the message arrived with, so that Payload
// encodes Value again. A kind that modifies a decoded message calls it (a Go stage function need not:
// its results are taken as changed).
func (m *Message) Changed() {
	m.timeBy, m.keyBy = nil, nil
	if m.only != nil && m.raw != nil {
		// Decoded in part (decodeFields): the fields it did not decode are taken from the
		// payload, or the payload written would lose them.
		if all, err := decodePayload(m.raw, m.checked); err == nil {
			for k, v := range m.Value {
				all[k] = v
			}
			m.Value, m.only = all, nil
		}
	}
	if m.raw != nil {
		m.sizeHint = len(m.raw)
	}
	m.raw = nil
}
