package cmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// evalWith runs flowrun eval with a message on standard input.
func evalWith(t *testing.T, msg string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Execute(context.Background(), append([]string{"eval"}, args...), IO{In: strings.NewReader(msg), Out: &out, Err: &errOut})
	return code, out.String(), errOut.String()
}

// flowrun eval evaluates an expression as a stage would: numbers keep every digit, functions
// convert as in a pipeline, objects come out as JSON.
func TestEvalPrintsTheValue(t *testing.T) {
	for _, c := range []struct{ msg, expr, want string }{
		{`{"amount": 120, "country": "de"}`, `msg.amount > 100 && upper(msg.country) == "DE"`, "true\n"},
		{`{"id": 12345678901234567890}`, `msg.id`, "12345678901234567890\n"},
		{`{"tags": ["a", "b"]}`, `{ n = length(msg.tags), s = "x<y" }`, `{"n":2,"s":"x<y"}` + "\n"},
		{`{"x": 3}`, `upper(msg.x)`, `"3"` + "\n"},
	} {
		code, out, errOut := evalWith(t, c.msg, c.expr)
		if code != 0 || out != c.want {
			t.Errorf("eval %s on %s: exit %d, %q, want %q\n%s", c.expr, c.msg, code, out, c.want, errOut)
		}
	}
	path := filepath.Join(t.TempDir(), "order.json")
	if err := os.WriteFile(path, []byte(`{"amount": 10}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := evalWith(t, "", "--msg", path, "msg.amount * 2"); code != 0 || out != "20\n" {
		t.Errorf("eval --msg: exit %d, %q\n%s", code, out, errOut)
	}
}

// An expression that fails on the message exits 1 with the located error, as the dead letter of a
// stage would say; an invalid expression or message exits 2 and says what is wrong.
func TestEvalErrors(t *testing.T) {
	for _, c := range []struct {
		msg, expr string
		code      int
		says      []string
	}{
		{`{"amount": 120}`, `msg.amount * (1 + msg.vat)`, 1, []string{`msg has no field "vat"`, "on EXPR line 1", "msg.amount * (1 + msg.vat)"}},
		{`{}`, `msg.amount >`, 2, []string{"Missing expression", "invalid expression"}},
		{`{}`, `msg.a +`, 2, []string{"on EXPR line 1"}},
		{`[1]`, `msg`, 2, []string{"a JSON array, not an object"}},
		{``, `msg`, 2, []string{"is empty"}},
		{`{"a": 1}`, `nosuch(msg.a)`, 2, []string{"nosuch"}},
		// var and local have no value outside a pipeline: the error says so and how to pass one.
		{`{"amount": 10}`, `msg.amount * var.rate`, 2, []string{"var is not available outside a pipeline", "on EXPR line 1",
			"var.rate has no value", "Write the value in place of var.rate", "write msg.rate"}},
		{`{}`, `local.limit`, 2, []string{"local is not available outside a pipeline", "write msg.limit"}},
	} {
		code, out, errOut := evalWith(t, c.msg, c.expr)
		if code != c.code || out != "" {
			t.Errorf("eval %s on %q: exit %d, stdout %q; want exit %d\n%s", c.expr, c.msg, code, out, c.code, errOut)
		}
		for _, s := range c.says {
			if !strings.Contains(errOut, s) {
				t.Errorf("eval %s on %q: stderr does not say %q:\n%s", c.expr, c.msg, s, errOut)
			}
		}
	}
}
