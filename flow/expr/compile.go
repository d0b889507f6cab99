package expr

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/agext/levenshtein"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
)

// Scope says what an expression may reference.
type Scope struct {
	// Roots are the per-message root variables allowed in this attribute,
	// e.g. []string{"msg"} or []string{"index"}. "msg" reads Env.Msg,
	// "index" reads Env.Index and any other root reads Env.Vars[root].
	Roots []string
	// Constants are config-time values folded at compile time, by root
	// name: "var" and "local" (cty objects).
	Constants map[string]cty.Value
	// Functions is the full function table (config-time and per-message),
	// e.g. Functions() plus the caller's env()/file().
	Functions map[string]function.Function
	// Deterministic refuses the functions whose value changes from call to call (timestamp, uuid):
	// a stateful stage's expressions must give the same value on every attempt at a message.
	Deterministic bool
	// Source optionally holds the bytes of the file the expression was
	// parsed from. When set, Program.String and EvalError.Expr quote the
	// exact source text instead of a reconstruction.
	Source []byte
	// Msg, when set, is what is known of the messages msg reads (their topic's schema): Compile
	// then reports fields they cannot have and operations their kinds cannot take (shape.go).
	Msg *Shape
}

// Env is what one evaluation sees. An Env may be reused across messages
// (it keeps a little scratch space for 'for' expressions), but not by two
// goroutines at once.
type Env struct {
	Msg   any   // the decoded message (usually map[string]any)
	Index int64 // the message number, for generator templates
	// Vars holds the values of roots other than "msg" and "index". Such a root whose value is nil
	// is null, and so is every field of it (a join's unmatched side: right.ts is null).
	Vars map[string]any

	locals []Value // for-expression and splat variables, by slot
}

// Program is a compiled expression. It is immutable and safe for concurrent
// use with distinct Envs.
type Program struct {
	root  *node
	slots int
	// fields are the top-level message fields the expression reads (msg.NAME, msg["NAME"]);
	// wholeMsg says that it reads the message in other ways too (msg itself, msg[key]).
	fields   []string
	wholeMsg bool
}

// knownRoots are the per-message roots that some attribute offers; naming
// one where it is not allowed gets a specific diagnostic.
var knownRoots = []string{"msg", "index"}

// evalFn evaluates one compiled sub-expression.
type evalFn func(env *Env) (Value, *EvalError)

// node is one compiled sub-expression.
type node struct {
	eval evalFn
	typ  styp      // what static analysis knows about the result
	rng  hcl.Range // for errors
	src  string    // source text, for errors

	isConst bool
	val     Value // the folded value when isConst

	shape *Shape // what Scope.Msg says of the value a traversal of msg reads; nil elsewhere

	// field is the top-level field of the message that a node of msg.field reads; "" elsewhere.
	field string
}

// styp is the static type of a node: a Kind when known, or tAny.
type styp uint8

const (
	tAny styp = iota
	tNull
	tBool
	tNumber
	tString
	tList
	tObject
)

func stypOf(k Kind) styp {
	switch k {
	case Bool:
		return tBool
	case Number:
		return tNumber
	case String:
		return tString
	case List:
		return tList
	case Object:
		return tObject
	}
	return tNull
}

func (t styp) String() string {
	return [...]string{"any", "null", "bool", "number", "string", "list", "object"}[t]
}

type compiler struct {
	scope *Scope
	ctx   *hcl.EvalContext // for constant folding
	diags hcl.Diagnostics

	locals []local                           // for-expression variables in scope, innermost last
	anon   map[*hclsyntax.AnonSymbolExpr]int // splat items in scope, to slot
	bad    map[hcl.Pos]bool                  // traversals already reported as invalid
	slots  int
	// fields and wholeMsg record what of the message the expression reads (Program.Fields).
	fields   map[string]bool
	wholeMsg bool
}

type local struct {
	name string
	slot int
}

// Compile compiles e once for per-message evaluation. The diagnostics carry
// errors (then the Program is nil) and warnings (e.g. a function that will
// be evaluated through cty). e may come from native syntax or JSON syntax.
func Compile(e hcl.Expression, s *Scope) (*Program, hcl.Diagnostics) {
	if s == nil {
		s = &Scope{}
	}
	c := &compiler{
		scope: s,
		ctx:   &hcl.EvalContext{Variables: s.Constants, Functions: s.Functions},
		anon:  map[*hclsyntax.AnonSymbolExpr]int{},
		bad:   map[hcl.Pos]bool{},
	}
	if c.ctx.Functions == nil {
		c.ctx.Functions = map[string]function.Function{}
	}
	if e == nil {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Missing expression", Detail: "No expression was given."}}
	}
	sx, ok := e.(hclsyntax.Expression)
	if !ok {
		var diags hcl.Diagnostics
		sx, diags = fromJSON(e)
		c.diags = append(c.diags, diags...)
		if diags.HasErrors() {
			return nil, c.diags
		}
	}
	c.checkVariables(sx)
	root := c.expr(sx)
	if c.diags.HasErrors() {
		return nil, c.diags
	}
	p := &Program{root: root, slots: c.slots, wholeMsg: c.wholeMsg}
	for f := range c.fields {
		p.fields = append(p.fields, f)
	}
	sort.Strings(p.fields)
	return p, c.diags
}

