package flow

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

var localsSpec = &BlockSpec{
	Type:     "locals",
	FreeForm: true,
	Doc: "Names values computed once at compile time, read as local.NAME. A local may use variables, " +
		"other locals (in any order, without cycles), path.pipeline, path.cwd and functions. Any number " +
		"of locals blocks may appear.",
}

// compileLocals evaluates every local value in dependency order and returns them as the local object.
// A local that fails to evaluate becomes unknown, so that its users are not reported a second time.
func (c *compiler) compileLocals() cty.Value {
	byName := map[string]*hcl.Attribute{}
	for _, a := range c.cfg.Locals {
		byName[a.Name] = a
	}
	values := map[string]cty.Value{}
	state := map[string]int{} // 0: not yet, 1: in progress, 2: done
	var stack []string

	var eval func(a *hcl.Attribute)
	eval = func(a *hcl.Attribute) {
		switch state[a.Name] {
		case 2:
			return
		case 1:
			cycle := append(stack[indexOf(stack, a.Name):], a.Name)
			c.errorf(a.NameRange, "Cycle in local values",
				fmt.Sprintf("The local values refer to each other in a cycle: %s.", "local."+strings.Join(cycle, " → local.")))
			values[a.Name] = cty.DynamicVal
			return
		}
		state[a.Name] = 1
		stack = append(stack, a.Name)
		for _, t := range a.Expr.Variables() {
			if t.RootName() != "local" || len(t) < 2 {
				continue
			}
			if step, ok := t[1].(hcl.TraverseAttr); ok {
				if dep, ok := byName[step.Name]; ok {
					eval(dep)
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[a.Name] = 2
		if _, done := values[a.Name]; done {
			return // part of a reported cycle
		}
		c.ctx.Variables["local"] = cty.ObjectVal(values)
		if !c.checkConstantRefs(a.Expr) {
			values[a.Name] = cty.DynamicVal
			return
		}
		v, diags := a.Expr.Value(c.ctx)
		c.diags = append(c.diags, diags...)
		if diags.HasErrors() {
			v = cty.DynamicVal
		}
		values[a.Name] = v
	}
	for _, a := range c.cfg.Locals {
		eval(a)
	}
	return cty.ObjectVal(values)
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return 0
}
