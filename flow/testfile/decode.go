package testfile

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"

	"github.com/flowrun/flowrun/flow"
)

// Load reads and decodes a test file (native syntax, or JSON syntax when it ends in
// .flowtest.hcl.json) as far as it can without the pipeline: every block, attribute and message is
// checked here, and references to the pipeline's blocks are kept for Check. It always returns a
// File, possibly partial, whose Files print the diagnostics with snippets.
func Load(path string) (*File, hcl.Diagnostics) {
	src, err := os.ReadFile(path)
	if err != nil {
		return &File{Path: path}, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Cannot read test file",
			Detail:   fmt.Sprintf("%s: %s.", path, flow.DescribeFSError(err)),
		}}
	}
	return LoadSource(path, src)
}

// LoadSource decodes a test file from memory; name says its syntax, as in Load, and
// is the directory that its fixture and golden files are relative to.
func LoadSource(name string, src []byte) (*File, hcl.Diagnostics) {
	d := &decoder{
		file:  &File{Path: name},
		dir:   filepath.Dir(name),
		src:   src,
		ctx:   &hcl.EvalContext{Functions: flow.Functions(os.LookupEnv)},
		names: map[string]map[string]hcl.Range{},
	}
	p := hclparse.NewParser()
	f, diags := flow.ParseFile(p, name, src)
	d.file.files = p.Files()
	d.diags = diags
	if f == nil || f.Body == nil || diags.HasErrors() {
		return d.file, diags
	}
	d.decodeFile(f.Body)
	return d.file, flow.SortDiagnostics(d.diags)
}

// decoder holds the state of decoding one test file.
type decoder struct {
	file  *File
	dir   string           // the test file's directory, for fixture and golden files
	src   []byte           // the test file, for the source text of compiled expressions
	ctx   *hcl.EvalContext // for constant values: functions, no variables
	diags hcl.Diagnostics
	names map[string]map[string]hcl.Range // by block type, the names declared so far
}

// blockRef is a reference to a pipeline's block as written, such as sink.out; Check resolves it.
type blockRef struct {
	Type, Name string
	Range      hcl.Range
}

func (d *decoder) errorf(rng hcl.Range, summary, format string, args ...any) {
	d.diags = d.diags.Append(&hcl.Diagnostic{
		Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(format, args...), Subject: rng.Ptr(),
	})
}

// content decodes a body by its spec: an argument or block that the spec does not declare is an
// error with hcl's suggestion, and so is a missing required argument. extra are attributes that
// the body may hold only to be reported with a better message than hcl's.
func (d *decoder) content(hb *hcl.Block, body hcl.Body, spec *flow.BlockSpec, extra ...string) *hcl.BodyContent {
	schema := spec.BodySchema()
	for _, name := range extra {
		schema.Attributes = append(schema.Attributes, hcl.AttributeSchema{Name: name})
	}
	content, diags := body.Content(schema)
	d.diags = append(d.diags, diags...)
	if hb != nil {
		d.diags = append(d.diags, spec.CheckRequired(hb, content)...)
	}
	return content
}

// declare records a block's name, or reports where the same name was declared before.
func (d *decoder) declare(what, name string, rng hcl.Range) bool {
	return d.declareIn("", what, name, rng)
}

// declareIn is declare in the scope of a run (run "": the file's). The blocks that a run may hold
// as the file does (mock, override_sink) are declared once in the file and once in each run, where
// they replace the file's.
func (d *decoder) declareIn(run, what, name string, rng hcl.Range) bool {
	key, scope := what, "in a test file"
	if run != "" {
		key, scope = what+"\x00run\x00"+run, "in a run"
	}
	names := d.names[key]
	if names == nil {
		names = map[string]hcl.Range{}
		d.names[key] = names
	}
	if prev, ok := names[name]; ok {
		where := fmt.Sprintf("at %s", prev)
		if run != "" {
			where = "in this run " + where
		}
		d.errorf(rng, fmt.Sprintf("Duplicate %s %q", what, name),
			"A %s %q is already declared %s; each must be declared once %s.", what, name, where, scope)
		return false
	}
	names[name] = rng
	return true
}

