package runtime_test

import (
	"context"
	"errors"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
)

// schemaPipeline reads orders from stdin into a topic with a schema; a map writes them, with a
// label, into a second topic whose schema bounds the label.
const schemaPipeline = `
pipeline "schemas" {}

topic "orders" {
  partitions = 2
  key        = msg.user_id
  schema     = file("${path.pipeline}/order.schema.json")
}

topic "labelled" {
  partitions = 2
  schema     = file("${path.pipeline}/labelled.schema.json")
}

retry "three" {
  max_attempts = 3
  initial      = "1ms"
}

source "in" {
  kind   = "stdin"
  output = topic.orders
}

stage "label" {
  kind   = "map"
  input  = topic.orders
  output = topic.labelled
  retry  = retry.three
  set    = { label = upper(msg.note) }
}

sink "out" {
  kind  = "stdout"
  input = topic.labelled
}
`

const orderSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["user_id", "amount", "note"],
  "properties": {
    "user_id": {"type": "string"},
    "amount": {"type": "number"},
    "note": {"type": "string"}
  }
}`

const labelledSchema = `{
  "type": "object",
  "properties": {"label": {"type": "string", "maxLength": 4}}
}`

// Every writer validates what it writes to a topic with a schema: the source dead-letters the
// lines that do not satisfy the first topic's, the stage the messages whose outputs do not satisfy
// the second's, each at its first attempt (a schema failure is permanent), with the schema path
// and the message's location of the failure. Exactly the others arrive.
func TestSchemaDeadLettersInvalidMessages(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "order.schema.json"), orderSchema)
	writeFile(t, filepath.Join(dir, "labelled.schema.json"), labelledSchema)
	writeFile(t, filepath.Join(dir, "p.hcl"), schemaPipeline)
	plan := build(t, filepath.Join(dir, "p.hcl"))
	c := server.open(t)

	input := strings.Join([]string{
		`{"user_id": "u1", "amount": 10, "note": "ok"}`,
		`{"user_id": "u2", "amount": "10", "note": "ok"}`,     // amount is a string
		`{"user_id": "u3", "amount": 3.5, "note": "toolong"}`, // its label is too long
		`{"amount": 1, "note": "ok"}`,                         // no user_id
		`{"user_id": "u5", "amount": 7, "note": "fine"}`,
	}, "\n")
	j := runJob(t, c, plan, runtime.Options{Stdin: strings.NewReader(input)})

	lines := strings.Split(strings.TrimSpace(j.stdout), "\n")
	sort.Strings(lines)
	if len(lines) != 2 || !strings.Contains(lines[0], `"u1"`) || !strings.Contains(lines[1], `"u5"`) {
		t.Errorf("delivered:\n%s\nwant u1 and u5 only", j.stdout)
	}
	if n := j.node(t, "in"); n.DeadLettered != 2 || n.Out != 3 {
		t.Errorf("source: %+v, want 2 dead-lettered and 3 out", n)
	}
	if n := j.node(t, "label"); n.DeadLettered != 1 || n.Out != 2 {
		t.Errorf("stage: %+v, want 1 dead-lettered and 2 out", n)
	}

	reasons := func(node string) []string {
		dl, err := admin.OpenDeadLetters(c, plan, node)
		if err != nil {
			t.Fatal(err)
		}
		list, err := dl.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range list {
			if d.Envelope.Attempts != 1 {
				t.Errorf("%s: a dead letter after %d attempts: a schema failure is not retried", node, d.Envelope.Attempts)
			}
			out = append(out, d.Envelope.Error)
		}
		sort.Strings(out)
		return out
	}
	want := []string{
		"topic orders: schema: /properties/amount/type: at /amount: got string, want number",
		"topic orders: schema: /required: at /: missing property 'user_id'",
	}
	if got := reasons("in"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the source's dead letters say\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	want = []string{"topic labelled: schema: /properties/label/maxLength: at /label: maxLength: got 7, want 4"}
	if got := reasons("label"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the stage's dead letters say\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// A dead letter replayed to the stage must satisfy the schema of its input topic, which its
	// expressions rely on: an edit that breaks it is refused, and the dead letter stays.
	dl, err := admin.OpenDeadLetters(c, plan, "label")
	if err != nil {
		t.Fatal(err)
	}
	list, err := dl.List(context.Background())
	if err != nil || len(list) != 1 {
		t.Fatalf("%d dead letters of label (%v)", len(list), err)
	}
	edit, _, diags := admin.ParsePayloadEdit("--set", `msg.amount = "3.5"`)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	res, err := dl.Replay(context.Background(), []string{list[0].ID}, edit)
	if err != nil || len(res.Replayed) != 0 ||
		res.Skipped[list[0].ID] != "topic orders: schema: /properties/amount/type: at /amount: got string, want number" {
		t.Errorf("replayed %v, skipped %v (%v): want it skipped for the schema", res.Replayed, res.Skipped, err)
	}

	// flowrun produce and the applications that embed flowrun publish through the Publisher: it
	// refuses such a message, for good.
	pub, err := runtime.NewPublisher(c, plan)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close(context.Background()) }()
	err = pub.Publish(context.Background(), "orders", stages.NewMessage("", []byte(`{"user_id": 1, "amount": 1, "note": ""}`), nil))
	var invalid *flow.SchemaError
	if !errors.As(err, &invalid) || !stages.IsPermanent(err) || invalid.SchemaPath != "/properties/user_id/type" || invalid.Instance != "/user_id" {
		t.Errorf("publishing an invalid message: %v, want a permanent schema error at /user_id", err)
	}
}

// A window's result that its output topic's schema refuses is dead-lettered by the aggregate,
// with the reason, not dropped; the others arrive.
func TestSchemaDeadLettersAWindowResult(t *testing.T) {
	src := `
pipeline "counts" {}
topic "orders" { key = msg.customer }
topic "counts" {
  schema = jsonencode({ properties = { orders = { type = "integer", maximum = 2 } } })
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "per_minute" {
  kind       = "aggregate"
  input      = topic.orders
  output     = topic.counts
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { orders = count() }
}
sink "out" {
  kind  = "stdout"
  input = topic.counts
}
`
	plan := buildSource(t, src)
	c := server.open(t)
	input := strings.Join([]string{
		`{"customer": "a", "at": 1000}`, `{"customer": "a", "at": 2000}`, `{"customer": "a", "at": 3000}`,
		`{"customer": "b", "at": 1000}`,
	}, "\n")
	j := runJob(t, c, plan, runtime.Options{Stdin: strings.NewReader(input)})
	if lines := strings.Split(strings.TrimSpace(j.stdout), "\n"); len(lines) != 1 || !strings.Contains(lines[0], `"b"`) {
		t.Errorf("delivered:\n%s\nwant b's window only", j.stdout)
	}
	dl, err := admin.OpenDeadLetters(c, plan, "per_minute")
	if err != nil {
		t.Fatal(err)
	}
	list, err := dl.List(context.Background())
	if err != nil || len(list) != 1 ||
		list[0].Envelope.Error != "topic counts: schema: /properties/orders/maximum: at /orders: maximum: got 3, want 2" ||
		!strings.Contains(string(list[0].Envelope.Payload), `"orders":3`) {
		t.Fatalf("dead letters %+v (%v): want a's window", list, err)
	}
}
