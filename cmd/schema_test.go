package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
)

func TestSchemaInfer(t *testing.T) {
	samples := `{"order_id": "1001", "user_id": "alice", "amount": 42.5, "items": 2, "tags": ["gift"], "address": {"city": "Berlin"}, "note": null}

{"order_id": "1002", "user_id": "bob", "amount": 10, "items": 1, "tags": [], "address": {"city": "Paris", "zip": "75001"}}
{"order_id": "1003", "user_id": "carol", "amount": 7, "items": 3, "tags": [], "address": {"city": "Rome"}, "note": "leave at the door"}
`
	code, out, errOut := runIn(t, samples, "schema", "infer", "-")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got struct {
		Schema     string   `json:"$schema"`
		Type       string   `json:"type"`
		Required   []string `json:"required"`
		Properties map[string]struct {
			Type       any      `json:"type"`
			Required   []string `json:"required"`
			Properties map[string]any
			Items      map[string]any
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	p := got.Properties
	switch {
	case got.Schema != "https://json-schema.org/draft/2020-12/schema" || got.Type != "object":
		t.Errorf("not a 2020-12 object schema:\n%s", out)
	case strings.Join(got.Required, ",") != "address,amount,items,order_id,tags,user_id":
		t.Errorf("required %v: note is not in every message, the rest are", got.Required)
	case p["amount"].Type != "number" || p["items"].Type != "integer" || p["order_id"].Type != "string":
		t.Errorf("types:\n%s", out)
	case strings.Join(toStrings(p["note"].Type), ",") != "string,null":
		t.Errorf("note is a string or null: %v", p["note"].Type)
	case p["address"].Type != "object" || strings.Join(p["address"].Required, ",") != "city" || len(p["address"].Properties) != 2:
		t.Errorf("address: %+v", p["address"])
	case p["tags"].Type != "array" || p["tags"].Items["type"] != "string":
		t.Errorf("tags: %+v", p["tags"])
	}
	// What it proposes compiles, and every sample satisfies it.
	s, err := flow.CompileMessageSchema("orders", out, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(samples), "\n") {
		if line == "" {
			continue
		}
		var v map[string]any
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if err := s.Validate(v); err != nil {
			t.Errorf("a sample does not satisfy the inferred schema: %v", err)
		}
	}

	path := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(path, []byte("{\"a\": 1}\n[1, 2]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "schema", "infer", path); code != ExitInvalid || !strings.Contains(errOut, "bad.jsonl:2: a message is a JSON object, not a JSON array") {
		t.Errorf("a line that is no object: exit %d, %s", code, errOut)
	}
}

func toStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, x := range l {
			s, _ := x.(string)
			out = append(out, s)
		}
	}
	return out
}

// validate reports a field that the topic's schema does not have where the expression is, with a
// suggestion, and exits with the code of a bad configuration.
func TestValidateAgainstTopicSchema(t *testing.T) {
	dir := t.TempDir()
	schema := `{"type": "object", "properties": {"user_id": {"type": "string"}, "amount": {"type": "number"}}}`
	pipeline := `pipeline "p" {}

topic "orders" {
  key    = msg.user_id
  schema = file("${path.pipeline}/order.schema.json")
}

source "in" {
  kind   = "stdin"
  output = topic.orders
}

sink "out" {
  kind  = "stdout"
  input = topic.orders
  where = msg.userid != "" && msg.amount > 10
}
`
	for name, content := range map[string]string{"order.schema.json": schema, "p.hcl": pipeline} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, _, errOut := run(t, "validate", filepath.Join(dir, "p.hcl"))
	if code != ExitInvalid || !strings.Contains(errOut, "p.hcl line 16") ||
		!strings.Contains(errOut, `msg has no field "userid" in the schema of topic "orders". Did you mean "user_id"?`) {
		t.Errorf("exit %d:\n%s", code, errOut)
	}
}

// produce refuses a line that does not satisfy the topic's schema, saying where, and publishes the
// others.
func TestProduceRefusesWhatTheSchemaDoesNot(t *testing.T) {
	url := redistest.Shared(t).URL()
	path, _ := testPipeline(t, `
topic "orders" {
  key    = msg.customer_id
  schema = jsonencode({ type = "object", required = ["customer_id"], properties = { customer_id = { type = "string" }, seq = { type = "integer" } } })
}

source "in" {
  kind   = "stdin"
  output = topic.orders
}

sink "out" {
  kind  = "stdout"
  input = topic.orders
}
`)
	in := `{"customer_id":"a","seq":1}` + "\n" + `{"customer_id":"b","seq":"2"}` + "\n" + `{"customer_id":"c","seq":3}` + "\n"
	code, _, errOut := runIn(t, in, "produce", "--redis", url, path, "orders")
	if code != ExitError || !strings.Contains(errOut, "stdin:2: topic orders: schema: /properties/seq/type: at /seq: got string, want integer") ||
		!strings.Contains(errOut, "published 2 messages") {
		t.Errorf("exit %d:\n%s", code, errOut)
	}
}
