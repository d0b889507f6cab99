package flow_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	. "github.com/flowrun/flowrun/flow"
)

const userSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["user_id", "amount"],
  "properties": {
    "user_id": {"type": "string"},
    "amount": {"type": "number"},
    "status": {"enum": ["new", "paid"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {
      "type": "object",
      "properties": {"city": {"type": "string"}},
      "additionalProperties": false
    },
    "extra": {"type": "object"}
  }
}`

// schemaPipeline is a pipeline whose topic "users" has userSchema (from a file), with body added.
func schemaPipeline(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "user.schema.json")
	if err := os.WriteFile(path, []byte(userSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	return `
pipeline "s" {}
topic "users" {
  schema = file("` + path + `")
}
source "in" {
  kind   = "stdin"
  output = topic.users
}
` + body
}

// schemaErrors compiles src and returns its errors as "LINE: SUMMARY: DETAIL".
func schemaErrors(t *testing.T, src string) []string {
	t.Helper()
	_, diags := compileDiags(t, src, Options{})
	var out []string
	for _, d := range diags {
		if d.Severity == hcl.DiagError {
			out = append(out, itoa(d.Subject.Start.Line)+": "+d.Summary+": "+d.Detail)
		}
	}
	return out
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestSchemaUnknownFieldIsALocatedErrorWithASuggestion(t *testing.T) {
	got := schemaErrors(t, schemaPipeline(t, `
sink "out" {
  kind  = "stdout"
  input = topic.users
  where = msg.userid == "u1" && msg.address.cty == "Berlin" && msg.extra.anything
}
`))
	want := []string{
		`14: Unknown field: msg has no field "userid" in the schema of topic "users". Did you mean "user_id"?`,
		`14: Unknown field: msg.address has no field "cty" in the schema of topic "users" (/properties/address). Did you mean "city"?`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSchemaTypeMismatches(t *testing.T) {
	got := schemaErrors(t, schemaPipeline(t, `
stage "big" {
  kind  = "filter"
  input = topic.users
  where = msg.user_id > 10 || msg.amount == "100"
}
stage "by_tags" {
  kind     = "aggregate"
  input    = topic.users
  group_by = msg.tags
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "out" {
  kind  = "stdout"
  input = stage.big
  where = msg.amount
}
sink "tags" {
  kind  = "stdout"
  input = stage.by_tags
}
`))
	want := []string{
		`14: Type mismatch: The left operand must be a number, but msg.user_id is a string in the schema of topic "users" (/properties/user_id). A field the schema types is not converted implicitly: write tonumber(msg.user_id) to use it as a number.`,
		`14: Type mismatch: msg.amount is a number in the schema of topic "users" (/properties/amount), and "100" is a string: == never converts, so they are never equal.`,
		`19: Type mismatch: group_by must be a string, a number or a bool (what a key is made of), but msg.tags is a list in the schema of topic "users" (/properties/tags).`,
		`29: Type mismatch: where must be true or false, but msg.amount is a number in the schema of topic "users" (/properties/amount).`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The shape of a topic's messages follows them through the stages that say how they pass them on
// (filter, map), and stops at those that do not (a go function): nothing is known there.
func TestSchemaThroughStages(t *testing.T) {
	got := schemaErrors(t, schemaPipeline(t, `
stage "paid" {
  kind  = "filter"
  input = topic.users
  where = msg.status == "paid"
}
stage "cents" {
  kind  = "map"
  input = stage.paid
  set   = { cents = msg.amount * 100 }
  drop  = ["amount"]
}
sink "out" {
  kind  = "stdout"
  input = stage.cents
  where = msg.cents > 0 && msg.amount > 0 && msg.userid == "x"
}
`))
	want := []string{
		`25: Unknown field: msg has no field "amount": its fields are "address", "cents", "extra", "status", "tags" and "user_id", by the schema of topic "users" as stage "cents" changes it.`,
		`25: Unknown field: msg has no field "userid" in the schema of topic "users" as stage "cents" changes it. Did you mean "user_id"?`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A schema with additionalProperties, or one that declares no properties, lets any field
	// through; so does a topic without a schema.
	open := `{"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true}`
	src := `
pipeline "s" {}
topic "t" { schema = ` + "jsonencode(" + open + ")" + ` }
source "in" {
  kind   = "stdin"
  output = topic.t
}
sink "out" {
  kind  = "stdout"
  input = topic.t
  where = msg.b == 1 && msg.a == "x"
}
`
	if got := schemaErrors(t, src); len(got) > 0 {
		t.Errorf("an open schema: %v", got)
	}
}

func TestSchemaThatDoesNotCompileIsALocatedError(t *testing.T) {
	src := `
pipeline "s" {}
topic "t" {
  schema = <<-EOT
    {"type": "object",
     "properties": {"a": {"type": "strin"}}}
  EOT
}
topic "u" {
  schema = "{\"type\": \"object\",,}"
}
source "in" {
  kind   = "stdin"
  output = topic.t
}
source "in2" {
  kind   = "stdin"
  output = topic.u
}
`
	got := schemaErrors(t, src)
	if len(got) != 2 || !strings.HasPrefix(got[0], `4: Invalid schema: The schema of topic "t" does not compile`) ||
		!strings.Contains(got[0], "/properties/a/type") ||
		!strings.HasPrefix(got[1], `10: Invalid schema: The schema of topic "u" does not compile: line 1, column 20: invalid character ','`) {
		t.Errorf("errors:\n%s", strings.Join(got, "\n"))
	}
}

func TestSchemaValidateSaysWhere(t *testing.T) {
	s, err := CompileMessageSchema("users", userSchema, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ msg, want string }{
		{`{"user_id": "a", "amount": 1}`, ""},
		{`{"user_id": "a", "amount": "1"}`, "topic users: schema: /properties/amount/type: at /amount: got string, want number"},
		{`{"user_id": "a", "amount": 1, "address": {"city": 1, "zip": "x"}}`,
			"topic users: schema: /properties/address/additionalProperties: at /address: additional properties 'zip' not allowed (and 1 more)"},
		{`{"amount": 1}`, "topic users: schema: /required: at /: missing property 'user_id'"},
	} {
		var v map[string]any
		d := json.NewDecoder(strings.NewReader(c.msg))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		err := s.Validate(v)
		var se *SchemaError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.msg, err)
		case c.want != "" && (!errors.As(err, &se) || err.Error() != c.want):
			t.Errorf("%s: %v, want %s", c.msg, err, c.want)
		}
	}
}