// checkVariables reports every reference to an unknown root, to a root not
// allowed here, and to an undeclared var.* or local.*, all at once.
func (c *compiler) checkVariables(e hclsyntax.Expression) {
	for _, t := range hclsyntax.Variables(e) {
		root := t.RootName()
		rootRange := t[0].SourceRange()
		switch {
		case slices.Contains(c.scope.Roots, root):
		case c.hasConstant(root):
			c.checkConstantRef(t)
		case slices.Contains(knownRoots, root):
			allowed := "may not refer to per-message values at all"
			if len(c.scope.Roots) > 0 {
				allowed = "may only refer to " + strings.Join(c.scope.Roots, ", ")
			}
			c.bad[rootRange.Start] = true
			c.diags = append(c.diags, errorDiag(rootRange, "Variable not allowed here",
				fmt.Sprintf("%q is not available in this attribute: per-message expressions here %s.", root, allowed)))
		default:
			names := slices.Clone(c.scope.Roots)
			for k := range c.scope.Constants {
				names = append(names, k)
			}
			sort.Strings(names)
			detail := fmt.Sprintf("There is no variable named %q.", root)
			if sug := nameSuggestion(root, names); sug != "" {
				detail += fmt.Sprintf(" Did you mean %q?", sug)
			} else if len(c.scope.Roots) > 0 {
				detail += fmt.Sprintf(" This attribute may refer to %s.", strings.Join(c.scope.Roots, ", "))
			}
			c.bad[rootRange.Start] = true
			c.diags = append(c.diags, errorDiag(rootRange, "Unknown variable", detail))
		}
	}
}

func (c *compiler) hasConstant(name string) bool {
	_, ok := c.scope.Constants[name]
	return ok
}

// checkConstantRef checks that var.x / local.x names a declared value.
func (c *compiler) checkConstantRef(t hcl.Traversal) {
	root := t.RootName()
	val := c.scope.Constants[root]
	if len(t) < 2 || !val.IsKnown() || val.IsNull() {
		return
	}
	ty := val.Type()
	if !ty.IsObjectType() && !ty.IsMapType() {
		return
	}
	var name string
	switch st := t[1].(type) {
	case hcl.TraverseAttr:
		name = st.Name
	case hcl.TraverseIndex:
		if st.Key.Type() != cty.String || !st.Key.IsKnown() || st.Key.IsNull() {
			return
		}
		name = st.Key.AsString()
	default:
		return
	}
	if val.Type().IsObjectType() && val.Type().HasAttribute(name) {
		return
	}
	if val.Type().IsMapType() && val.HasIndex(cty.StringVal(name)).True() {
		return
	}
	var names []string
	for it := val.ElementIterator(); it.Next(); {
		k, _ := it.Element()
		names = append(names, k.AsString())
	}
	sort.Strings(names)
	var summary, detail string
	switch root {
	case "var":
		summary = "Reference to undeclared input variable"
		detail = fmt.Sprintf("An input variable with the name %q has not been declared.", name)
	case "local":
		summary = "Reference to undeclared local value"
		detail = fmt.Sprintf("A local value with the name %q has not been declared.", name)
	default:
		summary = "Unsupported attribute"
		detail = fmt.Sprintf("%s has no attribute named %q.", root, name)
	}
	if sug := nameSuggestion(name, names); sug != "" {
		detail += fmt.Sprintf(" Did you mean %q?", sug)
	}
	rng := hcl.RangeBetween(t[0].SourceRange(), t[1].SourceRange())
	c.bad[t[0].SourceRange().Start] = true
	c.diags = append(c.diags, errorDiag(rng, summary, detail))
}

// nameSuggestion returns the first of names within edit distance 2 of
// given, the threshold hclsyntax uses for its own suggestions.
func nameSuggestion(given string, names []string) string {
	for _, n := range names {
		if levenshtein.Distance(given, n, nil) < 3 {
			return n
		}
	}
	return ""
}

// impure functions return something new on every call and are never folded.
var impure = map[string]bool{"uuid": true, "timestamp": true}

