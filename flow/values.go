package flow

import (
	"fmt"
	"math/big"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/flowrun/flowrun/flow/expr"
)

// decodeAttributes evaluates a block's attributes by their declarations: constants are evaluated and
// checked against their type and constraints, per-message expressions are compiled, references are
// resolved, and defaults fill in what is absent. Attributes that fail are left out (and marked
// refused, see Attrs.refused), so that the caller can go on and report every error of the pipeline
// at once.
func (c *compiler) decodeAttributes(specs []Attribute, attrs hcl.Attributes) Attrs {
	out := Attrs{declared: make(map[string]Type, len(specs))}
	for _, spec := range specs {
		out.declared[spec.Name] = spec.Type
		a, ok := attrs[spec.Name]
		if !ok {
			if spec.Default != nil {
				out.set(spec.Name, spec.Default)
			}
			continue
		}
		if spec.RootsFrom != "" {
			steps, _ := out.values[spec.RootsFrom].([]Step)
			spec.Roots = StepNames(steps)
		}
		v, ok := c.decodeValue(spec, a)
		switch {
		case !ok:
			if out.refused == nil {
				out.refused = map[string]bool{}
			}
			out.refused[spec.Name] = true
		case v != nil:
			out.set(spec.Name, v)
		case spec.Default != nil:
			out.set(spec.Name, spec.Default) // null means unset
		}
	}
	return out
}

// decodeNested decodes a block's nested blocks into attrs, each nested block's attributes by its own
// declaration.
func (c *compiler) decodeNested(out *Attrs, b *Block) {
	for _, nb := range b.Blocks {
		out.addBlock(nb.Type, c.decodeAttributes(nb.Spec.Attributes, nb.Attributes))
	}
}

// decodeValue evaluates one attribute. It returns false when the attribute has an error (reported),
// and a nil value for null, which means the attribute is unset.
func (c *compiler) decodeValue(spec Attribute, a *hcl.Attribute) (any, bool) {
	switch spec.Type {
	case TypeMessageExpr, TypeMessageBool:
		p, diags := expr.Compile(a.Expr, c.attributeScope(spec))
		c.diags = append(c.diags, diags...)
		if diags.HasErrors() || spec.Type == TypeMessageBool && !c.checkCondition(spec, p) {
			return nil, false
		}
		return p, true
	case TypeMessageFields:
		return c.decodeFields(spec, a)
	case TypeAggregates:
		return c.decodeAggregates(spec, a)
	case TypeSequence:
		return c.decodeSequence(spec, a)
	case TypeTopicRef, TypeInputRef:
		t := c.resolveTopic(a.Expr, spec.Name, spec.Type == TypeInputRef)
		return t, t != nil
	case TypeTopicOrChoice:
		if _, diags := hcl.AbsTraversalForExpr(a.Expr); !diags.HasErrors() {
			t := c.resolveTopic(a.Expr, spec.Name, false)
			return t, t != nil
		}
		v, ok := c.evalConstant(a.Expr)
		if !ok {
			return nil, false
		}
		s, ok := c.convertConstant(v, cty.String, spec, a.Expr.Range())
		if !ok {
			return nil, false
		}
		return c.checkEnum(s.AsString(), spec, a.Expr.Range())
	case TypeTableRef:
		t := c.resolveTable(a.Expr, spec.Name)
		return t, t != nil
	case TypeRetryRef:
		return c.resolveRetry(a.Expr)
	case TypeTypeConstraint:
		ty, diags := typeexpr.TypeConstraint(a.Expr)
		c.diags = append(c.diags, diags...)
		return ty, !diags.HasErrors()
	}

	v, ok := c.evalConstant(a.Expr)
	if !ok {
		return nil, false
	}
	if v.IsNull() {
		return nil, true
	}
	rng := a.Expr.Range()
	switch spec.Type {
	case TypeAny:
		return v, true
	case TypeString:
		s, ok := c.convertConstant(v, cty.String, spec, rng)
		if !ok {
			return nil, false
		}
		return c.checkEnum(s.AsString(), spec, rng)
	case TypeBool:
		v, ok := c.convertConstant(v, cty.Bool, spec, rng)
		return ok && v.True(), ok
	case TypeNumber, TypeInteger:
		return c.decodeNumber(v, spec, rng)
	case TypeDuration:
		s, ok := c.convertConstant(v, cty.String, spec, rng)
		if !ok {
			return nil, false
		}
		d, err := ParseDuration(s.AsString())
		if err != nil {
			c.errorf(rng, "Invalid duration", fmt.Sprintf("%s: %s.", spec.Name, err))
			return nil, false
		}
		return d, true
	case TypeSize:
		return c.decodeSize(v, spec, rng)
	case TypeStringList:
		l, ok := c.convertConstant(v, cty.List(cty.String), spec, rng)
		if !ok {
			return nil, false
		}
		var out []string
		for _, e := range l.AsValueSlice() {
			if e.IsNull() {
				c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name), "The list must not hold null.")
				return nil, false
			}
			out = append(out, e.AsString())
		}
		return out, true
	case TypeStringMap:
		m, ok := c.convertConstant(v, cty.Map(cty.String), spec, rng)
		if !ok {
			return nil, false
		}
		out := map[string]string{}
		for k, e := range m.AsValueMap() {
			if e.IsNull() {
				c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name), fmt.Sprintf("The entry %q must not be null.", k))
				return nil, false
			}
			out[k] = e.AsString()
		}
		return out, true
	}
	panic(fmt.Sprintf("flow: attribute %s has undecodable type %d", spec.Name, spec.Type))
}

