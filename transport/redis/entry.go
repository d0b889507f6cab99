package redis

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
	"unsafe"

	goredis "github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"

	"github.com/flowrun/flowrun/transport/jsonscan"
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

// MaxDepth is how deeply objects and arrays may nest in a payload: {"a":[1]} nests 2 deep.
// DecodeEntry refuses an entry whose payload nests deeper, or is not valid UTF-8, as malformed
// where it is first read. The rule is transport/jsonscan's, which package stages applies to
// payloads that do not come through Redis; see jsonscan.MaxDepth for why 1000.
const MaxDepth = jsonscan.MaxDepth

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
	// Large, when set in place of Payload, makes the payload: a large message that a stage changed,
	// whose JSON a commit that offloads it stages in Redis a piece at a time as it is made (see
	// stageLarge), so that the process never holds it whole. Everything else encodes it whole.
	Large *LargePayload
	// Headers are string headers; nil when there are none.
	Headers map[string]string
	// TraceParent and TraceState are the W3C trace context; empty when absent.
	TraceParent string
	TraceState  string
	// TraceDropped is set on a decoded entry whose traceparent field was not valid W3C trace
	// context: it was dropped, with the tracestate, and a traced reader starts a new trace for
	// the message, as for one that arrives from outside without trace context.
	TraceDropped bool
	// Flat is true for an entry that had no payload field (see Entry).
	Flat bool
	// Deliveries is how many times the consumer group has delivered the entry, including the
	// current delivery, when the read knows it (Reclaim); 0 otherwise.
	Deliveries int64
}

// LargePayload is a payload that is made while it is written (Entry.Large).
type LargePayload struct {
	// Size is the payload's length in bytes.
	Size int64
	// Write passes the payload to write in pieces of about chunk bytes, reusing one piece's memory
	// for the next (write must not keep a piece); with chunk <= 0, whole in one piece, which write
	// may keep. It makes the same bytes every time, and fails only as the measure of Size did.
	Write func(chunk int, write func([]byte) error) error
}

// Bytes returns the payload whole: for what needs it as a stream would hold it, such as the next
// stage of a fused chain.
func (p *LargePayload) Bytes() ([]byte, error) {
	var b []byte
	err := p.Write(0, func(whole []byte) error { b = whole; return nil })
	return b, err
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
	payload := e.Payload
	if len(payload) == 0 && e.Large != nil {
		var err error
		if payload, err = e.Large.Bytes(); err != nil {
			return nil, fmt.Errorf("redis: encoding entry payload: %w", err)
		}
	}
	if len(payload) == 0 {
		return nil, fmt.Errorf("redis: encoding entry: empty payload")
	}
	return encodeFields(e, FieldPayload, payload)
}

// encodeFields is EncodeEntry with the payload field given: payload, or payload_ref with the key
// of a payload that is staged already (see stageLarge).
func encodeFields(e Entry, payloadField string, payload any) ([]any, error) {
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
	v = append(v, payloadField, payload)
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

// marshalStrings encodes a map as a JSON object with sorted keys and no HTML escaping. Strings
// of printable ASCII without quotes or backslashes (header names and values, nearly always) are
// written as they are; others go through encoding/json.
// plainStrings decodes headers as marshalStrings writes them when no string needs escaping: a
// JSON object of strings without white space or backslashes, as json.Unmarshal would, and false
// for anything else (json.Unmarshal then decodes it, or says what is wrong). Every entry of a hop
// after a source carries headers (the watermarks), and reflection was a tenth of a q12 event's
// Go time.
func plainStrings(b []byte) (map[string]string, bool) {
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' || bytes.IndexByte(b, '\\') >= 0 {
		return nil, false
	}
	h := map[string]string{}
	i := 1
	str := func() (string, bool) {
		if i >= len(b) || b[i] != '"' {
			return "", false
		}
		end := bytes.IndexByte(b[i+1:], '"')
		if end < 0 {
			return "", false
		}
		v := b[i+1 : i+1+end]
		for _, c := range v {
			if c < 0x20 { // a control character: invalid JSON, which json.Unmarshal explains
				return "", false
			}
		}
		i += end + 2
		return string(v), true
	}
	if i == len(b)-1 {
		return h, true // {}
	}
	for {
		k, ok := str()
		if !ok || i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i++
		v, ok := str()
		if !ok || i >= len(b) {
			return nil, false
		}
		h[k] = v // a repeated name: the last wins, as in json.Unmarshal
		switch b[i] {
		case ',':
			i++
		case '}':
			return h, i == len(b)-1
		default:
			return nil, false
		}
	}
}

