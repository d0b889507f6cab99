package flow

import (
	"fmt"
	"sort"

	"github.com/hashicorp/hcl/v2"
)

// Blocks refer to each other by address: topic.NAME, stage.NAME, retry.NAME. References are bare
// traversals, resolved here after every file is read, so block order and file boundaries do not matter.

// checkConstantRefs reports references that a config-time expression cannot make, with suggestions for
// misspelt names. It returns false when the expression must not be evaluated.
func (c *compiler) checkConstantRefs(e hcl.Expression) bool {
	ok := true
	for _, t := range e.Variables() {
		if !c.checkConstantRef(t) {
			ok = false
		}
	}
	return ok
}

func (c *compiler) checkConstantRef(t hcl.Traversal) bool {
	root := t.RootName()
	rng := t.SourceRange()
	switch root {
	case "var", "local", "path":
		attr, ok := traversalAttr(t)
		if !ok {
			return true // var as a whole, or var["x"]: hcl reports what is wrong, if anything
		}
		names := c.constantNames(root)
		if contains(names, attr) {
			return true
		}
		what := map[string]string{"var": "variable", "local": "local value", "path": "path"}[root]
		c.errorf(rng, fmt.Sprintf("Reference to undeclared %s", what),
			fmt.Sprintf("There is no %s named %q.%s", what, attr, DidYouMean(attr, names)))
		return false
	case "msg", "index":
		c.errorf(rng, "Per-message value not allowed here",
			fmt.Sprintf("%s is only available in per-message expressions: a topic's key, a stage's set, where "+
				"and when, a sink's where, and a generate source's template. This value is computed once, when "+
				"the pipeline compiles.", root))
		return false
	case "topic", "stage", "retry", "source", "sink", "table":
		c.errorf(rng, "Block reference not allowed here",
			fmt.Sprintf("%s is a reference to a block, not a value. Use block references in input, output, "+
				"retry, dead_letter, a lookup's table and a route's case output and default.", t.RootName()+traversalSuffix(t)))
		return false
	}
	c.errorf(rng, "Unknown variable",
		fmt.Sprintf("There is no variable named %q. Compile-time expressions can use var, local and path.%s",
			root, DidYouMean(root, configRoots)))
	return false
}

// constantNames lists the attribute names of a config-time root, sorted.
func (c *compiler) constantNames(root string) []string {
	v := c.ctx.Variables[root]
	var names []string
	if v.Type().IsObjectType() {
		for n := range v.Type().AttributeTypes() {
			names = append(names, n)
		}
	}
	if root == "local" {
		for _, a := range c.cfg.Locals { // locals not yet evaluated are still declared
			names = append(names, a.Name)
		}
	}
	sort.Strings(names)
	return names
}

// reference is a resolved block address.
type reference struct {
	Type, Name string
	Range      hcl.Range
}

// parseReference reads a bare reference such as topic.orders whose block type is one of allowed.
func (c *compiler) parseReference(e hcl.Expression, attr string, allowed ...string) (reference, bool) {
	examples := make([]string, len(allowed))
	for i, a := range allowed {
		examples[i] = a + ".NAME"
	}
	want := fmt.Sprintf("%s takes a reference to a %s, written without quotes as %s.",
		attr, JoinOr(allowed), JoinOr(examples))
	t, diags := hcl.AbsTraversalForExpr(e)
	name, ok := traversalAttr(t)
	if diags.HasErrors() || len(t) != 2 || !ok {
		c.unresolved = true
		c.errorf(e.Range(), "Invalid reference", want)
		return reference{}, false
	}
	root := t.RootName()
	if !contains(allowed, root) {
		summary := "Invalid reference"
		if s := Suggest(root, allowed); s != "" {
			want += fmt.Sprintf(" Did you mean %s.%s?", s, name)
		}
		c.unresolved = true
		c.errorf(e.Range(), summary, want)
		return reference{}, false
	}
	return reference{Type: root, Name: name, Range: e.Range()}, true
}

// resolveTopic resolves an input, output or dead_letter attribute to a topic. With allowStage, a
// stage reference means that stage's output topic.
func (c *compiler) resolveTopic(e hcl.Expression, attr string, allowStage bool) *Topic {
	allowed := []string{"topic"}
	if allowStage {
		allowed = append(allowed, "stage")
	}
	ref, ok := c.parseReference(e, attr, allowed...)
	if !ok {
		return nil
	}
	if ref.Type == "stage" {
		return c.stageOutput(ref)
	}
	t, ok := c.topics[ref.Name]
	if !ok {
		c.unresolved = true
		c.errorf(ref.Range, "Reference to undeclared topic",
			fmt.Sprintf("There is no topic named %q.%s", ref.Name, DidYouMean(ref.Name, sortedKeys(c.topics))))
		return nil
	}
	c.topicUsed[t.Name] = true
	return t
}