// evalConstant evaluates a config-time expression. Unknown results stand for values whose errors were
// already reported (an invalid variable, say), so they count as failures without a new message.
func (c *compiler) evalConstant(e hcl.Expression) (cty.Value, bool) {
	if !c.checkConstantRefs(e) {
		return cty.NilVal, false
	}
	v, diags := e.Value(c.ctx)
	c.diags = append(c.diags, diags...)
	if diags.HasErrors() || !v.IsWhollyKnown() {
		return cty.NilVal, false
	}
	return v, true
}

// convertConstant converts a value to the attribute's type or reports why it cannot.
func (c *compiler) convertConstant(v cty.Value, ty cty.Type, spec Attribute, rng hcl.Range) (cty.Value, bool) {
	out, err := convert.Convert(v, ty)
	if err != nil {
		c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name),
			fmt.Sprintf("%s takes %s: %s.", spec.Name, spec.Type.Describe(), err))
		return cty.NilVal, false
	}
	if out.IsNull() {
		return cty.NilVal, false
	}
	return out, true
}

// checkEnum accepts a string attribute's value if it is one of the allowed values.
func (c *compiler) checkEnum(s string, spec Attribute, rng hcl.Range) (any, bool) {
	if len(spec.Enum) == 0 || contains(spec.Enum, s) {
		return s, true
	}
	c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name),
		fmt.Sprintf("%q is not a valid %s.%s The values are %s.", s, spec.Name, DidYouMean(s, spec.Enum), QuotedList(spec.Enum)))
	return nil, false
}

// decodeNumber checks a number against the attribute's bounds and, for integers, wholeness.
func (c *compiler) decodeNumber(v cty.Value, spec Attribute, rng hcl.Range) (any, bool) {
	n, ok := c.convertConstant(v, cty.Number, spec, rng)
	if !ok {
		return nil, false
	}
	bf := n.AsBigFloat()
	f, _ := bf.Float64()
	if spec.Min != nil && f < *spec.Min {
		c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name),
			fmt.Sprintf("%s must be at least %s; it is %s.", spec.Name, formatBound(*spec.Min), bf.Text('g', -1)))
		return nil, false
	}
	if spec.Max != nil && f > *spec.Max {
		c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name),
			fmt.Sprintf("%s must be at most %s; it is %s.", spec.Name, formatBound(*spec.Max), bf.Text('g', -1)))
		return nil, false
	}
	if spec.Type == TypeNumber {
		return f, true
	}
	i, acc := bf.Int64()
	if !bf.IsInt() || acc != big.Exact {
		c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name),
			fmt.Sprintf("%s must be a whole number; it is %s.", spec.Name, bf.Text('g', -1)))
		return nil, false
	}
	return i, true
}

// decodeSize parses a size and checks it against the attribute's bounds, in bytes.
func (c *compiler) decodeSize(v cty.Value, spec Attribute, rng hcl.Range) (any, bool) {
	s, ok := c.convertConstant(v, cty.String, spec, rng)
	if !ok {
		return nil, false
	}
	if contains(spec.Enum, s.AsString()) {
		return Size(0), true // a word such as "off" that a size attribute accepts for none
	}
	size, err := ParseSize(s.AsString())
	if err != nil {
		if len(spec.Enum) > 0 {
			err = fmt.Errorf("%w (or %s)", err, QuotedList(spec.Enum))
		}
		c.errorf(rng, "Invalid size", fmt.Sprintf("%s: %s", spec.Name, strings.TrimSuffix(err.Error(), ".")+"."))
		return nil, false
	}
	if spec.Min != nil && float64(size) < *spec.Min {
		c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name),
			fmt.Sprintf("%s must be at least %s; it is %s.", spec.Name, FormatSize(Size(*spec.Min)), s.AsString()))
		return nil, false
	}
	if spec.Max != nil && float64(size) > *spec.Max {
		c.errorf(rng, fmt.Sprintf("Invalid value for %s", spec.Name),
			fmt.Sprintf("%s must be at most %s; it is %s.", spec.Name, FormatSize(Size(*spec.Max)), s.AsString()))
		return nil, false
	}
	return size, true
}

