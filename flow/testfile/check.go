package testfile

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/flowrun/flowrun/flow"
)

// LoadAndCheck loads the test files of the pipeline at path (flow.FindTestFiles) and checks each
// against the pipeline compiled with opts and the file's variables (flow.Options.Values). A test
// file's path checks that file against its pipeline (flow.TestFilePipeline). It returns the test
// files, with their Plan set when the pipeline compiled; the parsed files of the pipeline and the
// tests, for diagnostics with snippets; and the diagnostics. Warnings located in the pipeline's
// own files are left out, since building the pipeline reports them once; its errors are kept, as
// a test's variables may cause them. `flowrun validate` and `flowrun test` both use it.
func LoadAndCheck(path string, opts flow.Options) ([]*File, map[string]*hcl.File, hcl.Diagnostics) {
	paths, diags := flow.FindTestFiles(path)
	if flow.IsTestFile(path) {
		path = flow.TestFilePipeline(path)
	}
	files := map[string]*hcl.File{}
	var tests []*File
	for _, p := range paths {
		t, moreDiags := Load(p)
		tests = append(tests, t)
		diags = append(diags, moreDiags...)
		for name, f := range t.Files() {
			files[name] = f
		}
		topts := opts
		topts.Values, topts.ValueRanges = t.Variables, t.VariableRanges
		// A mocked function stands in for the real one, which this binary need not have.
		topts.GoFuncs = append([]string(nil), opts.GoFuncs...)
		for _, m := range t.AllMocks() {
			topts.GoFuncs = append(topts.GoFuncs, m.Func)
		}
		plan, cfg, buildDiags := flow.Build(path, topts)
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
	return tests, files, flow.SortDiagnostics(diags)
}

// Check resolves the test file's references against the plan: every topic, source, stage and sink
// it names exists and is of the right type, every mock replaces a function that a go stage calls,
// every override names an http sink, and every variable is declared. It sets Plan, and resolves a
// topic written as stage.NAME to that stage's output topic.
func (f *File) Check(plan *flow.Plan) hcl.Diagnostics {
	f.Plan = plan
	c := &checker{plan: plan}
	c.checkVariables(f)
	for _, m := range f.Mocks {
		c.checkMock(m)
	}
	for _, o := range f.Overrides {
		c.checkOverride(o)
	}
	for _, r := range f.Runs {
		for _, m := range r.Mocks {
			c.checkMock(m)
		}
		for _, o := range r.Overrides {
			c.checkOverride(o)
		}
		for _, s := range r.Steps {
			for _, send := range s.Sends {
				c.checkSend(send)
			}
			c.checkExpectations(s.Expect, s.ExpectDeadLetters, s.Asserts)
		}
		c.checkExpectations(r.Expect, r.ExpectDeadLetters, r.Asserts)
	}
	return flow.SortDiagnostics(c.diags)
}

// checker holds the state of checking one test file against a plan.
type checker struct {
	plan  *flow.Plan
	diags hcl.Diagnostics
}

func (c *checker) errorf(rng hcl.Range, summary, format string, args ...any) {
	c.diags = c.diags.Append(&hcl.Diagnostic{
		Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(format, args...), Subject: rng.Ptr(),
	})
}

func (c *checker) checkVariables(f *File) {
	var names []string
	for _, v := range c.plan.Variables {
		names = append(names, v.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(f.Variables)) {
		if !slices.Contains(names, name) {
			c.errorf(f.VariableRanges[name], "Undeclared variable", "The pipeline declares no variable %q.%s", name, flow.DidYouMean(name, names))
		}
	}
}

func (c *checker) checkMock(m *Mock) {
	var funcs []string
	for _, s := range c.plan.Stages {
		if s.Kind == "go" {
			if fn := s.Config.String("func"); !slices.Contains(funcs, fn) {
				funcs = append(funcs, fn)
			}
		}
	}
	sort.Strings(funcs)
	if !slices.Contains(funcs, m.Func) {
		c.errorf(m.Range, "Mock of an unused function", "No go stage of the pipeline calls %q, so the mock would never be used.%s",
			m.Func, flow.DidYouMean(m.Func, funcs))
	}
}

func (c *checker) checkOverride(o *SinkOverride) {
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
	c.errorf(o.Range, "Override of an undeclared sink", "There is no sink named %q.%s", o.Sink, flow.DidYouMean(o.Sink, c.nodeNames("sink")))
}

func (c *checker) checkSend(s *Send) {
	switch s.ref.Type {
	case "source":
		c.node(s.ref)
	case "topic", "stage":
		if t := c.topic(s.ref); t != nil {
			s.Topic = t.Name
		}
	}
}

func (c *checker) checkExpectations(expects []*Expect, deadLetters []*ExpectDeadLetters, asserts []*Assert) {
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
func (c *checker) topic(ref blockRef) *flow.Topic {
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
	c.errorf(ref.Range, "Reference to undeclared topic", "There is no topic named %q.%s", ref.Name, flow.DidYouMean(ref.Name, declared))
	return nil
}

// node checks that a reference names a node of its type, and says what the name is otherwise.
func (c *checker) node(ref blockRef) bool {
	if typ := c.nodeType(ref.Name); typ != ref.Type {
		detail := fmt.Sprintf("There is no %s named %q.%s", ref.Type, ref.Name, flow.DidYouMean(ref.Name, c.nodeNames(ref.Type)))
		if typ != "" {
			detail = fmt.Sprintf("%q is a %s, not a %s: write %s.%s.", ref.Name, typ, ref.Type, typ, ref.Name)
		}
		c.errorf(ref.Range, fmt.Sprintf("Reference to undeclared %s", ref.Type), "%s", detail)
		return false
	}
	return true
}

// nodeType is "source", "stage" or "sink" for a node's name, or "".
func (c *checker) nodeType(name string) string {
	for _, typ := range []string{"source", "stage", "sink"} {
		if slices.Contains(c.nodeNames(typ), name) {
			return typ
		}
	}
	return ""
}

// nodeNames lists the names of the plan's nodes of a type ("" for every type), sorted.
func (c *checker) nodeNames(typ string) []string {
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

// outputNames lists the names an assert may read as output.NAME: every sink and every topic
// (implicit outputs as output["stage.out"]). A sink and a topic of the same name are different
// blocks; output.NAME is then the sink, as the sink is where messages leave the pipeline.
func outputNames(p *flow.Plan) []string {
	var names []string
	for _, s := range p.Sinks {
		names = append(names, s.Name)
	}
	for _, t := range p.Topics {
		if !slices.Contains(names, t.Name) {
			names = append(names, t.Name)
		}
	}
	sort.Strings(names)
	return names
}

// checkAssert checks the names of a condition's traversals: output.NAME, dead_letters.NODE and
// metrics.NODE.COUNTER. Other roots are reported when the file is decoded.
func (c *checker) checkAssert(a *Assert) {
	for _, t := range a.Condition.Variables() {
		switch t.RootName() {
		case "output":
			if name, rng, ok := traversalStep(t, 1); ok && !slices.Contains(outputNames(c.plan), name) {
				c.errorf(rng, "Unknown output", "There is no sink or topic named %q.%s", name, flow.DidYouMean(name, outputNames(c.plan)))
			}
		case "dead_letters", "metrics":
			name, rng, ok := traversalStep(t, 1)
			if !ok {
				continue
			}
			if !slices.Contains(c.nodeNames(""), name) {
				c.errorf(rng, "Unknown node", "There is no source, stage or sink named %q.%s", name, flow.DidYouMean(name, c.nodeNames("")))
				continue
			}
			if t.RootName() != "metrics" {
				continue
			}
			if counter, rng, ok := traversalStep(t, 2); ok && !slices.Contains(Counters, counter) && CounterAliases[counter] == "" {
				hint := flow.DidYouMean(counter, Counters)
				for old, name := range CounterAliases { // a misspelt older name: suggest its new one
					if hint == "" && flow.Suggest(counter, []string{old}) != "" {
						hint = flow.DidYouMean(name, []string{name})
					}
				}
				c.errorf(rng, "Unknown counter", "There is no counter %q; the counters are %s.%s",
					counter, flow.QuotedList(Counters), hint)
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

// Topics names the topics a test file sends into or looks at: its send and expect blocks' topics,
// and the outputs its asserts read (output.NAME, output["NAME"]); flow.AnyTopic when an assert
// reads an output whose name it computes. A test that names a link of a chain needs it as a
// stream (flow.Plan's UnfuseTopics).
func (f *File) Topics() map[string]bool {
	names := map[string]bool{}
	for _, run := range f.Runs {
		for _, step := range run.Steps {
			for _, s := range step.Sends {
				names[s.Topic] = true
			}
			topicsOfChecks(names, step.Expect, step.Asserts)
		}
		topicsOfChecks(names, run.Expect, run.Asserts)
	}
	delete(names, "")
	return names
}

func topicsOfChecks(names map[string]bool, expects []*Expect, asserts []*Assert) {
	for _, e := range expects {
		names[e.Topic] = true
	}
	for _, a := range asserts {
		for _, t := range a.Condition.Variables() {
			if t.RootName() != "output" {
				continue
			}
			if name, _, ok := traversalStep(t, 1); ok {
				names[name] = true
			} else {
				names[flow.AnyTopic] = true
			}
		}
	}
}