// isConstant reports whether e depends on nothing per-message: no root
// of Scope.Roots, no for or splat variable bound outside e, no impure
// function. Such a subtree is folded at compile time through cty, which
// also finds its type errors.
func (c *compiler) isConstant(e hclsyntax.Expression) bool {
	for _, t := range hclsyntax.Variables(e) {
		root := t.RootName()
		if c.lookupLocal(root) >= 0 || !c.hasConstant(root) || c.bad[t[0].SourceRange().Start] {
			return false
		}
	}
	constant := true
	// The visitor returns no diagnostics, so VisitAll has none to return.
	_ = hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		switch n := n.(type) {
		case *hclsyntax.FunctionCallExpr:
			if _, ok := c.scope.Functions[n.Name]; !ok || impure[n.Name] {
				constant = false
			}
		case *hclsyntax.AnonSymbolExpr:
			if _, ok := c.anon[n]; ok {
				constant = false
			}
		case *hclsyntax.ExprSyntaxError:
			constant = false
		}
		return nil
	})
	return constant
}

func (c *compiler) lookupLocal(name string) int {
	for i := len(c.locals) - 1; i >= 0; i-- {
		if c.locals[i].name == name {
			return c.locals[i].slot
		}
	}
	return -1
}

func (c *compiler) newSlot() int {
	c.slots++
	return c.slots - 1
}

// fold evaluates a constant subtree through cty.
func (c *compiler) fold(e hclsyntax.Expression) *node {
	n := c.newNode(e)
	v, diags := e.Value(c.ctx)
	c.diags = append(c.diags, diags...)
	if diags.HasErrors() {
		return c.broken(n)
	}
	v, _ = v.UnmarkDeep()
	if !v.IsWhollyKnown() {
		// A config value that is not known yet (e.g. during validation):
		// not a compile error, but there is nothing to evaluate either.
		n.eval = func(*Env) (Value, *EvalError) {
			return Value{}, n.failf("%s depends on a value that is not known until the pipeline runs", n.src)
		}
		return n
	}
	return constNode(n, fromCty(v))
}

func constNode(n *node, v Value) *node {
	n.isConst = true
	n.val = v
	n.typ = stypOf(v.k)
	n.eval = func(*Env) (Value, *EvalError) { return v, nil }
	return n
}

// broken is a node for a sub-expression that already has an error
// diagnostic; it is never evaluated because Compile returns no Program.
func (c *compiler) broken(n *node) *node {
	n.eval = func(*Env) (Value, *EvalError) {
		return Value{}, n.failf("invalid expression")
	}
	return n
}

func (c *compiler) newNode(e hclsyntax.Expression) *node {
	return &node{rng: e.Range(), src: c.source(e), typ: tAny}
}

// expr compiles one hclsyntax expression.
func (c *compiler) expr(e hclsyntax.Expression) *node {
	if c.isConstant(e) {
		return c.fold(e)
	}
	switch e := e.(type) {
	case *hclsyntax.ParenthesesExpr:
		inner := c.expr(e.Expression)
		n := *inner
		n.rng, n.src = e.SrcRange, c.source(e)
		return &n
	case *hclsyntax.LiteralValueExpr:
		return constNode(c.newNode(e), fromCty(e.Val))
	case *hclsyntax.ScopeTraversalExpr:
		return c.scopeTraversal(e)
	case *hclsyntax.RelativeTraversalExpr:
		return c.relativeTraversal(e)
	case *hclsyntax.IndexExpr:
		return c.index(e)
	case *hclsyntax.SplatExpr:
		return c.splat(e)
	case *hclsyntax.AnonSymbolExpr:
		return c.anonSymbol(e)
	case *hclsyntax.UnaryOpExpr:
		return c.unary(e)
	case *hclsyntax.BinaryOpExpr:
		return c.binary(e)
	case *hclsyntax.ConditionalExpr:
		return c.conditional(e)
	case *hclsyntax.TupleConsExpr:
		return c.tuple(e)
	case *hclsyntax.ObjectConsExpr:
		return c.object(e)
	case *hclsyntax.ObjectConsKeyExpr:
		return c.objectKey(e)
	case *hclsyntax.ForExpr:
		return c.forExpr(e)
	case *hclsyntax.FunctionCallExpr:
		return c.call(e)
	case *hclsyntax.TemplateExpr:
		return c.template(e)
	case *hclsyntax.TemplateWrapExpr:
		inner := c.expr(e.Wrapped)
		n := *inner
		n.rng, n.src = e.SrcRange, c.source(e)
		return &n
	case *hclsyntax.TemplateJoinExpr:
		return c.templateJoin(e)
	case *hclsyntax.ExprSyntaxError:
		c.diags = append(c.diags, e.ParseDiags...)
		if !e.ParseDiags.HasErrors() {
			c.diags = append(c.diags, errorDiag(e.SrcRange, "Invalid expression", "The expression could not be parsed."))
		}
		return c.broken(c.newNode(e))
	}
	c.diags = append(c.diags, errorDiag(e.Range(), "Unsupported expression",
		fmt.Sprintf("Expressions of type %T are not supported in per-message attributes.", e)))
	return c.broken(c.newNode(e))
}