// checkCondition reports a where or when that can never be true or false: a constant that does
// not convert to a bool, or an expression whose result is always a number, a string, a list, an
// object or null. Every message would fail on it. A string result converts only when it is
// exactly "true" or "false", which a computed one (upper(msg.x)) is by accident if ever, so that is
// refused too; a field of the message (msg.flag) may hold anything, and passes.
func (c *compiler) checkCondition(spec Attribute, p *expr.Program) bool {
	src := p.String()
	var detail string
	if v, ok := p.Constant(); ok {
		if _, err := p.EvalBool(nil); err == nil {
			return true // true, or a string such as "true"
		}
		switch v.Kind() {
		case expr.String:
			detail = fmt.Sprintf("%s is the string %s, which is not a bool: only the strings \"true\" and \"false\" convert to one.", spec.Name, src)
		case expr.Null:
			detail = fmt.Sprintf("%s is null; it must be true or false.", spec.Name)
		default:
			detail = fmt.Sprintf("%s is always the %s %s; it must be true or false.", spec.Name, v.Kind(), src)
		}
	} else {
		kind, ok := p.StaticKind()
		if !ok || kind == expr.Bool {
			return true
		}
		article := "a"
		if kind == expr.Object {
			article = "an"
		}
		detail = fmt.Sprintf("%s must be true or false, but %s is always %s %s.", spec.Name, src, article, kind)
		switch kind {
		case expr.Number:
			detail += fmt.Sprintf(" Compare it, such as %s > 0.", src)
		case expr.String:
			detail += fmt.Sprintf(" Only the strings \"true\" and \"false\" convert to a bool; compare it instead, such as %s == \"yes\".", src)
		case expr.List:
			detail += fmt.Sprintf(" Test it, such as length(%s) > 0.", src)
		case expr.Object:
			detail += " Test one of its fields instead."
		case expr.Null:
			detail = fmt.Sprintf("%s must be true or false, but %s is always null.", spec.Name, src)
		}
	}
	c.errorf(p.Range(), "Condition is not a bool", detail)
	return false
}

// decodeFields compiles an object of per-message expressions, such as a map stage's set, keeping the
// order in which the fields are written.
func (c *compiler) decodeFields(spec Attribute, a *hcl.Attribute) ([]Field, bool) {
	var fields []Field
	ok := c.eachField(spec, a, "an object of expressions, such as { total = msg.amount * 2 }", func(name string, value hcl.Expression) bool {
		p, diags := expr.Compile(value, c.attributeScope(spec))
		c.diags = append(c.diags, diags...)
		if diags.HasErrors() {
			return false
		}
		fields = append(fields, Field{Name: name, Expr: p})
		return true
	})
	return fields, ok
}

// eachField calls each with every field of an object attribute, once its name is checked (a bare
// name or a constant string, not set twice). It reports whether the attribute is an object and
// every name and call was without error; what is wrong is reported.
func (c *compiler) eachField(spec Attribute, a *hcl.Attribute, takes string, each func(name string, value hcl.Expression) bool) bool {
	pairs, diags := hcl.ExprMap(a.Expr)
	if diags.HasErrors() {
		c.errorf(a.Expr.Range(), fmt.Sprintf("Invalid value for %s", spec.Name), fmt.Sprintf("%s takes %s.", spec.Name, takes))
		return false
	}
	seen := map[string]hcl.Range{}
	ok := true
	for _, kv := range pairs {
		name, nameOK := c.fieldName(kv.Key)
		if !nameOK {
			ok = false
			continue
		}
		if prev, dup := seen[name]; dup {
			c.errorf(kv.Key.Range(), "Duplicate field", fmt.Sprintf("The field %q is already set at %s.", name, prev))
			ok = false
			continue
		}
		seen[name] = kv.Key.Range()
		ok = each(name, kv.Value) && ok
	}
	return ok
}