func marshalStrings(m map[string]string) ([]byte, error) {
	keys := make([]string, 0, len(m))
	size := 2
	for k, v := range m {
		keys = append(keys, k)
		size += len(k) + len(v) + 6
	}
	sort.Strings(keys)
	buf := bytes.NewBuffer(make([]byte, 0, size))
	var enc *json.Encoder
	str := func(s string) error {
		if plainJSONString(s) {
			buf.WriteByte('"')
			buf.WriteString(s)
			buf.WriteByte('"')
			return nil
		}
		if enc == nil {
			enc = json.NewEncoder(buf)
			enc.SetEscapeHTML(false)
		}
		if err := enc.Encode(s); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1) // Encode appends a newline
		return nil
	}
	buf.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := str(k); err != nil {
			return nil, err
		}
		buf.WriteByte(':')
		if err := str(m[k]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// plainJSONString reports whether s is JSON text between quotes as it is: printable ASCII, neither
// a quote nor a backslash.
func plainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// DecodeEntry decodes a stream message. It returns a *MalformedEntryError when the entry has no
// fields (it was deleted while pending), when its payload field is not valid JSON, is not valid
// UTF-8 or nests deeper than MaxDepth, when its key is not valid UTF-8, when its headers field is
// not a JSON object of strings, or, for a flat entry, when a field is not valid UTF-8. A
// traceparent that is not valid W3C trace context is dropped with its tracestate (TraceDropped
// says so); the entry is not malformed for it. It never panics.
func DecodeEntry(msg goredis.XMessage) (Entry, error) { return decodeEntry(msg, 0) }

// decodeEntry is DecodeEntry for entries of at most maxSize bytes (0: any size; see EntrySize).
// A bigger entry is reported as malformed before anything of it is decoded.
func decodeEntry(msg goredis.XMessage, maxSize int64) (Entry, error) {
	if len(msg.Values) == 0 {
		return Entry{}, &MalformedEntryError{ID: msg.ID, Reason: "entry has no fields (deleted from the stream)"}
	}
	payload, ok := msg.Values[FieldPayload]
	if !ok {
		if ref, offloaded := msg.Values[FieldPayloadRef]; offloaded {
			// The read found no payload at the reference (see fetchPayloads).
			return Entry{}, malformed(msg, fmt.Sprintf("its payload_ref %q names no payload of this stream "+
				"(the key does not exist, or is not one of the stream's payload keys)", toString(ref)))
		}
		return decodeFlat(msg, maxSize)
	}
	key, withKey := msg.Values[FieldKey]
	headers, withHeaders := msg.Values[FieldHeaders]
	traceParent, withTraceParent := msg.Values[FieldTraceParent]
	traceState, withTraceState := msg.Values[FieldTraceState]
	if maxSize > 0 {
		// The fields looked up anyway give the size without walking the map, unless the entry
		// has fields of other names.
		size, n := len(FieldPayload)+fieldLen(payload), 1
		if withKey {
			size, n = size+len(FieldKey)+fieldLen(key), n+1
		}
		if withHeaders {
			size, n = size+len(FieldHeaders)+fieldLen(headers), n+1
		}
		if withTraceParent {
			size, n = size+len(FieldTraceParent)+fieldLen(traceParent), n+1
		}
		if withTraceState {
			size, n = size+len(FieldTraceState)+fieldLen(traceState), n+1
		}
		total := int64(size)
		if n < len(msg.Values) {
			total = messageSize(msg)
		}
		if total > maxSize {
			return Entry{}, tooLarge(msg, total, maxSize)
		}
	}
	f := rawFields{has: hasPayload, payload: viewBytes(payload)}
	if withKey {
		f.has, f.key = f.has|hasKey, viewBytes(key)
	}
	if withHeaders {
		f.has, f.headers = f.has|hasHeaders, viewBytes(headers)
	}
	if withTraceParent {
		f.has, f.traceParent = f.has|hasTraceParent, viewBytes(traceParent)
	}
	if withTraceState {
		f.has, f.traceState = f.has|hasTraceState, viewBytes(traceState)
	}
	e, reason := f.entry(msg.ID)
	if reason != "" {
		return Entry{}, malformed(msg, reason)
	}
	return e, nil
}

// entry decodes the fields of an entry that has a payload field, by the rules of every reader
// (decodeEntry, from go-redis's map; a raw read, from the reply): the entry, or why it is
// malformed.
func (f *rawFields) entry(id string) (Entry, string) {
	p := f.payload
	// Checked first: gjson's validator recurses once per level of nesting, and a payload of
	// millions of brackets would overflow the goroutine's stack.
	if err := jsonscan.Check(p); err != nil {
		return Entry{}, "payload is " + err.Error()
	}
	// Every entry of every hop is checked: gjson's validator accepts what encoding/json.Valid
	// accepts (FuzzDecodeEntry compares them) at less than half the cost.
	if !gjson.ValidBytes(p) {
		return Entry{}, "payload is not valid JSON"
	}
	e := Entry{ID: id, Payload: p}
	if f.has&hasKey != 0 {
		if !utf8.Valid(f.key) {
			return Entry{}, "key is not valid UTF-8"
		}
		e.Key = string(f.key)
	}
	if f.has&hasHeaders != 0 {
		if !utf8.Valid(f.headers) {
			// encoding/json would turn the bytes into U+FFFD without a word.
			return Entry{}, "headers are not valid UTF-8"
		}
		h, plain := plainStrings(f.headers)
		if !plain {
			if err := json.Unmarshal(f.headers, &h); err != nil {
				return Entry{}, "headers are not a JSON object of strings: " + err.Error()
			}
		}
		if len(h) > 0 {
			e.Headers = h
		}
	}
	if f.has&hasTraceParent != 0 {
		var state string
		if f.has&hasTraceState != 0 {
			state = string(f.traceState)
		}
		e.setTraceContext(string(f.traceParent), f.has&hasTraceState != 0, state)
	}
	return e, ""
}

// setTraceContext takes an entry's trace context as W3C Trace Context asks of a receiver: an
// invalid traceparent is not used and not passed on, and neither is the tracestate that came with
// it; an invalid tracestate alone is dropped and the traceparent kept.
func (e *Entry) setTraceContext(traceParent string, hasState bool, state string) {
	if !validTraceParent(traceParent) {
		e.TraceDropped = true
		return
	}
	e.TraceParent = traceParent
	if hasState && validTraceState(state) {
		e.TraceState = state
	}
}

// decodeFlat turns an entry without a payload field into a flat entry.
func decodeFlat(msg goredis.XMessage, maxSize int64) (Entry, error) {
	if maxSize > 0 {
		if size := messageSize(msg); size > maxSize {
			return Entry{}, tooLarge(msg, size, maxSize)
		}
	}
	e := Entry{ID: msg.ID, Flat: true}
	obj := make(map[string]string, len(msg.Values))
	traceParent, hasTraceParent := "", false
	for k, v := range msg.Values {
		switch k {
		case FieldTraceParent:
			traceParent, hasTraceParent = toString(v), true
		case FieldTraceState:
		default:
			s := toString(v)
			if !validText(k) || !validText(s) {
				// marshalStrings would turn the bytes into U+FFFD without a word.
				return Entry{}, malformed(msg, fmt.Sprintf("field %q is not valid UTF-8", k))
			}
			obj[k] = s
		}
	}
	if hasTraceParent {
		state, hasState := msg.Values[FieldTraceState]
		e.setTraceContext(traceParent, hasState, toString(state))
	}
	p, err := marshalStrings(obj)
	if err != nil {
		return Entry{}, malformed(msg, "fields cannot be encoded as JSON: "+err.Error())
	}
	e.Payload = p
	return e, nil
}

// validText reports whether s is valid UTF-8, looking at ASCII a byte at a time: keys and field
// values are short, and utf8.ValidString's setup costs more than they do.
func validText(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return utf8.ValidString(s[i:])
		}
	}
	return true
}

