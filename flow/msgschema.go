package flow

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/zclconf/go-cty/cty"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/flowrun/flowrun/flow/expr"
)

// A topic's schema (schema = file("order.schema.json")) is a JSON Schema, draft 2020-12 unless
// its $schema says otherwise, that every message written to the topic satisfies. It is compiled
// once, here, and used twice:
//
//   - at run time, everything that writes to the topic (sources, stages, flowrun produce, the
//     Publisher, a dead letter replayed) validates each message with MessageSchema.Validate; a
//     message that does not satisfy it is not written and fails for good (runtime: dead-lettered);
//   - at compile time, the expressions that read the topic's messages, directly or through stages
//     that pass fields on (Kind.PassesOn: filter, map), are compiled again with the schema's shape
//     (expr.Shape), which reports a field the schema does not have, with a "did you mean", and an
//     operation its type cannot take (checkMessageShapes).
//
// Which fields a schema has: the properties it declares. When it declares some, a field it does
// not declare is an error, unless additionalProperties or patternProperties allows more (JSON
// Schema itself lets any other field through; a typo would then pass validate). A schema that
// declares no properties says nothing about fields.

// MessageSchema is a topic's compiled schema.
type MessageSchema struct {
	// Location is the schema's file, or a name for a schema given inline.
	Location string
	topic    string
	compiled *jsonschema.Schema
	shape    *expr.Shape
}

// SchemaError is a message that does not satisfy its topic's schema: where in the schema
// (SchemaPath, a JSON pointer such as /properties/amount/type) and where in the message (Instance,
// such as /amount) the first failure is, and what it is.
type SchemaError struct {
	Topic      string
	SchemaPath string
	Instance   string
	Reason     string
	More       int // further failures of the message, not described
}

func (e *SchemaError) Error() string {
	instance := e.Instance
	if instance == "" {
		instance = "/"
	}
	s := fmt.Sprintf("topic %s: schema: %s: at %s: %s", e.Topic, e.SchemaPath, instance, e.Reason)
	if e.More > 0 {
		s += fmt.Sprintf(" (and %d more)", e.More)
	}
	return s
}

// Validate checks a message's decoded payload (as stages.Message.Value holds it: json.Number
// numbers, map[string]any, []any) against the schema. Its error is a *SchemaError.
func (s *MessageSchema) Validate(value map[string]any) error {
	err := s.compiled.Validate(value)
	if err == nil {
		return nil
	}
	var v *jsonschema.ValidationError
	if !errors.As(err, &v) {
		return &SchemaError{Topic: s.topic, Reason: err.Error()}
	}
	var leaves []*jsonschema.ValidationError
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(v)
	// The validator walks properties in map order: sorted, the reason is the same on every run.
	sort.Slice(leaves, func(i, j int) bool {
		a, b := pointer(leaves[i].InstanceLocation), pointer(leaves[j].InstanceLocation)
		if a != b {
			return a < b
		}
		return schemaPath(leaves[i]) < schemaPath(leaves[j])
	})
	first := leaves[0]
	return &SchemaError{
		Topic: s.topic, SchemaPath: schemaPath(first), Instance: pointer(first.InstanceLocation),
		Reason: first.ErrorKind.LocalizedString(english), More: len(leaves) - 1,
	}
}

// english prints the validator's reasons.
var english = message.NewPrinter(language.English)

// schemaPath is where in its schema a failure is: the failing schema's JSON pointer and keyword.
func schemaPath(e *jsonschema.ValidationError) string {
	_, frag, _ := strings.Cut(e.SchemaURL, "#")
	return frag + pointer(e.ErrorKind.KeywordPath())
}

// pointer makes a JSON pointer of tokens.
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

// CompileMessageSchema compiles the JSON Schema text of topic's messages. location is where the
// text comes from: a file, whose directory relative $refs are resolved against, or "" for a schema
// given inline.
func CompileMessageSchema(topic, text, location string) (*MessageSchema, error) {
	return compileMessageSchema(topic, text, location, nil)
}

// compileMessageSchema is CompileMessageSchema with the schemas already compiled, by location and
// text: topics of one schema share it, which lets a stage that passes a message on unchanged from
// one to another skip checking it again (SameAs).
func compileMessageSchema(topic, text, location string, compiled map[string]*jsonschema.Schema) (*MessageSchema, error) {
	id := location + "\x00" + text
	sch, ok := compiled[id]
	if !ok {
		var err error
		if sch, err = compileJSONSchema(topic, text, location); err != nil {
			return nil, err
		}
		if compiled != nil {
			compiled[id] = sch
		}
	}
	if location == "" {
		location = "topic " + topic + "'s schema"
	}
	s := &MessageSchema{Location: location, topic: topic, compiled: sch}
	s.shape = shapeOf(sch, fmt.Sprintf("the schema of topic %q", topic), 0)
	return s, nil
}

// SameAs reports whether two topics have the same schema: a message that satisfies one satisfies
// the other.
func (s *MessageSchema) SameAs(o *MessageSchema) bool {
	return s != nil && o != nil && s.compiled == o.compiled
}

// compileJSONSchema compiles a schema's text.
func compileJSONSchema(topic, text, location string) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			line, col := lineColumn(text, syntax.Offset)
			return nil, fmt.Errorf("line %d, column %d: %v", line, col, err)
		}
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	url := "urn:flowrun:topic:" + topic
	if location != "" {
		if abs, err := filepath.Abs(location); err == nil {
			url = abs
		}
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	return c.Compile(url)
}