// resolveRetry resolves a retry attribute to its policy.
func (c *compiler) resolveRetry(e hcl.Expression) (RetryPolicy, bool) {
	ref, ok := c.parseReference(e, "retry", "retry")
	if !ok {
		return RetryPolicy{}, false
	}
	p, ok := c.retries[ref.Name]
	if !ok {
		c.unresolved = true
		c.errorf(ref.Range, "Reference to undeclared retry policy",
			fmt.Sprintf("There is no retry block named %q.%s", ref.Name, DidYouMean(ref.Name, sortedKeys(c.retries))))
		return RetryPolicy{}, false
	}
	c.retryUsed[ref.Name] = true
	return p, true
}

// stageOutput is the topic a stage writes to, for inputs written as stage.NAME: its output topic, or
// an implicit topic when it declares none.
func (c *compiler) stageOutput(ref reference) *Topic {
	b := c.findNode(ref.Name)
	if b == nil || b.Type != "stage" {
		var stageNames []string
		for _, s := range c.cfg.Stages {
			stageNames = append(stageNames, s.Name)
		}
		detail := fmt.Sprintf("There is no stage named %q.%s", ref.Name, DidYouMean(ref.Name, stageNames))
		if b != nil {
			detail = fmt.Sprintf("%q is a %s, not a stage: only stages have outputs to read.", ref.Name, b.Type)
		}
		c.unresolved = true
		c.errorf(ref.Range, "Reference to undeclared stage", detail)
		return nil
	}
	if b.Kind != nil && b.Kind.OwnOutputs != nil {
		c.unresolved = true
		c.errorf(ref.Range, "Ambiguous stage output",
			fmt.Sprintf("The %s stage %q writes to several topics; read one of them by its topic reference.", b.Kind.Name, b.Name))
		return nil
	}
	if out, ok := b.Attributes["output"]; ok {
		return c.resolveTopic(out.Expr, "output", false)
	}
	if t, ok := c.implicit[b.Name]; ok {
		return t
	}
	t := &Topic{Name: b.Name + implicitTopicSuffix, Implicit: true, Stage: b.Name, Partitions: 1, Range: b.DeclRange}
	c.implicit[b.Name] = t
	c.topicUsed[t.Name] = true
	// The implicit topic takes its partition count from the stage's input, so parallelism carries over.
	if b.Kind != nil && len(b.Kind.Sides) > 0 && !c.resolving[b.Name] {
		c.resolving[b.Name] = true
		t.Partitions = c.sideInputPartitions(b)
		delete(c.resolving, b.Name)
	}
	if in, ok := b.Attributes["input"]; ok && !c.resolving[b.Name] {
		c.resolving[b.Name] = true
		if it := c.resolveTopicQuiet(in.Expr); it != nil {
			t.Partitions = it.Partitions
		}
		delete(c.resolving, b.Name)
	}
	return t
}

// implicitTopicSuffix names a stage's implicit output topic, stage.out; the dot keeps it apart from
// every declared topic, whose names are identifiers.
const implicitTopicSuffix = ".out"

// resolveTopicQuiet resolves a reference without reporting anything: the block that owns the attribute
// reports its own errors when it compiles.
func (c *compiler) resolveTopicQuiet(e hcl.Expression) *Topic {
	saved, unresolved := c.diags, c.unresolved
	t := c.resolveTopic(e, "input", true)
	c.diags, c.unresolved = saved, unresolved
	return t
}

// findNode returns the source, stage or sink with the given name, or nil.
func (c *compiler) findNode(name string) *Block {
	for _, list := range [][]*Block{c.cfg.Sources, c.cfg.Stages, c.cfg.Sinks} {
		for _, b := range list {
			if b.Name == name {
				return b
			}
		}
	}
	return nil
}

// traversalAttr returns the name after the root of a traversal such as var.name.
func traversalAttr(t hcl.Traversal) (string, bool) {
	if len(t) < 2 {
		return "", false
	}
	switch step := t[1].(type) {
	case hcl.TraverseAttr:
		return step.Name, true
	}
	return "", false
}

func traversalSuffix(t hcl.Traversal) string {
	if name, ok := traversalAttr(t); ok {
		return "." + name
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
