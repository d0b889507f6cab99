package expr

import (
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// tuple compiles [a, b, c].
func (c *compiler) tuple(e *hclsyntax.TupleConsExpr) *node {
	n := c.newNode(e)
	n.typ = tList
	elems := make([]*node, len(e.Exprs))
	for i, x := range e.Exprs {
		elems[i] = c.expr(x)
	}
	n.eval = func(env *Env) (Value, *EvalError) {
		out := make([]any, len(elems))
		for i, el := range elems {
			v, err := el.eval(env)
			if err != nil {
				return Value{}, err
			}
			out[i] = v.Interface()
		}
		return listVal(out), nil
	}
	return n
}

// object compiles { a = 1, (msg.k) = 2 }. Keys convert to strings; a later
// duplicate key wins, as in HCL's native syntax.
func (c *compiler) object(e *hclsyntax.ObjectConsExpr) *node {
	n := c.newNode(e)
	n.typ = tObject
	keys := make([]*node, len(e.Items))
	vals := make([]*node, len(e.Items))
	for i, it := range e.Items {
		keys[i] = c.expr(it.KeyExpr)
		vals[i] = c.expr(it.ValueExpr)
		if k := keys[i]; k.isConst && (k.val.k == Null || k.val.k == List || k.val.k == Object) {
			c.diags = append(c.diags, errorDiag(k.rng, "Incorrect key type", "Can't use "+describe(k.val)+" as a key."))
		}
	}
	n.eval = func(env *Env) (Value, *EvalError) {
		out := make(map[string]any, len(keys))
		for i, kn := range keys {
			kv, err := kn.eval(env)
			if err != nil {
				return Value{}, err
			}
			v, err := vals[i].eval(env)
			if err != nil {
				return Value{}, err
			}
			k, msg := kv.asString()
			if msg != "" {
				return Value{}, kn.failf("can't use %s as an object key", describe(kv))
			}
			out[k] = v.Interface()
		}
		return objVal(out), nil
	}
	return n
}

// objectKey compiles an object key: a bare name is a literal string, as in
// hclsyntax; (expr) or "string" are expressions.
func (c *compiler) objectKey(e *hclsyntax.ObjectConsKeyExpr) *node {
	if !e.ForceNonLiteral {
		if t, ok := e.Wrapped.(*hclsyntax.ScopeTraversalExpr); ok && len(t.Traversal) > 1 {
			c.diags = append(c.diags, errorDiag(e.Range(), "Ambiguous attribute key",
				"If this expression is intended to be a reference, wrap it in parentheses. If it's instead intended as a literal name containing periods, wrap it in quotes to create a string literal."))
			return c.broken(c.newNode(e))
		}
		if name := hcl.ExprAsKeyword(e.Wrapped); name != "" {
			return constNode(c.newNode(e), strVal(name))
		}
	}
	return c.expr(e.Wrapped)
}

// forExpr compiles [for k, v in coll: val if cond] and
// {for k, v in coll: key => val if cond} (with ... grouping). Lists bind
// k to the index, objects iterate in key order, like cty.
func (c *compiler) forExpr(e *hclsyntax.ForExpr) *node {
	n := c.newNode(e)
	coll := c.expr(e.CollExpr)
	keySlot, valSlot := -1, c.newSlot()
	if e.KeyVar != "" {
		keySlot = c.newSlot()
	}
	mark := len(c.locals)
	if e.KeyVar != "" {
		c.locals = append(c.locals, local{e.KeyVar, keySlot})
	}
	c.locals = append(c.locals, local{e.ValVar, valSlot})
	var keyN, condN *node
	valN := c.expr(e.ValExpr)
	if e.KeyExpr != nil {
		keyN = c.expr(e.KeyExpr)
	}
	if e.CondExpr != nil {
		condN = c.expr(e.CondExpr)
		if condN.isConst && condN.val.k == Null {
			c.diags = append(c.diags, errorDiag(condN.rng, "Condition is null", "The value of the 'if' clause must not be null."))
		}
	}
	c.locals = c.locals[:mark]

	// each binds the variables for one element and reports whether the
	// element passes the 'if' clause.
	each := func(env *Env, k, v Value) (bool, *EvalError) {
		if keySlot >= 0 {
			env.locals[keySlot] = k
		}
		env.locals[valSlot] = v
		if condN == nil {
			return true, nil
		}
		cv, err := condN.eval(env)
		if err != nil {
			return false, err
		}
		b, msg := toBool(cv)
		if msg != "" {
			if cv.k == Null {
				return false, condN.failf("the value of the 'if' clause must not be null")
			}
			return false, condN.failf("the 'if' clause must be a bool, but it is %s", describe(cv))
		}
		return b, nil
	}
	// iterate calls f for every element of the collection.
	iterate := func(env *Env, f func(k, v Value) *EvalError) *EvalError {
		cv, err := coll.eval(env)
		if err != nil {
			return err
		}
		switch cv.k {
		case List:
			for i, x := range cv.list() {
				if err := f(numVal(float64(i)), ValueOf(x)); err != nil {
					return err
				}
			}
			return nil
		case Object:
			m := cv.object()
			ks := make([]string, 0, len(m))
			for k := range m {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			for _, k := range ks {
				if err := f(strVal(k), ValueOf(m[k])); err != nil {
					return err
				}
			}
			return nil
		case Null:
			return coll.failf("a null value cannot be used as the collection in a 'for' expression")
		}
		return coll.failf("%s cannot be used as the collection in a 'for' expression", describe(cv))
	}

	if keyN == nil {
		n.typ = tList
		n.eval = func(env *Env) (Value, *EvalError) {
			out := []any{}
			err := iterate(env, func(k, v Value) *EvalError {
				ok, err := each(env, k, v)
				if err != nil || !ok {
					return err
				}
				r, err := valN.eval(env)
				if err != nil {
					return err
				}
				out = append(out, r.Interface())
				return nil
			})
			if err != nil {
				return Value{}, err
			}
			return listVal(out), nil
		}
		return n
	}
	n.typ = tObject
	group := e.Group
	n.eval = func(env *Env) (Value, *EvalError) {
		out := map[string]any{}
		err := iterate(env, func(k, v Value) *EvalError {
			ok, err := each(env, k, v)
			if err != nil || !ok {
				return err
			}
			kv, err := keyN.eval(env)
			if err != nil {
				return err
			}
			key, msg := kv.asString()
			if msg != "" {
				if kv.k == Null {
					return keyN.failf("the key expression in a 'for' expression must not produce null")
				}
				return keyN.failf("the key expression produced %s, which can't be an object key", describe(kv))
			}
			r, err := valN.eval(env)
			if err != nil {
				return err
			}
			if group {
				g, _ := out[key].([]any)
				out[key] = append(g, r.Interface())
				return nil
			}
			if _, dup := out[key]; dup {
				return keyN.failf("two elements produced the key %q in this 'for' expression; add ... after the value to group them", key)
			}
			out[key] = r.Interface()
			return nil
		})
		if err != nil {
			return Value{}, err
		}
		return objVal(out), nil
	}
	return n
}
