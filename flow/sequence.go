package flow

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/flowrun/flowrun/flow/expr"
)

// A TypeSequence attribute is a list of named steps, each a condition on a message, such as a
// pattern stage's
//
//	sequence = [
//	  { name = "probe", where = msg.amount < 2 },
//	  { name = "big",   where = msg.amount > 500 },
//	]
//
// The steps' names become the roots of the attributes that declare RootsFrom with its name (a
// pattern's select = { amount = big.amount }), so that they can read each matched step's message.

// Step is one step of a TypeSequence attribute.
type Step struct {
	Name  string
	Where *expr.Program
	Range hcl.Range
}

// The attributes of a step.
const (
	stepFieldName  = "name"
	stepFieldWhere = "where"
)

// reservedRoots are the roots that a step may not be named, since expressions already mean
// something else by them.
var reservedRoots = []string{"msg", "index", "var", "local", "path"}

// decodeSequence decodes a TypeSequence attribute.
func (c *compiler) decodeSequence(spec Attribute, a *hcl.Attribute) ([]Step, bool) {
	want := fmt.Sprintf(`%s takes a list of steps, such as [{ name = "first", where = msg.amount < 2 }, { name = "then", where = msg.amount > 500 }].`, spec.Name)
	items, diags := hcl.ExprList(a.Expr)
	if diags.HasErrors() {
		c.errorf(a.Expr.Range(), fmt.Sprintf("Invalid value for %s", spec.Name), want)
		return nil, false
	}
	if len(items) == 0 {
		c.errorf(a.Expr.Range(), fmt.Sprintf("Invalid value for %s", spec.Name), want)
		return nil, false
	}
	var steps []Step
	seen := map[string]hcl.Range{}
	ok := true
	for _, item := range items {
		step, stepOK := c.decodeStep(spec, item, want)
		if !stepOK {
			ok = false
			continue
		}
		if prev, dup := seen[step.Name]; dup {
			c.errorf(step.Range, "Duplicate step", fmt.Sprintf("A step named %q is already declared at %s.", step.Name, prev))
			ok = false
			continue
		}
		seen[step.Name] = step.Range
		steps = append(steps, step)
	}
	return steps, ok
}

// decodeStep decodes one step: an object of a name and a where.
func (c *compiler) decodeStep(spec Attribute, item hcl.Expression, want string) (Step, bool) {
	pairs, diags := hcl.ExprMap(item)
	if diags.HasErrors() {
		c.errorf(item.Range(), "Invalid step", want)
		return Step{}, false
	}
	step := Step{Range: item.Range()}
	ok := true
	for _, kv := range pairs {
		field, fieldOK := c.fieldName(kv.Key)
		if !fieldOK {
			ok = false
			continue
		}
		switch field {
		case stepFieldName:
			name, nameOK := c.stepName(kv.Value)
			ok = ok && nameOK
			step.Name = name
		case stepFieldWhere:
			where := Attribute{Name: spec.Name + ".where", Type: TypeMessageBool, Roots: []string{"msg"}, Deterministic: spec.Deterministic}
			p, diags := expr.Compile(kv.Value, c.attributeScope(where))
			c.diags = append(c.diags, diags...)
			if diags.HasErrors() || !c.checkCondition(where, p) {
				ok = false
				continue
			}
			step.Where = p
		default:
			c.errorf(kv.Key.Range(), "Unsupported step field",
				fmt.Sprintf("A step has a name and a where, not %q.%s", field, DidYouMean(field, []string{stepFieldName, stepFieldWhere})))
			ok = false
		}
	}
	if ok && (step.Name == "" || step.Where == nil) {
		c.errorf(item.Range(), "Incomplete step", "Each step needs a name and a where, such as { name = \"big\", where = msg.amount > 500 }.")
		ok = false
	}
	return step, ok
}

// stepName reads a step's name: a constant string that expressions can use as a root.
func (c *compiler) stepName(e hcl.Expression) (string, bool) {
	v, ok := c.evalConstant(e)
	if !ok {
		return "", false
	}
	if v.IsNull() || !v.Type().Equals(cty.String) || !hclsyntax.ValidIdentifier(v.AsString()) {
		c.errorf(e.Range(), "Invalid step name", "A step's name is a string that is an identifier, such as \"probe1\": select reads the step's message as probe1.FIELD.")
		return "", false
	}
	name := v.AsString()
	if contains(reservedRoots, name) {
		c.errorf(e.Range(), "Invalid step name", fmt.Sprintf("%q already means something in expressions; name the step otherwise.", name))
		return "", false
	}
	return name, true
}

// StepNames lists the names of a sequence's steps, in order.
func StepNames(steps []Step) []string {
	names := make([]string, len(steps))
	for i, s := range steps {
		names[i] = s.Name
	}
	return names
}
