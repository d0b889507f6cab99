package flow

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// JSONSchemaID identifies the schema; schema/flowrun.schema.json holds the generated file.
const JSONSchemaID = "https://github.com/flowrun/flowrun/schema/flowrun.schema.json"

// JSONSchema returns the JSON Schema (draft 2020-12) of pipeline files in JSON syntax (*.hcl.json),
// derived from Language. Editors use it to complete and check pipeline files. Expressions in JSON
// syntax are strings ("${msg.amount > 100}"), so wherever a value may be an expression a string is
// accepted too; the schema checks structure and names, and flowrun validate checks the rest.
func JSONSchema() []byte {
	return LanguageJSONSchema(JSONSchemaID, "flowrun pipeline",
		"A flowrun pipeline in HCL's JSON syntax. Generated from flowrun's language registry by `flowrun schema`; do not edit.",
		Language)
}

// LanguageJSONSchema is the JSON Schema of a file in JSON syntax whose top-level blocks are
// language; JSONSchema is the pipeline language's, and package flow/testfile makes the test
// language's with it.
func LanguageJSONSchema(id, title, description string, language []*BlockSpec) []byte {
	props := map[string]any{"//": commentSchema}
	for _, b := range language {
		props[b.Type] = blockTypeSchema(b)
	}
	root := map[string]any{
		"$schema":              "https://json-schema.org/draft/2020-12/schema",
		"$id":                  id,
		"title":                title,
		"description":          description,
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	out, err := json.MarshalIndent(root, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("flow: the JSON schema does not marshal: %v", err)) // only static data goes in
	}
	return append(out, '\n')
}

// blockTypeSchema describes a block type at the top level. In JSON syntax a labelled block is an
// object keyed by its label, and any block type may also be written as an array of such objects.
func blockTypeSchema(b *BlockSpec) map[string]any {
	body := blockBodySchema(b)
	var one map[string]any
	if len(b.Labels) == 0 {
		one = body
	} else {
		names := map[string]any{"pattern": identifierPattern}
		if b.AnyLabel {
			names = map[string]any{"minLength": 1}
		}
		one = map[string]any{
			"type":                 "object",
			"description":          fmt.Sprintf("%s blocks by %s.", b.Type, b.Labels[0]),
			"propertyNames":        names,
			"additionalProperties": body,
		}
	}
	return map[string]any{
		"description": b.Doc,
		"anyOf":       []any{one, map[string]any{"type": "array", "items": one}},
	}
}

const identifierPattern = `^[A-Za-z_][A-Za-z0-9_-]*$`

// blockBodySchema describes a block's body: its attributes and nested blocks and, for blocks with
// kinds, the attributes each kind adds.
func blockBodySchema(b *BlockSpec) map[string]any {
	if b.FreeForm {
		return map[string]any{"type": "object", "description": b.Doc}
	}
	props := map[string]any{"//": commentSchema}
	var required []string
	for _, a := range b.Attributes {
		props[a.Name] = attributeSchema(a)
		if a.Required {
			required = append(required, a.Name)
		}
	}
	for _, nb := range b.Blocks {
		props[nb.Spec.Type] = nestedBlockSchema(nb)
	}
	s := map[string]any{"type": "object", "description": b.Doc, "properties": props}
	if len(required) > 0 {
		s["required"] = required
	}
	if len(b.Kinds) == 0 {
		s["additionalProperties"] = false
		return s
	}
	props["kind"] = map[string]any{"description": "The kind.", "enum": b.KindNames()}
	var branches []any
	for _, k := range b.Kinds {
		kprops := map[string]any{}
		var kreq []string
		for _, a := range k.Attributes {
			kprops[a.Name] = attributeSchema(a)
			if a.Required {
				kreq = append(kreq, a.Name)
			}
		}
		for _, nb := range k.Blocks {
			kprops[nb.Spec.Type] = nestedBlockSchema(nb)
		}
		then := map[string]any{"properties": kprops}
		if len(kreq) > 0 {
			then["required"] = kreq
		}
		branches = append(branches, map[string]any{
			"if":   map[string]any{"properties": map[string]any{"kind": map[string]any{"const": k.Name}}, "required": []string{"kind"}},
			"then": then,
		})
	}
	s["allOf"] = branches
	s["unevaluatedProperties"] = false
	return s
}

// nestedBlockSchema describes a nested block, written as an object or an array of objects.
func nestedBlockSchema(nb NestedBlock) map[string]any {
	body := blockBodySchema(nb.Spec)
	arr := map[string]any{"type": "array", "items": body}
	if nb.Min > 0 {
		arr["minItems"] = nb.Min
	}
	if nb.Max > 0 {
		arr["maxItems"] = nb.Max
	}
	return map[string]any{"description": nb.Spec.Doc, "anyOf": []any{body, arr}}
}

// commentSchema describes "//" keys, which HCL's JSON syntax ignores as comments.
var commentSchema = map[string]any{"description": "A comment, ignored."}