// EntrySize is the size of an entry as a limit on it counts it: the bytes of its fields' names
// and values, as XADD stores them (headers whose strings need escapes take a few bytes more).
// Entries read from a stream are measured the same way.
func EntrySize(e Entry) int64 {
	size := int64(len(FieldPayload) + len(e.Payload))
	if len(e.Payload) == 0 && e.Large != nil {
		size += e.Large.Size
	}
	if e.Key != "" {
		size += int64(len(FieldKey) + len(e.Key))
	}
	if len(e.Headers) > 0 {
		// As marshalStrings writes them, {"k":"v","k2":"v2"}, but for escapes.
		size += int64(len(FieldHeaders) + 1 + len(e.Headers))
		for k, v := range e.Headers {
			size += int64(len(k) + len(v) + 5)
		}
	}
	if e.TraceParent != "" {
		size += int64(len(FieldTraceParent) + len(e.TraceParent))
	}
	if e.TraceState != "" {
		size += int64(len(FieldTraceState) + len(e.TraceState))
	}
	return size
}

// messageSize is EntrySize of an entry as read.
func messageSize(msg goredis.XMessage) int64 {
	var size int64
	for k, v := range msg.Values {
		size += int64(len(k) + fieldLen(v))
	}
	return size
}

func fieldLen(v any) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case []byte:
		return len(v)
	}
	return len(toString(v))
}

// malformedFieldPrefix is how much of each field the dead letter of an entry that is too large keeps.
const malformedFieldPrefix = 1 << 10

// tooLarge reports an entry above the size limit. Its fields are cut short: a dead letter
// holding all of them would be as large as the entry.
func tooLarge(msg goredis.XMessage, size, limit int64) *MalformedEntryError {
	fields := make(map[string]string, len(msg.Values))
	for k, v := range msg.Values {
		s := toString(v)
		if len(s) > malformedFieldPrefix {
			s = fmt.Sprintf("%s... (%d bytes in all)", strings.ToValidUTF8(s[:malformedFieldPrefix], ""), len(s))
		}
		fields[k] = s
	}
	return &MalformedEntryError{ID: msg.ID, Fields: fields, Reason: fmt.Sprintf(
		"entry is %s, larger than the limit of %s (max_message_size); it was not decoded",
		formatSize(size), formatSize(limit))}
}

// formatSize prints a byte count for people: "70000000 bytes (66.8 MiB)".
func formatSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%d bytes (%.1f GiB)", n, float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%d bytes (%.1f MiB)", n, float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d bytes (%.1f KiB)", n, float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
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
