package expr

import (
	"math"
	"strconv"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// step is one compiled traversal step: .name or [key] with a constant key.
type step struct {
	attr bool
	name string // attribute name
	key  Value  // index key
	rng  hcl.Range
	path string // source of the traversal up to this step, for errors
	prev string // the same without this step
}

// steps compiles the steps of a traversal whose first step (the root or
// the relative source) prints as prefix.
func (c *compiler) steps(t hcl.Traversal, prefix string, start hcl.Range) []step {
	out := make([]step, 0, len(t))
	path := prefix
	for _, tr := range t {
		s := step{rng: hcl.RangeBetween(start, tr.SourceRange()), prev: path}
		switch tr := tr.(type) {
		case hcl.TraverseAttr:
			s.attr, s.name = true, tr.Name
			path += "." + tr.Name
		case hcl.TraverseIndex:
			s.key = fromCty(tr.Key)
			path += "[" + s.key.String() + "]"
		case hcl.TraverseSplat:
			// hclsyntax turns splats into SplatExpr; a traversal built by
			// hand could still contain one.
			c.diags = append(c.diags, errorDiag(tr.SrcRange, "Unsupported splat", "A splat step inside a plain traversal is not supported here; use [*]."))
			continue
		default:
			continue
		}
		s.path = path
		out = append(out, s)
	}
	return out
}

// traverse applies steps to v.
func (n *node) traverse(v Value, steps []step) (Value, *EvalError) {
	for i := range steps {
		s := &steps[i]
		var msg string
		if s.attr {
			v, msg = getAttr(v, s.name, s.prev)
		} else {
			v, msg = index(v, s.key, s.prev)
		}
		if msg != "" {
			return Value{}, &EvalError{Range: s.rng, Expr: s.path, Message: msg}
		}
	}
	return v, nil
}

func (c *compiler) scopeTraversal(e *hclsyntax.ScopeTraversalExpr) *node {
	n := c.newNode(e)
	root := e.Traversal.RootName()
	rootRange := e.Traversal[0].SourceRange()
	steps := c.steps(e.Traversal[1:], root, rootRange)
	if c.bad[rootRange.Start] {
		return c.broken(n)
	}
	if slot := c.lookupLocal(root); slot >= 0 {
		n.eval = func(env *Env) (Value, *EvalError) {
			return n.traverse(env.locals[slot], steps)
		}
		return n
	}
	switch root {
	case "msg":
		c.readsMsg(steps)
		if c.scope.Msg != nil {
			if n.shape = c.shapeTraversal(steps); n.shape != nil {
				n.typ, _ = n.shape.only()
			}
		}
		if len(steps) == 1 && steps[0].attr {
			// The most common shape, msg.field, without the loop.
			s := &steps[0]
			n.field = s.name
			n.eval = func(env *Env) (Value, *EvalError) {
				if m, ok := env.Msg.(map[string]any); ok {
					if x, ok := m[s.name]; ok {
						return ValueOf(x), nil
					}
				}
				return n.traverse(ValueOf(env.Msg), steps)
			}
			return n
		}
		n.eval = func(env *Env) (Value, *EvalError) {
			return n.traverse(ValueOf(env.Msg), steps)
		}
	case "index":
		n.eval = func(env *Env) (Value, *EvalError) {
			return n.traverse(intVal(env.Index), steps)
		}
	default:
		n.eval = func(env *Env) (Value, *EvalError) {
			x, ok := env.Vars[root]
			if !ok {
				return Value{}, &EvalError{Range: rootRange, Expr: root, Message: "no value was given for " + root}
			}
			if x == nil {
				// A root other than msg that is null is absent as a whole, and so are its fields:
				// a join's unmatched side.
				return Value{}, nil
			}
			return n.traverse(ValueOf(x), steps)
		}
	}
	return n
}

// readsMsg records the top-level field a traversal of msg reads (Program.Fields).
func (c *compiler) readsMsg(steps []step) {
	name, ok := "", false
	switch {
	case len(steps) > 0 && steps[0].attr:
		name, ok = steps[0].name, true
	case len(steps) > 0 && steps[0].key.k == String:
		name, ok = steps[0].key.s, true
	}
	if !ok {
		c.wholeMsg = true
		return
	}
	if c.fields == nil {
		c.fields = map[string]bool{}
	}
	c.fields[name] = true
}

func (c *compiler) relativeTraversal(e *hclsyntax.RelativeTraversalExpr) *node {
	n := c.newNode(e)
	src := c.expr(e.Source)
	steps := c.steps(e.Traversal, src.src, e.Source.Range())
	n.eval = func(env *Env) (Value, *EvalError) {
		v, err := src.eval(env)
		if err != nil {
			return Value{}, err
		}
		return n.traverse(v, steps)
	}
	return n
}

func (c *compiler) index(e *hclsyntax.IndexExpr) *node {
	n := c.newNode(e)
	coll := c.expr(e.Collection)
	key := c.expr(e.Key)
	if key.isConst && key.val.k == Null {
		c.diags = append(c.diags, errorDiag(e.Key.Range(), "Invalid index", "Can't use a null value as an indexing key."))
	}
	n.eval = func(env *Env) (Value, *EvalError) {
		cv, err := coll.eval(env)
		if err != nil {
			return Value{}, err
		}
		kv, err := key.eval(env)
		if err != nil {
			return Value{}, err
		}
		v, msg := index(cv, kv, coll.src)
		if msg != "" {
			return Value{}, n.failf("%s", msg)
		}
		return v, nil
	}
	return n
}

// getAttr is HCL's attribute access (hcl.GetAttr) on a JSON value. what is
// the source of the value, for the message.
func getAttr(v Value, name, what string) (Value, string) {
	switch v.k {
	case Object:
		x, ok := v.object()[name]
		if !ok {
			return Value{}, what + " has no field " + strconv.Quote(name)
		}
		return ValueOf(x), ""
	case Null:
		return Value{}, what + " is null, so it has no field " + strconv.Quote(name)
	case List:
		return Value{}, what + " is a list, not an object, so it has no field " + strconv.Quote(name) +
			"; use an index (" + what + "[0]." + name + ") or a splat (" + what + "[*]." + name + ")"
	}
	return Value{}, what + " is a " + v.k.String() + ", not an object, so it has no field " + strconv.Quote(name)
}

// index is HCL's index operator (hcl.Index) on a JSON value: lists take
// whole-number keys (strings convert), objects take string keys (numbers
// and bools convert).
func index(coll, key Value, what string) (Value, string) {
	if coll.k == Null {
		return Value{}, what + " is null, so it has no elements"
	}
	if key.k == Null {
		return Value{}, "can't use a null value as an index"
	}
	switch coll.k {
	case List:
		f, msg := toNumber(key)
		if msg != "" {
			return Value{}, "invalid index for " + what + ": " + msg
		}
		l := coll.list()
		switch {
		case f != math.Trunc(f) || math.IsInf(f, 0):
			return Value{}, "invalid index for " + what + ": a list index must be a whole number"
		case f < 0:
			return Value{}, "invalid index for " + what + ": a negative number is not a valid index"
		case f >= float64(len(l)):
			return Value{}, what + " has no element " + formatNumber(numVal(f)) + " (it has " + strconv.Itoa(len(l)) + ")"
		}
		return ValueOf(l[int(f)]), ""
	case Object:
		k, msg := key.asString()
		if msg != "" {
			return Value{}, "invalid key for " + what + ": " + msg
		}
		x, ok := coll.object()[k]
		if !ok {
			return Value{}, what + " has no field " + strconv.Quote(k)
		}
		return ValueOf(x), ""
	}
	return Value{}, what + " is a " + coll.k.String() + ", which has no elements"
}

// splat compiles source[*].each: each element of a list (or the value
// itself when it is not a list, or nothing when it is null) is bound to the
// splat's anonymous symbol while 'each' is evaluated.
func (c *compiler) splat(e *hclsyntax.SplatExpr) *node {
	n := c.newNode(e)
	n.typ = tList
	src := c.expr(e.Source)
	slot := c.newSlot()
	c.anon[e.Item] = slot
	each := c.expr(e.Each)
	delete(c.anon, e.Item)
	n.eval = func(env *Env) (Value, *EvalError) {
		sv, err := src.eval(env)
		if err != nil {
			return Value{}, err
		}
		var items []any
		switch sv.k {
		case Null:
			return listVal([]any{}), nil
		case List:
			items = sv.list()
		default:
			env.locals[slot] = sv
			v, err := each.eval(env)
			if err != nil {
				return Value{}, err
			}
			return listVal([]any{v.Interface()}), nil
		}
		out := make([]any, len(items))
		for i, it := range items {
			env.locals[slot] = ValueOf(it)
			v, err := each.eval(env)
			if err != nil {
				return Value{}, err
			}
			out[i] = v.Interface()
		}
		return listVal(out), nil
	}
	return n
}

func (c *compiler) anonSymbol(e *hclsyntax.AnonSymbolExpr) *node {
	n := c.newNode(e)
	slot, ok := c.anon[e]
	if !ok {
		c.diags = append(c.diags, errorDiag(e.SrcRange, "Invalid splat", "A splat item used outside of its splat expression."))
		return c.broken(n)
	}
	n.eval = func(env *Env) (Value, *EvalError) { return env.locals[slot], nil }
	return n
}
