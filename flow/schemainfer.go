package flow

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// InferMessageSchema proposes a topic's schema (JSON Schema 2020-12) from sample messages, one JSON
// object a line (flowrun schema infer). It says what the samples show, no more: each field's types
// (integer where every number seen was whole; null among them where a null was seen), the fields
// present in every object as required, nested objects and arrays' items alike. It is a proposal to
// edit: a field that the samples happen to hold always, or a type that only a later message has, is
// for the author to correct. name names the input in errors ("orders.jsonl", "stdin").
func InferMessageSchema(r io.Reader, name string) ([]byte, error) {
	root := &sample{}
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	n, objects := 0, 0
	for lines.Scan() {
		n++
		text := bytes.TrimSpace(lines.Bytes())
		if len(text) == 0 {
			continue
		}
		d := json.NewDecoder(bytes.NewReader(text))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s:%d: not valid JSON: %v", name, n, err)
		}
		if d.More() {
			return nil, fmt.Errorf("%s:%d: more than one JSON value on the line", name, n)
		}
		if _, ok := v.(map[string]any); !ok {
			return nil, fmt.Errorf("%s:%d: a message is a JSON object, not a JSON %s", name, n, strings.TrimPrefix(jsonTypeName(v), "an "))
		}
		root.add(v)
		objects++
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %v", name, err)
	}
	if objects == 0 {
		return nil, fmt.Errorf("%s has no messages: give one JSON object a line", name)
	}
	doc := append(ordered{{"$schema", "https://json-schema.org/draft/2020-12/schema"}}, root.schema()...)
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// sample is what the samples showed at one place of the messages.
type sample struct {
	types   map[string]bool    // JSON Schema types seen
	objects int                // how many of the values were objects
	fields  map[string]*sample // an object's fields, with how often each was present
	present int                // how many objects had this field
	items   *sample            // an array's elements
}

func (s *sample) add(v any) {
	if s.types == nil {
		s.types = map[string]bool{}
	}
	switch v := v.(type) {
	case map[string]any:
		s.types["object"] = true
		s.objects++
		if s.fields == nil {
			s.fields = map[string]*sample{}
		}
		for k, x := range v {
			f := s.fields[k]
			if f == nil {
				f = &sample{}
				s.fields[k] = f
			}
			f.present++
			f.add(x)
		}
	case []any:
		s.types["array"] = true
		if s.items == nil {
			s.items = &sample{}
		}
		for _, x := range v {
			s.items.add(x)
		}
	default:
		s.types[jsonTypeName(v)] = true
	}
}

// schema is the JSON Schema of what the samples showed here.
func (s *sample) schema() ordered {
	var types []string
	for _, t := range []string{"object", "array", "string", "number", "integer", "boolean", "null"} {
		if s.types[t] && !(t == "integer" && s.types["number"]) {
			types = append(types, t)
		}
	}
	var out ordered
	switch len(types) {
	case 0: // an array's items, none seen: anything
	case 1:
		out = append(out, kv{"type", types[0]})
	default:
		out = append(out, kv{"type", types})
	}
	if s.fields != nil {
		names := make([]string, 0, len(s.fields))
		for n := range s.fields {
			names = append(names, n)
		}
		sort.Strings(names)
		var required []string
		props := ordered{}
		for _, n := range names {
			f := s.fields[n]
			if f.present == s.objects {
				required = append(required, n)
			}
			props = append(props, kv{n, f.schema()})
		}
		if len(required) > 0 {
			out = append(out, kv{"required", required})
		}
		out = append(out, kv{"properties", props})
	}
	if s.items != nil && len(s.items.types) > 0 {
		out = append(out, kv{"items", s.items.schema()})
	}
	return out
}

// jsonTypeName is the JSON Schema type of a decoded scalar ("integer" for a whole number).
func jsonTypeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if strings.ContainsAny(string(v), ".eE") {
			return "number"
		}
		return "integer"
	case []any:
		return "an array"
	}
	return "object"
}

// kv is a member of an ordered JSON object.
type kv struct {
	key   string
	value any
}

// ordered is a JSON object whose members keep their order: a schema reads type, required,
// properties.
type ordered []kv

func (o ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
