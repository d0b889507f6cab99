package redis

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"unsafe"

	goredis "github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"
)

// The field names of a stream entry. Any client can write and read them, for example:
//
//	XADD flow:{orders:3} * payload '{"id":42}' key cust-7 headers '{"source":"shop"}' traceparent 00-...
const (
	FieldPayload     = "payload"     // the message, JSON (required for a non-flat entry)
	FieldKey         = "key"         // the message key (optional)
	FieldHeaders     = "headers"     // a JSON object of string to string (optional)
	FieldTraceParent = "traceparent" // W3C trace context (optional)
	FieldTraceState  = "tracestate"  // W3C trace state (optional)
)

// Entry is one message of a stream.
//
// Written by flowrun, an entry has a payload field (JSON) and optionally key, headers,
// traceparent and tracestate fields. An entry written by another application without a payload
// field, for example
//
//	XADD demo:events:orders * type order.placed order_id 42 amount 99.5
//
// is accepted as a flat entry: Flat is true and Payload is a JSON object of all its fields as
// strings ({"amount":"99.5","order_id":"42","type":"order.placed"}, keys sorted), except that
// traceparent and tracestate fields are taken as the trace context. Of a flat entry no field is
// taken as key or headers: those names are plain data there.
type Entry struct {
	// ID is the stream entry ID ("<ms>-<seq>"); empty for an entry not yet written.
	ID string
	// Key is the message key; empty when the message has none.
	Key string
	// Payload is the message as JSON. It is never empty in a decoded entry, and it is read-only:
	// a decoded payload shares its memory with the reply it came from.
	Payload []byte
	// Headers are string headers; nil when there are none.
	Headers map[string]string
	// TraceParent and TraceState are the W3C trace context; empty when absent.
	TraceParent string
	TraceState  string
	// Flat is true for an entry that had no payload field (see Entry).
	Flat bool
	// Deliveries is how many times the consumer group has delivered the entry, including the
	// current delivery, when the read knows it (Reclaim); 0 otherwise.
	Deliveries int64
}

// MalformedEntryError describes an entry that cannot be decoded. It is never fatal: the
// entry is reported to the caller (see Batch.Malformed), which dead-letters and acks it.
type MalformedEntryError struct {
	// ID is the entry's stream ID.
	ID string
	// Fields are the entry's raw fields.
	Fields map[string]string
	// Reason says what is wrong, for example "payload is not valid JSON".
	Reason string
}

func (e *MalformedEntryError) Error() string {
	return fmt.Sprintf("redis: malformed stream entry %s: %s", e.ID, e.Reason)
}

// EncodeEntry returns the XADD field-value list of an entry, in a fixed order: payload, key,
// headers, traceparent, tracestate (empty optional fields are left out). A flat entry is encoded in
// the canonical form, with a payload field holding its JSON object.
//
// The payload must be JSON, and EncodeEntry does not check it: it is on every hop's path, and its
// callers write payloads that DecodeEntry validated or that an encoder produced. Should an invalid
// payload be written anyway, the reader's DecodeEntry reports the entry as malformed, and it is
// dead-lettered there: nothing crashes and nothing is lost.
func EncodeEntry(e Entry) ([]any, error) {
	if len(e.Payload) == 0 {
		return nil, fmt.Errorf("redis: encoding entry: empty payload")
	}
	n := 2
	if e.Key != "" {
		n += 2
	}
	var headers []byte
	if len(e.Headers) > 0 {
		var err error
		headers, err = marshalStrings(e.Headers)
		if err != nil {
			return nil, fmt.Errorf("redis: encoding entry headers: %w", err)
		}
		n += 2
	}
	if e.TraceParent != "" {
		n += 2
	}
	if e.TraceState != "" {
		n += 2
	}
	v := make([]any, 0, n)
	v = append(v, FieldPayload, e.Payload)
	if e.Key != "" {
		v = append(v, FieldKey, e.Key)
	}
	if headers != nil {
		v = append(v, FieldHeaders, headers)
	}
	if e.TraceParent != "" {
		v = append(v, FieldTraceParent, e.TraceParent)
	}
	if e.TraceState != "" {
		v = append(v, FieldTraceState, e.TraceState)
	}
	return v, nil
}