// decodeFile decodes the top-level blocks, in source order.
func (d *decoder) decodeFile(body hcl.Body) {
	top := &flow.BlockSpec{}
	for _, spec := range Language {
		top.Blocks = append(top.Blocks, flow.NestedBlock{Spec: spec})
	}
	content := d.content(nil, body, top)
	for _, hb := range content.Blocks {
		switch hb.Type {
		case "variables":
			d.decodeVariables(hb)
		case "mock":
			if m := d.decodeMock(hb, ""); m != nil {
				d.file.Mocks = append(d.file.Mocks, m)
			}
		case "override_sink":
			if o := d.decodeOverride(hb, ""); o != nil {
				d.file.Overrides = append(d.file.Overrides, o)
			}
		case "run":
			if r := d.decodeRun(hb); r != nil {
				d.file.Runs = append(d.file.Runs, r)
			}
		}
	}
}

// decodeVariables reads a variables block; several blocks add up, each variable set once.
func (d *decoder) decodeVariables(hb *hcl.Block) {
	attrs, diags := hb.Body.JustAttributes()
	d.diags = append(d.diags, diags...)
	if d.file.Variables == nil {
		d.file.Variables, d.file.VariableRanges = map[string]cty.Value{}, map[string]hcl.Range{}
	}
	for _, a := range slices.SortedFunc(maps.Values(attrs), bySource) {
		if !d.declare("variable", a.Name, a.NameRange) {
			continue
		}
		v, diags := a.Expr.Value(d.ctx)
		d.diags = append(d.diags, diags...)
		if diags.HasErrors() {
			continue
		}
		d.file.Variables[a.Name] = v
		d.file.VariableRanges[a.Name] = a.Expr.Range()
	}
}

// decodeMock decodes a mock block of the file (run "") or of the named run.
func (d *decoder) decodeMock(hb *hcl.Block, run string) *Mock {
	m := &Mock{Func: hb.Labels[0], Range: hb.DefRange}
	content := d.content(hb, hb.Body, mockSpec)
	if !d.declareIn(run, "mock", m.Func, hb.LabelRanges[0]) {
		return nil
	}
	for _, rb := range content.Blocks {
		if r := d.decodeMockResult(rb); r != nil {
			m.Results = append(m.Results, r)
		}
	}
	if len(content.Blocks) == 0 {
		d.errorf(hb.DefRange, "Missing result block",
			"A mock needs at least one result block: %s", mockResultSpec.Doc)
	}
	return m
}

