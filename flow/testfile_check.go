package flow

import (
	"fmt"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// CheckTests loads the test files of the pipeline at path (FindTestFiles) and checks each against
// the pipeline compiled with opts and the file's variables (Options.Values). A test file's path
// checks that file against its pipeline (TestFilePipeline). It returns the test
// files, with their Plan set when the pipeline compiled; the parsed files of the pipeline and the
// tests, for diagnostics with snippets; and the diagnostics. Warnings located in the pipeline's
// own files are left out, since building the pipeline reports them once; its errors are kept, as
// a test's variables may cause them. `flowrun validate` and `flowrun test` both use it.
func CheckTests(path string, opts Options) ([]*TestFile, map[string]*hcl.File, hcl.Diagnostics) {
	paths, diags := FindTestFiles(path)
	if isTestFile(path) {
		path = TestFilePipeline(path)
	}
	files := map[string]*hcl.File{}
	var tests []*TestFile
	for _, p := range paths {
		t, moreDiags := LoadTestFile(p)
		tests = append(tests, t)
		diags = append(diags, moreDiags...)
		for name, f := range t.Files() {
			files[name] = f
		}
		topts := opts
		topts.Values, topts.ValueRanges = t.Variables, t.VariableRanges
		// A mocked function stands in for the real one, which this binary need not have.
		topts.GoFuncs = append([]string(nil), opts.GoFuncs...)
		for _, m := range t.Mocks {
			topts.GoFuncs = append(topts.GoFuncs, m.Func)
		}
		plan, cfg, buildDiags := Build(path, topts)
		for name, f := range cfg.Files() {
			files[name] = f
		}
		for _, d := range buildDiags {
			if d.Severity == hcl.DiagError || d.Subject != nil && d.Subject.Filename == p {
				diags = append(diags, d)
			}
		}
		if plan != nil {
			diags = append(diags, t.Check(plan)...)
		}
	}
	return tests, files, SortDiagnostics(diags)
}

// Check resolves the test file's references against the plan: every topic, source, stage and sink
// it names exists and is of the right type, every mock replaces a function that a go stage calls,
// every override names an http sink, and every variable is declared. It sets Plan, and resolves a
// topic written as stage.NAME to that stage's output topic.
func (f *TestFile) Check(plan *Plan) hcl.Diagnostics {
	f.Plan = plan
	c := &testChecker{plan: plan}
	c.checkVariables(f)
	for _, m := range f.Mocks {
		c.checkMock(m)
	}
	for _, o := range f.Overrides {
		c.checkOverride(o)
	}
	for _, r := range f.Runs {
		for _, s := range r.Steps {
			for _, send := range s.Sends {
				c.checkSend(send)
			}
			c.checkExpectations(s.Expect, s.ExpectDeadLetters, s.Asserts)
		}
		c.checkExpectations(r.Expect, r.ExpectDeadLetters, r.Asserts)
	}
	return SortDiagnostics(c.diags)
}

// testChecker holds the state of checking one test file against a plan.
type testChecker struct {
	plan  *Plan
	diags hcl.Diagnostics
}

func (c *testChecker) errorf(rng hcl.Range, summary, format string, args ...any) {
	c.diags = c.diags.Append(&hcl.Diagnostic{
		Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(format, args...), Subject: rng.Ptr(),
	})
}

func (c *testChecker) checkVariables(f *TestFile) {
	var names []string
	for _, v := range c.plan.Variables {
		names = append(names, v.Name)
	}
	for _, name := range sortedKeys(f.Variables) {
		if !contains(names, name) {
			c.errorf(f.VariableRanges[name], "Undeclared variable", "The pipeline declares no variable %q.%s", name, DidYouMean(name, names))
		}
	}
}

func (c *testChecker) checkMock(m *TestMock) {
	var funcs []string
	for _, s := range c.plan.Stages {
		if s.Kind == "go" {
			if fn := s.Config.String("func"); !contains(funcs, fn) {
				funcs = append(funcs, fn)
			}
		}
	}
	sort.Strings(funcs)
	if !contains(funcs, m.Func) {
		c.errorf(m.Range, "Mock of an unused function", "No go stage of the pipeline calls %q, so the mock would never be used.%s",
			m.Func, DidYouMean(m.Func, funcs))
	}
}

func (c *testChecker) checkOverride(o *TestSinkOverride) {
	for _, s := range c.plan.Sinks {
		if s.Name != o.Sink {
			continue
		}
		if s.Kind != "http" {
			c.errorf(o.Range, "Override of a sink that is not http",
				"The sink %q is a %s sink. Only http sinks take responses; in a test every sink captures what it receives.", s.Name, s.Kind)
		}
		return
	}
	c.errorf(o.Range, "Override of an undeclared sink", "There is no sink named %q.%s", o.Sink, DidYouMean(o.Sink, c.nodeNames("sink")))
}

func (c *testChecker) checkSend(s *TestSend) {
	switch s.ref.Type {
	case "source":
		c.node(s.ref)
	case "topic", "stage":
		if t := c.topic(s.ref); t != nil {
			s.Topic = t.Name
		}
	}
}

func (c *testChecker) checkExpectations(expects []*TestExpect, deadLetters []*TestExpectDeadLetters, asserts []*TestAssert) {
	for _, e := range expects {
		switch e.ref.Type {
		case "sink":
			c.node(e.ref)
		case "topic", "stage":
			if t := c.topic(e.ref); t != nil {
				e.Topic = t.Name
			}
		}
	}
	for _, e := range deadLetters {
		if e.ref.Type != "" {
			c.node(e.ref)
		}
	}
	for _, a := range asserts {
		if a.Condition != nil {
			c.checkAssert(a)
		}
	}
}

// topic resolves topic.NAME to a declared topic and stage.NAME to the stage's output topic.
func (c *testChecker) topic(ref testRef) *Topic {
	if ref.Type == "stage" {
		if !c.node(ref) {
			return nil
		}
		s := c.plan.Stage(ref.Name)
		if s.Output == nil {
			c.errorf(ref.Range, "Ambiguous stage output",
				"The %s stage %q writes to several topics; name one of them by its topic reference.", s.Kind, s.Name)
		}
		return s.Output
	}
	var declared []string
	for _, t := range c.plan.Topics {
		if !t.Implicit {
			declared = append(declared, t.Name)
		}
	}
	if t := c.plan.Topic(ref.Name); t != nil && !t.Implicit {
		return t
	}
	c.errorf(ref.Range, "Reference to undeclared topic", "There is no topic named %q.%s", ref.Name, DidYouMean(ref.Name, declared))
	return nil
}

// node checks that a reference names a node of its type, and says what the name is otherwise.
func (c *testChecker) node(ref testRef) bool {
	if typ := c.nodeType(ref.Name); typ != ref.Type {
		detail := fmt.Sprintf("There is no %s named %q.%s", ref.Type, ref.Name, DidYouMean(ref.Name, c.nodeNames(ref.Type)))
		if typ != "" {
			detail = fmt.Sprintf("%q is a %s, not a %s: write %s.%s.", ref.Name, typ, ref.Type, typ, ref.Name)
		}
		c.errorf(ref.Range, fmt.Sprintf("Reference to undeclared %s", ref.Type), "%s", detail)
		return false
	}
	return true
}

// nodeType is "source", "stage" or "sink" for a node's name, or "".
func (c *testChecker) nodeType(name string) string {
	for _, typ := range []string{"source", "stage", "sink"} {
		if contains(c.nodeNames(typ), name) {
			return typ
		}
	}
	return ""
}

// nodeNames lists the names of the plan's nodes of a type ("" for every type), sorted.
func (c *testChecker) nodeNames(typ string) []string {
	var names []string
	if typ == "" || typ == "source" {
		for _, s := range c.plan.Sources {
			names = append(names, s.Name)
		}
	}
	if typ == "" || typ == "stage" {
		for _, s := range c.plan.Stages {
			names = append(names, s.Name)
		}
	}
	if typ == "" || typ == "sink" {
		for _, s := range c.plan.Sinks {
			names = append(names, s.Name)
		}
	}
	sort.Strings(names)
	return names
}

// OutputNames lists the names an assert may read as output.NAME: every sink and every topic
// (implicit outputs as output["stage.out"]). A sink and a topic of the same name are different
// blocks; output.NAME is then the sink, as the sink is where messages leave the pipeline.
func (p *Plan) OutputNames() []string {
	var names []string
	for _, s := range p.Sinks {
		names = append(names, s.Name)
	}
	for _, t := range p.Topics {
		if !contains(names, t.Name) {
			names = append(names, t.Name)
		}
	}
	sort.Strings(names)
	return names
}

// checkAssert checks the names of a condition's traversals: output.NAME, dead_letters.NODE and
// metrics.NODE.COUNTER. Other roots are reported when the file is decoded.
func (c *testChecker) checkAssert(a *TestAssert) {
	for _, t := range a.Condition.Variables() {
		switch t.RootName() {
		case "output":
			if name, rng, ok := traversalStep(t, 1); ok && !contains(c.plan.OutputNames(), name) {
				c.errorf(rng, "Unknown output", "There is no sink or topic named %q.%s", name, DidYouMean(name, c.plan.OutputNames()))
			}
		case "dead_letters", "metrics":
			name, rng, ok := traversalStep(t, 1)
			if !ok {
				continue
			}
			if !contains(c.nodeNames(""), name) {
				c.errorf(rng, "Unknown node", "There is no source, stage or sink named %q.%s", name, DidYouMean(name, c.nodeNames("")))
				continue
			}
			if t.RootName() != "metrics" {
				continue
			}
			if counter, rng, ok := traversalStep(t, 2); ok && !contains(TestCounters, counter) && TestCounterAliases[counter] == "" {
				hint := DidYouMean(counter, TestCounters)
				for old, name := range TestCounterAliases { // a misspelt older name: suggest its new one
					if hint == "" && Suggest(counter, []string{old}) != "" {
						hint = DidYouMean(name, []string{name})
					}
				}
				c.errorf(rng, "Unknown counter", "There is no counter %q; the counters are %s.%s",
					counter, QuotedList(TestCounters), hint)
			}
		}
	}
}

// traversalStep returns the name that step i of a traversal reads, as .name or ["name"].
func traversalStep(t hcl.Traversal, i int) (string, hcl.Range, bool) {
	if len(t) <= i {
		return "", hcl.Range{}, false
	}
	switch s := t[i].(type) {
	case hcl.TraverseAttr:
		return s.Name, s.SrcRange, true
	case hcl.TraverseIndex:
		if s.Key.Type() == cty.String && s.Key.IsKnown() && !s.Key.IsNull() {
			return s.Key.AsString(), s.SrcRange, true
		}
	}
	return "", hcl.Range{}, false
}