// marshalStrings encodes a map as a JSON object with sorted keys and no HTML escaping.
func marshalStrings(m map[string]string) ([]byte, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	buf.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := enc.Encode(k); err != nil {
			return nil, err
		}
		buf.Truncate(buf.Len() - 1) // Encode appends a newline
		buf.WriteByte(':')
		if err := enc.Encode(m[k]); err != nil {
			return nil, err
		}
		buf.Truncate(buf.Len() - 1)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// DecodeEntry decodes a stream message. It returns a *MalformedEntryError when the entry has no
// fields (it was deleted while pending), when its payload field is not valid JSON, or when its
// headers field is not a JSON object of strings. It never panics.
func DecodeEntry(msg goredis.XMessage) (Entry, error) {
	if len(msg.Values) == 0 {
		return Entry{}, &MalformedEntryError{ID: msg.ID, Reason: "entry has no fields (deleted from the stream)"}
	}
	e := Entry{ID: msg.ID}
	payload, ok := msg.Values[FieldPayload]
	if !ok {
		return decodeFlat(msg)
	}
	p := viewBytes(payload)
	// Every entry of every hop is checked: gjson's validator accepts what encoding/json.Valid
	// accepts (FuzzDecodeEntry compares them) at less than half the cost.
	if !gjson.ValidBytes(p) {
		return Entry{}, malformed(msg, "payload is not valid JSON")
	}
	e.Payload = p
	if v, ok := msg.Values[FieldKey]; ok {
		e.Key = toString(v)
	}
	if v, ok := msg.Values[FieldHeaders]; ok {
		var h map[string]string
		if err := json.Unmarshal(toBytes(v), &h); err != nil {
			return Entry{}, malformed(msg, "headers are not a JSON object of strings: "+err.Error())
		}
		if len(h) > 0 {
			e.Headers = h
		}
	}
	if v, ok := msg.Values[FieldTraceParent]; ok {
		e.TraceParent = toString(v)
	}
	if v, ok := msg.Values[FieldTraceState]; ok {
		e.TraceState = toString(v)
	}
	return e, nil
}

// decodeFlat turns an entry without a payload field into a flat entry.
func decodeFlat(msg goredis.XMessage) (Entry, error) {
	e := Entry{ID: msg.ID, Flat: true}
	obj := make(map[string]string, len(msg.Values))
	for k, v := range msg.Values {
		switch k {
		case FieldTraceParent:
			e.TraceParent = toString(v)
		case FieldTraceState:
			e.TraceState = toString(v)
		default:
			obj[k] = toString(v)
		}
	}
	p, err := marshalStrings(obj)
	if err != nil {
		return Entry{}, malformed(msg, "fields cannot be encoded as JSON: "+err.Error())
	}
	e.Payload = p
	return e, nil
}

func malformed(msg goredis.XMessage, reason string) *MalformedEntryError {
	fields := make(map[string]string, len(msg.Values))
	for k, v := range msg.Values {
		fields[k] = toString(v)
	}
	return &MalformedEntryError{ID: msg.ID, Fields: fields, Reason: reason}
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// viewBytes is toBytes without the copy for a string: the returned bytes share the string's memory,
// so nothing may modify them. Payloads are only ever read (decoded, written on), and every hop reads
// one; the copy was a tenth of a hop's allocations.
func viewBytes(v any) []byte {
	if s, ok := v.(string); ok {
		return unsafe.Slice(unsafe.StringData(s), len(s))
	}
	return toBytes(v)
}

func toBytes(v any) []byte {
	switch v := v.(type) {
	case string:
		return []byte(v)
	case []byte:
		return v
	default:
		return []byte(toString(v))
	}
}