func (d *decoder) decodeMockResult(hb *hcl.Block) *MockResult {
	content := d.content(hb, hb.Body, mockResultSpec)
	attrs := content.Attributes
	r := &MockResult{Times: 1, Range: hb.DefRange}
	if a, ok := attrs["error"]; ok {
		r.Error, _ = d.string(a)
		if r.Error == "" {
			d.errorf(a.Expr.Range(), "Invalid error", "A mocked error needs a message.")
		}
	}
	if a, ok := attrs["permanent"]; ok {
		r.Permanent, _ = d.bool(a)
		if _, hasError := attrs["error"]; !hasError {
			d.errorf(a.NameRange, "Permanent without error", "permanent says that the result's error is not retried; set error too.")
		}
	}
	if a, ok := attrs["drop"]; ok {
		r.Drop, _ = d.bool(a)
	}
	if a, ok := attrs["times"]; ok {
		if n, ok := d.integer(a, 1); ok {
			r.Times = n
		}
	}
	output, hasOutput := attrs["output"]
	outputs, hasOutputs := attrs["outputs"]
	switch {
	case hasOutput && hasOutputs:
		d.errorf(outputs.NameRange, "Conflicting arguments", "A result has output (one message) or outputs (a list), not both.")
	case hasOutput:
		if e := d.messageExpr(output.Expr); e != nil {
			r.Outputs = []*flow.MessageExpr{e}
		}
	case hasOutputs:
		elems, diags := hcl.ExprList(outputs.Expr)
		if diags.HasErrors() {
			d.errorf(outputs.Expr.Range(), "Invalid outputs", "outputs takes a list of expressions over msg, such as [msg, { copy = true }].")
			break
		}
		r.Outputs = []*flow.MessageExpr{} // an empty list returns no message, as drop does
		for _, e := range elems {
			if m := d.messageExpr(e); m != nil {
				r.Outputs = append(r.Outputs, m)
			}
		}
	}
	// Say which two of the kinds of result a block mixes, pointing at the second.
	var kinds []*hcl.Attribute
	for _, name := range []string{"error", "drop", "output", "outputs"} {
		if a, ok := attrs[name]; ok && !(name == "outputs" && hasOutput) && !(name == "drop" && !r.Drop) {
			kinds = append(kinds, a)
		}
	}
	slices.SortFunc(kinds, bySource)
	if len(kinds) > 1 {
		d.errorf(kinds[1].NameRange, "Conflicting arguments",
			"A result fails (error), drops (drop) or returns messages (output, outputs); this one has both %s and %s.",
			kinds[0].Name, kinds[1].Name)
	}
	return r
}

// messageExpr compiles an expression over msg as a stage's per-message expressions compile.
func (d *decoder) messageExpr(e hcl.Expression) *flow.MessageExpr {
	m, diags := flow.CompileHCLMessageExpr(e, d.src)
	d.diags = append(d.diags, diags...)
	return m
}

// decodeOverride decodes an override_sink block of the file (run "") or of the named run.
func (d *decoder) decodeOverride(hb *hcl.Block, run string) *SinkOverride {
	o := &SinkOverride{Sink: hb.Labels[0], Range: hb.DefRange}
	content := d.content(hb, hb.Body, overrideSinkSpec)
	if !d.declareIn(run, "override_sink", o.Sink, hb.LabelRanges[0]) {
		return nil
	}
	a, ok := content.Attributes["responses"]
	if !ok {
		return o
	}
	v, ok := d.constant(a)
	if !ok {
		return o
	}
	list, err := convert.Convert(v, cty.List(cty.Number))
	if err != nil || list.IsNull() || list.LengthInt() == 0 {
		d.errorf(a.Expr.Range(), "Invalid responses", "responses takes a non-empty list of HTTP status codes, such as [503, 200].")
		return o
	}
	for _, e := range list.AsValueSlice() {
		code, ok := wholeNumber(e)
		if !ok || code < 100 || code > 599 {
			d.errorf(a.Expr.Range(), "Invalid responses", "Each response is an HTTP status code, a whole number from 100 to 599.")
			return o
		}
		o.Responses = append(o.Responses, code)
	}
	return o
}

// decodeRun decodes a run block: its own sends and advance become Steps[0], its step blocks the
// steps after it, and its own expectations the run's.
func (d *decoder) decodeRun(hb *hcl.Block) *Run {
	r := &Run{Name: hb.Labels[0], Range: hb.DefRange}
	first := &Step{Range: hb.DefRange}
	content := d.content(hb, hb.Body, runSpec, "crash")
	if r.Name == "" {
		d.errorf(hb.LabelRanges[0], "Invalid run name", "A run needs a name, which reports show.")
	}
	if !d.declare("run", r.Name, hb.LabelRanges[0]) {
		return nil
	}
	if a, ok := content.Attributes["crash"]; ok {
		d.errorf(a.NameRange, "Unsupported argument",
			"A run cannot crash before it starts; put crash = true in a step block, which crashes the pipeline at its start.")
	}
	if a, ok := content.Attributes["reset"]; ok {
		r.Reset, _ = d.bool(a)
	}
	if a, ok := content.Attributes["advance"]; ok {
		first.Advance, _ = d.duration(a)
	}
	r.Steps = []*Step{first}
	for _, b := range content.Blocks {
		switch b.Type {
		case "send":
			if s := d.decodeSend(b, first.Advance); s != nil {
				first.Sends = append(first.Sends, s)
			}
		case "expect":
			if e := d.decodeExpect(b); e != nil {
				r.Expect = append(r.Expect, e)
			}
		case "expect_dead_letters":
			if e := d.decodeExpectDeadLetters(b); e != nil {
				r.ExpectDeadLetters = append(r.ExpectDeadLetters, e)
			}
		case "assert":
			if a := d.decodeAssert(b); a != nil {
				r.Asserts = append(r.Asserts, a)
			}
		case "step":
			r.Steps = append(r.Steps, d.decodeStep(b))
		case "mock":
			if m := d.decodeMock(b, r.Name); m != nil {
				r.Mocks = append(r.Mocks, m)
			}
		case "override_sink":
			if o := d.decodeOverride(b, r.Name); o != nil {
				r.Overrides = append(r.Overrides, o)
			}
		}
	}
	return r
}