// BenchmarkSchemaValidate measures the cost of a topic's schema on each message written to it.
func BenchmarkSchemaValidate(b *testing.B) {
	s, err := CompileMessageSchema("users", userSchema, "")
	if err != nil {
		b.Fatal(err)
	}
	v := map[string]any{"user_id": "u1", "amount": json.Number("42.5"), "status": "paid", "tags": []any{"a", "b"}}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Validate(v); err != nil {
			b.Fatal(err)
		}
	}
}

// Topics of one schema share it, so that a message passed on unchanged from one to the other is not
// checked again; another schema is another.
func TestSchemaSharedByTopics(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{"a.json": userSchema, "b.json": `{"type": "object"}`} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	plan := compileSource(t, `
pipeline "s" {}
topic "t1" { schema = file("`+dir+`/a.json") }
topic "t2" { schema = file("`+dir+`/a.json") }
topic "t3" { schema = file("`+dir+`/b.json") }
source "in" {
  kind   = "stdin"
  output = topic.t1
}
stage "f" {
  kind   = "filter"
  input  = topic.t1
  output = topic.t2
  where  = msg.amount > 1
}
stage "g" {
  kind   = "filter"
  input  = topic.t2
  output = topic.t3
  where  = msg.amount > 2
}
sink "out" {
  kind  = "stdout"
  input = topic.t3
}
`, Options{})
	t1, t2, t3 := plan.Topic("t1").Schema, plan.Topic("t2").Schema, plan.Topic("t3").Schema
	if !t1.SameAs(t2) || t1.SameAs(t3) {
		t.Errorf("t1 same as t2: %v (want true), as t3: %v (want false)", t1.SameAs(t2), t1.SameAs(t3))
	}
}
