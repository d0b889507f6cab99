package stages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// NewMessage returns a message whose payload is decoded only when something needs its fields, so
// that a stage that passes messages on unchanged never pays for JSON.
func NewMessage(key string, payload []byte, headers map[string]string) Message {
	return Message{Key: key, Headers: headers, raw: payload}
}

// Decode parses the payload into Value, if that has not happened yet. The payload must be a JSON
// object. Numbers decode as json.Number, which keeps every digit of large ids.
func (m *Message) Decode() error {
	if m.Value != nil || m.raw == nil {
		if m.Value == nil {
			m.Value = map[string]any{}
		}
		return nil
	}
	v, err := DecodePayload(m.raw)
	if err != nil {
		return err
	}
	m.Value = v
	return nil
}

// DecodePayload parses a JSON object, with numbers as json.Number. A payload that is not one is a
// permanent error: retrying cannot fix it.
func DecodePayload(payload []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, Permanent(fmt.Errorf("payload is not valid JSON: %w", err))
	}
	if dec.More() {
		return nil, Permanent(errors.New("payload is not valid JSON: data after the value"))
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, Permanent(fmt.Errorf("payload is a JSON %s, not an object", jsonKind(v)))
	}
	return obj, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
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
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m.Value); err != nil {
		return nil, Permanent(fmt.Errorf("cannot encode the message as JSON: %w", err))
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// changed records that Value may differ from the payload the message arrived with.
func (m *Message) changed() { m.raw = nil }