// decodeAggregates decodes an object of aggregate calls: each field is one of AggregateFuncs applied
// to a per-message expression (none for count; top_k's second argument is a constant count, max_by's
// and min_by's a second per-message expression, BY).
func (c *compiler) decodeAggregates(spec Attribute, a *hcl.Attribute) ([]Aggregate, bool) {
	funcs := sortedKeys(AggregateFuncs)
	var out []Aggregate
	ok := c.eachField(spec, a, "an object of aggregate calls, such as { orders = count(), revenue = sum(msg.amount) }", func(name string, value hcl.Expression) bool {
		call, isCall := value.(*hclsyntax.FunctionCallExpr)
		if !isCall {
			c.errorf(value.Range(), "Not an aggregate call",
				fmt.Sprintf("%s.%s must call one of %s, such as sum(msg.amount).", spec.Name, name, QuotedList(funcs)))
			return false
		}
		arity, known := AggregateFuncs[call.Name]
		if !known {
			c.errorf(call.NameRange, "Unknown aggregate function",
				fmt.Sprintf("There is no aggregate function %q.%s The functions are %s.", call.Name, DidYouMean(call.Name, funcs), QuotedList(funcs)))
			return false
		}
		if len(call.Args) != arity {
			c.errorf(call.Range(), "Wrong number of arguments",
				fmt.Sprintf("%s takes %d argument%s, not %d.%s", call.Name, arity, plural(arity), len(call.Args), aggregateUsage[call.Name]))
			return false
		}
		agg := Aggregate{Name: name, Func: call.Name}
		if arity > 0 {
			p, diags := expr.Compile(call.Args[0], c.attributeScope(spec))
			c.diags = append(c.diags, diags...)
			if diags.HasErrors() {
				return false
			}
			agg.Arg = p
		}
		if arity == 2 && !aggregateCountArg[call.Name] {
			p, diags := expr.Compile(call.Args[1], c.attributeScope(spec))
			c.diags = append(c.diags, diags...)
			if diags.HasErrors() {
				return false
			}
			agg.By = p
		} else if arity == 2 {
			v, vOK := c.evalConstant(call.Args[1])
			if !vOK {
				return false
			}
			k, kOK := c.convertConstant(v, cty.Number, spec, call.Args[1].Range())
			if !kOK {
				return false
			}
			n, exact := k.AsBigFloat().Int64()
			if exact != big.Exact || n <= 0 {
				c.errorf(call.Args[1].Range(), "Invalid count", "top_k's count must be a positive whole number, such as 3.")
				return false
			}
			agg.K = int(n)
		}
		out = append(out, agg)
		return true
	})
	if ok && len(out) == 0 {
		c.errorf(a.Expr.Range(), fmt.Sprintf("Invalid value for %s", spec.Name), fmt.Sprintf("%s needs at least one field, such as { orders = count() }.", spec.Name))
		return nil, false
	}
	return out, ok
}

// fieldName evaluates an object key, which is a bare name or a constant string.
func (c *compiler) fieldName(e hcl.Expression) (string, bool) {
	if kw := hcl.ExprAsKeyword(e); kw != "" {
		return kw, true
	}
	v, ok := c.evalConstant(e)
	if !ok {
		return "", false
	}
	s, err := convert.Convert(v, cty.String)
	if err != nil || s.IsNull() || s.AsString() == "" {
		c.errorf(e.Range(), "Invalid field name", "A field name is a name or a non-empty string.")
		return "", false
	}
	return s.AsString(), true
}

// Describe words a type for error messages and docs: "a string", "a whole number", ...
func (t Type) Describe() string {
	switch t {
	case TypeString:
		return "a string"
	case TypeNumber:
		return "a number"
	case TypeInteger:
		return "a whole number"
	case TypeBool:
		return "true or false"
	case TypeDuration:
		return `a duration such as "250ms", "30s", "5m" or "1h"`
	case TypeSize:
		return `a size such as "512KiB", "64MiB" or "1GB"`
	case TypeStringList:
		return "a list of strings"
	case TypeStringMap:
		return "a map of strings"
	case TypeMessageExpr:
		return "a per-message expression"
	case TypeMessageBool:
		return "a per-message condition"
	case TypeMessageFields:
		return "an object of per-message expressions"
	case TypeTopicRef:
		return "a topic reference"
	case TypeTopicOrChoice:
		return "a topic reference or a word"
	case TypeAggregates:
		return "an object of aggregate calls"
	case TypeSequence:
		return "a list of steps, each { name, where }"
	case TypeInputRef:
		return "a topic or stage reference"
	case TypeRetryRef:
		return "a retry reference"
	case TypeTableRef:
		return "a table reference"
	case TypeTypeConstraint:
		return "a type"
	case TypeReference:
		return "a reference"
	case TypeMessages:
		return "a list of messages"
	case TypeIntegerList:
		return "a list of whole numbers"
	case TypeMessageObject:
		return "a message expression"
	case TypeMessageExprList:
		return "a list of message expressions"
	case TypeCondition:
		return "a condition"
	}
	return "a value"
}

func formatBound(f float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%f", f), "0"), ".")
}