func (d *decoder) decodeStep(hb *hcl.Block) *Step {
	s := &Step{Range: hb.DefRange}
	content := d.content(hb, hb.Body, stepSpec)
	if a, ok := content.Attributes["crash"]; ok {
		s.Crash, _ = d.bool(a)
	}
	if a, ok := content.Attributes["advance"]; ok {
		s.Advance, _ = d.duration(a)
	}
	for _, b := range content.Blocks {
		switch b.Type {
		case "send":
			if send := d.decodeSend(b, s.Advance); send != nil {
				s.Sends = append(s.Sends, send)
			}
		case "expect":
			if e := d.decodeExpect(b); e != nil {
				s.Expect = append(s.Expect, e)
			}
		case "expect_dead_letters":
			if e := d.decodeExpectDeadLetters(b); e != nil {
				s.ExpectDeadLetters = append(s.ExpectDeadLetters, e)
			}
		case "assert":
			if a := d.decodeAssert(b); a != nil {
				s.Asserts = append(s.Asserts, a)
			}
		}
	}
	return s
}

// decodeSend decodes a send block of a step that runs for advance (0: until drained), which a
// message's at may not exceed.
func (d *decoder) decodeSend(hb *hcl.Block, advance time.Duration) *Send {
	s := &Send{Range: hb.DefRange}
	content := d.content(hb, hb.Body, sendSpec)
	a := d.oneOf(hb, content, true, "topic", "source")
	if a != nil {
		allowed := sendSpec.Attribute(a.Name).Refs
		if ref, ok := d.reference(a, allowed...); ok {
			s.ref = ref
			switch ref.Type {
			case "topic":
				s.Topic = ref.Name
			case "source":
				s.Source = ref.Name
			}
		}
	}
	switch a := d.oneOf(hb, content, true, "messages", "file"); {
	case a == nil:
	case a.Name == "messages":
		s.Messages = d.messages(a, true)
	default:
		s.Messages, s.File, _ = d.messagesFile(a, true, true)
	}
	if advance > 0 {
		for _, m := range s.Messages {
			if m.At > advance {
				d.errorf(m.Range, "Message after the step's end",
					"This message is sent at %s, after the step's advance of %s ends: it would never be sent.",
					flow.FormatDuration(m.At), flow.FormatDuration(advance))
			}
		}
	}
	return s
}

