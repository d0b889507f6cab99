package schema

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/testfile"
	_ "github.com/flowrun/flowrun/stages" // the built-in kinds
)

var update = flag.Bool("update", false, "rewrite flowrun.schema.json and flowtest.schema.json")

func TestGeneratedSchemaIsCurrent(t *testing.T) {
	checkGenerated(t, "flowrun.schema.json", flow.JSONSchema(), JSON)
}

func TestGeneratedTestSchemaIsCurrent(t *testing.T) {
	checkGenerated(t, "flowtest.schema.json", testfile.JSONSchema(), TestJSON)
}

// checkGenerated compares a generated schema with its embedded file, or rewrites the file with -update.
func checkGenerated(t *testing.T, file string, got, embedded []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(got, embedded) {
		t.Fatalf("schema/%s is stale: run make generate", file)
	}
}

// compiled compiles the pipeline schema with a draft 2020-12 validator.
func compiled(t *testing.T) *jsonschema.Schema {
	t.Helper()
	return compile(t, flow.JSONSchemaID, flow.JSONSchema())
}

// compile compiles a schema document with a draft 2020-12 validator.
func compile(t *testing.T, id string, src []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(id, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(id)
	if err != nil {
		t.Fatalf("the schema does not compile: %v", err)
	}
	return s
}

func validate(t *testing.T, s *jsonschema.Schema, src string) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(v)
}

func TestSchemaAcceptsTheJSONExample(t *testing.T) {
	src, err := os.ReadFile("../examples/pipelines/greetings.hcl.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := validate(t, compiled(t), string(src)); err != nil {
		t.Fatalf("the JSON example does not validate: %v", err)
	}
}

func TestSchemaRejectsMistakes(t *testing.T) {
	s := compiled(t)
	cases := map[string]string{
		"unknown block type":        `{"stge": {"x": {}}}`,
		"unknown attribute":         `{"topic": {"orders": {"partitons": 2}}}`,
		"partitions below one":      `{"topic": {"orders": {"partitions": 0}}}`,
		"unknown kind":              `{"stage": {"x": {"kind": "mapp", "input": "topic.orders"}}}`,
		"attribute of another kind": `{"stage": {"x": {"kind": "map", "input": "topic.orders", "where": "${true}"}}}`,
		"missing required":          `{"sink": {"x": {"kind": "stdout"}}}`,
		"bad reference":             `{"sink": {"x": {"kind": "stdout", "input": "orders"}}}`,
		"bad duration":              `{"retry": {"r": {"initial": "5 seconds"}}}`,
		"unknown backoff":           `{"retry": {"r": {"backoff": "square"}}}`,
		"invalid name":              `{"topic": {"my topic": {}}}`,
	}
	for name, src := range cases {
		if err := validate(t, s, src); err == nil {
			t.Errorf("%s: the schema accepts %s", name, src)
		}
	}
	valid := map[string]string{
		"expression for a number": `{"topic": {"orders": {"partitions": "${var.n}"}}}`,
		"route with cases":        `{"stage": {"r": {"kind": "route", "input": "topic.a", "case": [{"when": "${msg.x == 1}", "output": "topic.b"}], "default": "topic.c"}}}`,
		"blocks as an array":      `{"topic": [{"a": {}}, {"b": {"partitions": 2}}]}`,
		"retention":               `{"topic": {"a": {"retention": {"max_len": 10, "max_age": "7d"}}}}`,
	}
	for name, src := range valid {
		if err := validate(t, s, src); err != nil {
			t.Errorf("%s: the schema rejects %s: %v", name, src, err)
		}
	}
}

func TestSchemaIsJSON(t *testing.T) {
	var v map[string]any
	if err := json.Unmarshal(JSON, &v); err != nil {
		t.Fatal(err)
	}
	if v["$id"] != flow.JSONSchemaID {
		t.Fatalf("$id = %v", v["$id"])
	}
}

func TestTestSchemaAcceptsTheJSONFixture(t *testing.T) {
	src, err := os.ReadFile("../flow/testfile/testdata/pipeline/tests/shop.flowtest.hcl.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := validate(t, compile(t, testfile.JSONSchemaID, testfile.JSONSchema()), string(src)); err != nil {
		t.Fatalf("the JSON test fixture does not validate: %v", err)
	}
}

func TestTestSchemaRejectsMistakes(t *testing.T) {
	s := compile(t, testfile.JSONSchemaID, testfile.JSONSchema())
	cases := map[string]string{
		"unknown block type":      `{"rnu": {"x": {}}}`,
		"unknown attribute":       `{"run": {"x": {"advnce": "1s"}}}`,
		"crash outside a step":    `{"run": {"x": {"crash": true}}}`,
		"bad reference":           `{"run": {"x": {"expect": {"sink": "topic.out", "count": 1}}}}`,
		"unknown match":           `{"run": {"x": {"expect": {"sink": "sink.out", "match": "some"}}}}`,
		"responses not integers":  `{"override_sink": {"hook": {"responses": [1.5]}}}`,
		"missing responses":       `{"override_sink": {"hook": {}}}`,
		"mock result unknown arg": `{"mock": {"acme.score": {"result": {"eror": "x"}}}}`,
	}
	for name, src := range cases {
		if err := validate(t, s, src); err == nil {
			t.Errorf("%s: the schema accepts %s", name, src)
		}
	}
	valid := map[string]string{
		"steps as an array": `{"run": {"x": {"step": [{"crash": true}, {"advance": "1s"}]}}}`,
		"variables":         `{"variables": {"events": 3, "name": "x"}}`,
		"dead letters":      `{"run": {"x": {"expect_dead_letters": {"stage": "stage.score", "count": 1}}}}`,
	}
	for name, src := range valid {
		if err := validate(t, s, src); err != nil {
			t.Errorf("%s: the schema rejects %s: %v", name, src, err)
		}
	}
}