// lineColumn returns the 1-based line and column of a byte offset into text.
func lineColumn(text string, offset int64) (int, int) {
	if offset > int64(len(text)) {
		offset = int64(len(text))
	}
	before := text[:offset]
	line := strings.Count(before, "\n") + 1
	return line, int(offset) - strings.LastIndex(before, "\n")
}

// compileTopicSchema compiles a topic's schema attribute, reporting a schema that does not compile
// at the attribute.
func (c *compiler) compileTopicSchema(t *Topic, a *hcl.Attribute, text string) {
	location := c.schemaFile(a.Expr)
	if c.schemas == nil {
		c.schemas = map[string]*jsonschema.Schema{}
	}
	s, err := compileMessageSchema(t.Name, text, location, c.schemas)
	if err != nil {
		where := "The schema"
		if location != "" {
			where = "The schema " + location
		}
		c.errorf(a.Expr.Range(), "Invalid schema", fmt.Sprintf("%s of topic %q does not compile: %v", where, t.Name, err))
		return
	}
	t.Schema = s
}

// schemaFile returns the file a schema attribute reads, when it is file(PATH): the schema's
// location, which its relative $refs resolve against and diagnostics name.
func (c *compiler) schemaFile(e hcl.Expression) string {
	call, ok := e.(*hclsyntax.FunctionCallExpr)
	if !ok || call.Name != "file" || len(call.Args) != 1 {
		return ""
	}
	v, diags := call.Args[0].Value(c.ctx)
	if diags.HasErrors() || !v.IsKnown() || v.IsNull() || v.Type() != cty.String {
		return ""
	}
	return v.AsString()
}

// shapeOf is what a compiled schema says of a value, for the static checks: nil when it says
// nothing usable. It follows $ref, and unions of anyOf and oneOf as far as their kinds.
func shapeOf(s *jsonschema.Schema, origin string, depth int) *expr.Shape {
	if s == nil || depth > 32 || s.Bool != nil {
		return nil
	}
	if s.Ref != nil && s.Types == nil && s.Properties == nil {
		return shapeOf(s.Ref, origin, depth+1)
	}
	_, path, _ := strings.Cut(s.Location, "#")
	sh := &expr.Shape{Origin: origin, Path: path}
	if s.Types != nil {
		for _, t := range s.Types.ToStrings() {
			sh.Kinds = appendKind(sh.Kinds, kindOfType(t))
		}
	} else if s.Enum != nil || s.Const != nil {
		values := []any{}
		if s.Const != nil {
			values = append(values, *s.Const)
		} else {
			values = s.Enum.Values
		}
		for _, v := range values {
			sh.Kinds = appendKind(sh.Kinds, kindOfValue(v))
		}
	} else if branches := append(slices.Clone(s.AnyOf), s.OneOf...); len(branches) > 0 {
		// A union: the kinds of its branches (all known, or none), the fields of its one object.
		var objects []*expr.Shape
		known := true
		for _, b := range branches {
			bs := shapeOf(b, origin, depth+1)
			if bs == nil || len(bs.Kinds) == 0 {
				known = false
				continue
			}
			for _, k := range bs.Kinds {
				sh.Kinds = appendKind(sh.Kinds, k)
			}
			if bs.Fields != nil || bs.Closed {
				objects = append(objects, bs)
			}
		}
		if !known {
			sh.Kinds = nil
		}
		if len(objects) == 1 {
			sh.Fields, sh.Closed, sh.Items = objects[0].Fields, objects[0].Closed, objects[0].Items
		}
		return sh
	}
	if len(s.Properties) > 0 {
		sh.Fields = make(map[string]*expr.Shape, len(s.Properties))
		for name, p := range s.Properties {
			f := shapeOf(p, origin, depth+1)
			if f == nil {
				_, fp, _ := strings.Cut(p.Location, "#")
				f = &expr.Shape{Origin: origin, Path: fp}
			}
			sh.Fields[name] = f
		}
	}
	// Closed: no other field than those declared. additionalProperties false says so; without it,
	// declaring properties does (see above), unless patternProperties, unevaluatedProperties or
	// allOf may let others in. additionalProperties true or a schema lets any other in.
	patterns := len(s.PatternProperties) > 0
	switch ap := s.AdditionalProperties.(type) {
	case bool:
		sh.Closed = !ap && !patterns
	case nil:
		sh.Closed = len(s.Properties) > 0 && !patterns && s.UnevaluatedProperties == nil && len(s.AllOf) == 0
	}
	if s.Items2020 != nil {
		sh.Items = shapeOf(s.Items2020, origin, depth+1)
	}
	return sh
}

func appendKind(kinds []expr.Kind, k expr.Kind) []expr.Kind {
	if slices.Contains(kinds, k) {
		return kinds
	}
	return append(kinds, k)
}

// kindOfType maps a JSON Schema type to the kind of expression values.
func kindOfType(t string) expr.Kind {
	switch t {
	case "boolean":
		return expr.Bool
	case "number", "integer":
		return expr.Number
	case "string":
		return expr.String
	case "array":
		return expr.List
	case "object":
		return expr.Object
	}
	return expr.Null
}

// kindOfValue is the kind of a JSON value of a schema (an enum's or a const's).
func kindOfValue(v any) expr.Kind { return expr.ValueOf(v).Kind() }