// Eval evaluates the program for one message.
func (p *Program) Eval(env *Env) (Value, error) {
	v, err := p.run(env)
	if err != nil {
		return Value{}, err
	}
	return v, nil
}

func (p *Program) run(env *Env) (Value, *EvalError) {
	if p == nil || p.root == nil {
		return Value{}, &EvalError{Message: "expression was not compiled"}
	}
	if env == nil {
		env = &Env{}
	}
	if p.slots > len(env.locals) {
		env.locals = make([]Value, p.slots)
	}
	return p.root.eval(env)
}

// EvalBool evaluates a condition (where, when). Like HCL conditions, the
// result must be a bool or a string "true"/"false"; null is an error.
func (p *Program) EvalBool(env *Env) (bool, error) {
	v, err := p.run(env)
	if err != nil {
		return false, err
	}
	if v.k == Bool {
		return v.boolean(), nil
	}
	return p.condition(v)
}

// condition converts a non-bool result the way HCL converts conditions.
func (p *Program) condition(v Value) (bool, error) {
	b, msg := toBool(v)
	if msg != "" {
		if v.k == Null {
			return false, p.root.failf("the condition is null; it must be true or false")
		}
		return false, p.root.failf("the condition must be a bool, but it is %s", describe(v))
	}
	return b, nil
}

// EvalString evaluates a key or other string attribute: strings as they
// are, numbers and bools converted like HCL converts them; null, lists and
// objects are errors.
func (p *Program) EvalString(env *Env) (string, error) {
	v, err := p.run(env)
	if err != nil {
		return "", err
	}
	s, msg := v.asString()
	if msg != "" {
		return "", p.root.failf("a string is required, but the value is %s", describe(v))
	}
	return s, nil
}

// Fields returns the top-level fields of the message that the expression reads, sorted, and
// whether it may read others as well (it names msg itself, or indexes it by a computed key): what
// a stage that changes fields must leave alone for the expression to mean the same after it.
func (p *Program) Fields() (fields []string, more bool) {
	if p == nil {
		return nil, false
	}
	return p.fields, p.wholeMsg
}

// Field returns the field of the message that an expression of the form msg.NAME reads, and false
// for any other expression. Its value is the field's, as it was decoded: a reader that has the
// field's value without the message decoded (a string field in the payload) has the value already.
func (p *Program) Field() (string, bool) {
	if p == nil || p.root == nil || p.root.field == "" {
		return "", false
	}
	return p.root.field, true
}

// Range is the source range of the expression.
func (p *Program) Range() hcl.Range {
	if p == nil || p.root == nil {
		return hcl.Range{}
	}
	return p.root.rng
}

// String is the expression's source text (best effort), for graph labels
// and messages.
func (p *Program) String() string {
	if p == nil || p.root == nil {
		return ""
	}
	return p.root.src
}

// StaticKind returns the kind every result of the expression has, when static analysis knows it
// (a comparison is a Bool, arithmetic a Number, upper() a String), and false when only a message
// can tell (msg.flag is whatever the message holds).
func (p *Program) StaticKind() (Kind, bool) {
	if p == nil || p.root == nil {
		return Null, false
	}
	switch p.root.typ {
	case tNull:
		return Null, true
	case tBool:
		return Bool, true
	case tNumber:
		return Number, true
	case tString:
		return String, true
	case tList:
		return List, true
	case tObject:
		return Object, true
	}
	return Null, false
}

// Constant returns the value of an expression that depends on nothing
// per-message and was folded at compile time.
func (p *Program) Constant() (Value, bool) {
	if p != nil && p.root != nil && p.root.isConst {
		return p.root.val, true
	}
	return Value{}, false
}

// describe names a value's type for error messages.
func describe(v Value) string {
	switch v.k {
	case Null:
		return "null"
	case String:
		s := v.s
		if len(s) > 40 {
			s = s[:37] + "..."
		}
		return fmt.Sprintf("the string %q", s)
	case Number:
		return "the number " + formatNumber(v)
	case Bool:
		s, _ := v.asString()
		return "the bool " + s
	case List:
		return fmt.Sprintf("a list of %d elements", len(v.list()))
	}
	return "an object"
}
