package admin

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// PayloadEdit sets one field of a dead letter's payload as Replay sends it back (flowrun dlq
// replay --set 'msg.amount = tonumber(msg.amount)'): the fix for messages that a stage refused
// for their content, which replaying them unchanged would only dead-letter again.
type PayloadEdit struct {
	// Field is the path of the field set: ["amount"], or ["customer", "id"] for msg.customer.id.
	Field []string
	// Text is the edit as given, for messages.
	Text string
	expr *flow.MessageExpr
}

// editTarget is the left side of an edit: msg, then one or more field names.
var editTarget = regexp.MustCompile(`^msg(\.[A-Za-z_][A-Za-z0-9_-]*)+$`)

// ParsePayloadEdit parses an edit written "msg.FIELD = EXPR", where EXPR is an expression over msg
// with the functions of pipelines, as a map stage's set has. name says where the edit came from
// (a flag); the diagnostics of EXPR are located in the returned file, which holds EXPR alone.
func ParsePayloadEdit(name, text string) (PayloadEdit, *hcl.File, hcl.Diagnostics) {
	e := PayloadEdit{Text: text}
	// The left side is a path of names, which holds no "=": the first "=" is the assignment, unless
	// it starts "==" (msg.a == 1 is a condition, not an edit).
	i := strings.Index(text, "=")
	target := ""
	if i >= 0 && !strings.HasPrefix(text[i:], "==") {
		target = strings.TrimSpace(text[:i])
	}
	if !editTarget.MatchString(target) {
		return e, nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Not an edit",
			Detail: fmt.Sprintf("%s %q does not say which field to set: write msg.FIELD = EXPR, such as "+
				"msg.amount = tonumber(msg.amount).", name, text),
		}}
	}
	e.Field = strings.Split(target, ".")[1:]
	expr, file, diags := flow.CompileMessageExpr(name+" "+target, strings.TrimSpace(text[i+1:]))
	e.expr = expr
	return e, file, diags
}

// applyEdits returns payload with the edits made. Every edit sees the payload as the dead letter
// holds it, as the fields of a map stage's set see the message as it arrived; the edits are made
// in order, so of two that set one field the last one wins.
func applyEdits(payload []byte, edits []PayloadEdit) ([]byte, error) {
	msg, err := stages.DecodePayload(payload)
	if err != nil {
		return nil, err
	}
	values := make([]any, len(edits))
	for i, e := range edits {
		v, err := e.expr.Clone().Eval(msg)
		if err != nil {
			return nil, fmt.Errorf("--set %s: %s", e.Text, flow.EvalMessage(err))
		}
		values[i] = v
	}
	// The expressions have read msg: now it may change.
	m := stages.NewMessage("", nil, nil)
	m.Value = msg
	for i, e := range edits {
		obj := msg
		for j, name := range e.Field[:len(e.Field)-1] {
			next, ok := obj[name]
			if !ok || next == nil {
				child := map[string]any{}
				obj[name], obj = child, child
				continue
			}
			if obj, ok = next.(map[string]any); !ok {
				return nil, fmt.Errorf("--set %s: msg.%s is not an object", e.Text, strings.Join(e.Field[:j+1], "."))
			}
		}
		obj[e.Field[len(e.Field)-1]] = values[i]
	}
	m.Changed()
	return m.Payload()
}