func (d *decoder) decodeExpect(hb *hcl.Block) *Expect {
	e := &Expect{Match: MatchExact, Range: hb.DefRange}
	content := d.content(hb, hb.Body, expectSpec)
	attrs := content.Attributes
	if a := d.oneOf(hb, content, true, "sink", "topic"); a != nil {
		if ref, ok := d.reference(a, expectSpec.Attribute(a.Name).Refs...); ok {
			e.ref = ref
			switch ref.Type {
			case "sink":
				e.Sink = ref.Name
			case "topic":
				e.Topic = ref.Name
			}
		}
	}
	switch a := d.oneOf(hb, content, false, "messages", "file"); {
	case a == nil:
	case a.Name == "messages":
		e.Messages, e.HasMessages = d.messages(a, false), true
	default:
		// A golden file that does not exist yet is the runner's to report, or to write with -update.
		e.Messages, e.File, e.HasMessages = d.messagesFile(a, false, false)
	}
	if a, ok := attrs["count"]; ok {
		e.Count, e.HasCount = d.integer(a, 0)
	}
	if a, ok := attrs["match"]; ok {
		if m, ok := d.enum(a, expectSpec.Attribute("match").Enum); ok {
			e.Match = m
		}
		if _, ok := attrs["count"]; ok && attrs["messages"] == nil && attrs["file"] == nil {
			d.errorf(a.NameRange, "Match without messages", "match says how messages compare; a count alone has none to compare.")
		}
	}
	if attrs["messages"] == nil && attrs["file"] == nil && attrs["count"] == nil {
		d.errorf(hb.DefRange, "Nothing to expect", "An expect block needs messages, a file or a count.")
	}
	return e
}

func (d *decoder) decodeExpectDeadLetters(hb *hcl.Block) *ExpectDeadLetters {
	e := &ExpectDeadLetters{Range: hb.DefRange}
	content := d.content(hb, hb.Body, expectDeadLettersSpec)
	if a := d.oneOf(hb, content, true, "source", "stage", "sink"); a != nil {
		if ref, ok := d.reference(a, a.Name); ok {
			e.ref, e.NodeType, e.Node = ref, ref.Type, ref.Name
		}
	}
	if a, ok := content.Attributes["count"]; ok {
		e.Count, e.HasCount = d.integer(a, 0)
	}
	if a, ok := content.Attributes["messages"]; ok {
		e.Messages = d.deadLetters(a)
	}
	if content.Attributes["count"] == nil && content.Attributes["messages"] == nil {
		d.errorf(hb.DefRange, "Nothing to expect", "An expect_dead_letters block needs a count or messages.")
	}
	return e
}

// assertRoots are the variables of an assert's condition.
var assertRoots = []string{"output", "dead_letters", "metrics"}

func (d *decoder) decodeAssert(hb *hcl.Block) *Assert {
	content := d.content(hb, hb.Body, assertSpec)
	a := &Assert{Range: hb.DefRange}
	if attr, ok := content.Attributes["error_message"]; ok {
		a.ErrorMessage, _ = d.string(attr)
	}
	attr, ok := content.Attributes["condition"]
	if !ok {
		return nil
	}
	a.Condition = attr.Expr
	for _, t := range attr.Expr.Variables() {
		if root := t.RootName(); !slices.Contains(assertRoots, root) {
			d.errorf(t[0].SourceRange(), "Unknown variable", "There is no variable named %q. A condition can use %s.%s",
				root, flow.JoinOr(assertRoots), flow.DidYouMean(root, assertRoots))
		}
	}
	d.checkFunctions(attr.Expr)
	return a
}

// checkFunctions reports calls to functions that do not exist now rather than when the run is over.
// Only native syntax is walked: a JSON template is parsed only when evaluated.
func (d *decoder) checkFunctions(e hcl.Expression) {
	sx, ok := e.(hclsyntax.Expression)
	if !ok {
		return
	}
	names := slices.Sorted(maps.Keys(d.ctx.Functions))
	// The visitor returns no diagnostics, so VisitAll has none to return.
	_ = hclsyntax.VisitAll(sx, func(n hclsyntax.Node) hcl.Diagnostics {
		if call, ok := n.(*hclsyntax.FunctionCallExpr); ok {
			if _, ok := d.ctx.Functions[call.Name]; !ok {
				d.errorf(call.NameRange, "Call to unknown function", "There is no function named %q.%s", call.Name, flow.DidYouMean(call.Name, names))
			}
		}
		return nil
	})
}