// expressionString is any string: in JSON syntax a string may hold a template with expressions.
var expressionString = map[string]any{"type": "string", "pattern": `\$\{`}

// attributeSchema describes one attribute's JSON value.
func attributeSchema(a Attribute) map[string]any {
	var s map[string]any
	switch a.Type {
	case TypeString:
		if len(a.Enum) > 0 {
			s = map[string]any{"anyOf": []any{map[string]any{"enum": a.Enum}, expressionString}}
		} else {
			s = map[string]any{"type": "string"}
		}
	case TypeNumber, TypeInteger:
		n := map[string]any{"type": "number"}
		if a.Type == TypeInteger {
			n["type"] = "integer"
		}
		if a.Min != nil {
			n["minimum"] = *a.Min
		}
		if a.Max != nil {
			n["maximum"] = *a.Max
		}
		s = map[string]any{"anyOf": []any{n, expressionString}}
	case TypeBool:
		s = map[string]any{"anyOf": []any{map[string]any{"type": "boolean"}, expressionString}}
	case TypeDuration:
		s = map[string]any{"type": "string", "pattern": `^(([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h|d))+|.*\$\{.*)$`}
	case TypeSize:
		s = map[string]any{"type": "string", "pattern": `^([0-9]+(\.[0-9]*)? ?(B|KB|KiB|MB|MiB|GB|GiB)|.*\$\{.*)$`}
		if len(a.Enum) > 0 {
			s = map[string]any{"anyOf": []any{s, map[string]any{"enum": a.Enum}}}
		}
	case TypeStringList:
		s = map[string]any{"anyOf": []any{map[string]any{"type": "array", "items": map[string]any{"type": "string"}}, expressionString}}
	case TypeStringMap:
		s = map[string]any{"anyOf": []any{map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}, expressionString}}
	case TypeMessageExpr, TypeMessageBool:
		s = map[string]any{"type": []string{"string", "number", "boolean"}}
	case TypeMessageFields:
		s = map[string]any{"type": "object", "additionalProperties": map[string]any{"type": []string{"string", "number", "boolean", "null", "array", "object"}}}
	case TypeTopicRef:
		s = map[string]any{"type": "string", "pattern": `^topic\.[A-Za-z_][A-Za-z0-9_-]*$`}
	case TypeInputRef:
		s = map[string]any{"type": "string", "pattern": `^(topic|stage)\.[A-Za-z_][A-Za-z0-9_-]*$`}
	case TypeAggregates:
		s = map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
	case TypeSequence:
		s = map[string]any{"type": "array", "minItems": 1, "items": map[string]any{
			"type": "object", "required": []string{stepFieldName, stepFieldWhere}, "additionalProperties": false,
			"properties": map[string]any{stepFieldName: map[string]any{"type": "string"}, stepFieldWhere: map[string]any{"type": []string{"string", "boolean"}}},
		}}
	case TypeTopicOrChoice:
		s = map[string]any{"anyOf": []any{
			map[string]any{"type": "string", "pattern": `^topic\.[A-Za-z_][A-Za-z0-9_-]*$`},
			map[string]any{"enum": a.Enum},
		}}
	case TypeTableRef:
		s = map[string]any{"type": "string", "pattern": `^table\.[A-Za-z_][A-Za-z0-9_-]*$`}
	case TypeRetryRef:
		s = map[string]any{"type": "string", "pattern": `^retry\.[A-Za-z_][A-Za-z0-9_-]*$`}
	case TypeTypeConstraint, TypeCondition:
		s = map[string]any{"type": "string"}
	case TypeReference:
		s = map[string]any{"type": "string", "pattern": `^(` + strings.Join(a.Refs, "|") + `)\.[A-Za-z_][A-Za-z0-9_-]*$`}
	case TypeMessages:
		s = map[string]any{"anyOf": []any{map[string]any{"type": "array", "items": map[string]any{"type": "object"}}, expressionString}}
	case TypeIntegerList:
		s = map[string]any{"anyOf": []any{map[string]any{"type": "array", "items": map[string]any{"type": "integer"}}, expressionString}}
	case TypeMessageObject:
		s = map[string]any{"type": []string{"object", "string"}}
	case TypeMessageExprList:
		s = map[string]any{"anyOf": []any{
			map[string]any{"type": "array", "items": map[string]any{"type": []string{"object", "string"}}},
			expressionString,
		}}
	default:
		s = map[string]any{}
	}
	s["description"] = a.Doc
	if d := jsonDefault(a.Default); d != nil {
		s["default"] = d
	}
	return s
}

// jsonDefault renders a default as it would be written in JSON syntax.
func jsonDefault(v any) any {
	switch v := v.(type) {
	case time.Duration:
		return FormatDuration(v)
	case Size:
		return FormatSize(v)
	case nil:
		return nil
	}
	return v
}
