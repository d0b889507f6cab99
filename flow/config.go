package flow

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Config is a pipeline's source representation: its blocks as written, with their ranges, across all
// of its files. Nothing in it is evaluated yet; Compile turns it into a Plan.
type Config struct {
	// Dir is the pipeline's directory (for a single-file pipeline, the file's directory).
	Dir string

	Pipeline  *Block
	Variables []*Block
	Locals    []*hcl.Attribute
	Topics    []*Block
	Tables    []*Block
	Retries   []*Block
	Sources   []*Block
	Stages    []*Block
	Sinks     []*Block

	parser *hclparse.Parser
	// syntaxErrors is set when a file does not parse; incomplete when any block has errors, so
	// that the compiler does not report consequences of a broken block as mistakes of the graph.
	syntaxErrors, incomplete bool
	// declared maps a namespace ("variable", "local", "topic", "retry", "node") and name to where
	// it was declared, to report duplicates with both places.
	declared map[string]map[string]declaration
}

// Block is one block as written: its attributes are still unevaluated expressions.
type Block struct {
	Type       string
	Name       string
	Spec       *BlockSpec
	Kind       *Kind // nil for block types without kinds, and when the kind is missing or unknown
	Attributes hcl.Attributes
	Blocks     []*Block // nested blocks, in source order

	DeclRange  hcl.Range // the block header, for diagnostics about the whole block
	LabelRange hcl.Range
	KindRange  hcl.Range
}

// Address is how other blocks refer to this one, such as "stage.enrich".
func (b *Block) Address() string { return b.Type + "." + b.Name }

// Files returns the parsed files by name, for printing diagnostics with source snippets.
func (c *Config) Files() map[string]*hcl.File { return c.parser.Files() }

func newConfig(path string) *Config {
	dir := path
	if isPipelineFile(path) {
		dir = filepath.Dir(path)
	}
	return &Config{Dir: dir, parser: hclparse.NewParser(), declared: map[string]map[string]declaration{}}
}

// topLevelSchema lists every top-level block type.
var topLevelSchema = func() *hcl.BodySchema {
	s := &hcl.BodySchema{}
	for _, b := range Language {
		s.Blocks = append(s.Blocks, hcl.BlockHeaderSchema{Type: b.Type, LabelNames: b.Labels})
	}
	return s
}()

// addSource parses one file and decodes its blocks into the Config.
func (c *Config) addSource(name string, src []byte) hcl.Diagnostics {
	f, diags := ParseFile(c.parser, name, src)
	if diags.HasErrors() {
		c.syntaxErrors = true
	}
	if f == nil || f.Body == nil {
		return diags
	}
	content, moreDiags := f.Body.Content(topLevelSchema)
	diags = append(diags, moreDiags...)
	for _, hb := range content.Blocks {
		spec := BlockSpecFor(hb.Type)
		if spec == localsSpec {
			diags = append(diags, c.addLocals(hb)...)
			continue
		}
		b, moreDiags := decodeBlock(hb, spec)
		diags = append(diags, moreDiags...)
		if moreDiags.HasErrors() {
			c.incomplete = true
		}
		if b == nil {
			continue
		}
		diags = append(diags, c.add(b)...)
	}
	return diags
}

// add files a decoded block under its type, refusing duplicate names.
func (c *Config) add(b *Block) hcl.Diagnostics {
	if b.Spec.Unique {
		if c.Pipeline != nil {
			return hcl.Diagnostics{{
				Severity: hcl.DiagError,
				Summary:  "Duplicate pipeline block",
				Detail:   fmt.Sprintf("A pipeline has one pipeline block; another is declared at %s.", c.Pipeline.DeclRange),
				Subject:  b.DeclRange.Ptr(),
			}}
		}
		c.Pipeline = b
		return nil
	}
	namespace := b.Type
	switch b.Type {
	case "source", "stage", "sink":
		namespace = "node" // their names are consumer groups and dead-letter streams: one namespace
	}
	if diags := c.declare(namespace, b.Type, b.Name, b.LabelRange); diags.HasErrors() {
		return diags
	}
	switch b.Type {
	case "variable":
		c.Variables = append(c.Variables, b)
	case "topic":
		c.Topics = append(c.Topics, b)
	case "table":
		c.Tables = append(c.Tables, b)
	case "retry":
		c.Retries = append(c.Retries, b)
	case "source":
		c.Sources = append(c.Sources, b)
	case "stage":
		c.Stages = append(c.Stages, b)
	case "sink":
		c.Sinks = append(c.Sinks, b)
	}
	return nil
}

func (c *Config) addLocals(hb *hcl.Block) hcl.Diagnostics {
	attrs, diags := hb.Body.JustAttributes()
	for _, a := range sortedAttributes(attrs) {
		if d := c.declare("local", "local value", a.Name, a.NameRange); d.HasErrors() {
			diags = append(diags, d...)
			continue
		}
		c.Locals = append(c.Locals, a)
	}
	return diags
}

// declaration is where a name was declared, and as what.
type declaration struct {
	what string
	rng  hcl.Range
}

// declare records a name in a namespace, or reports where it was declared before.
func (c *Config) declare(namespace, what, name string, rng hcl.Range) hcl.Diagnostics {
	names := c.declared[namespace]
	if names == nil {
		names = map[string]declaration{}
		c.declared[namespace] = names
	}
	if prev, ok := names[name]; ok {
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("Duplicate name %q", name),
			Detail: fmt.Sprintf("A %s named %q is already declared at %s. Names of %s must be unique.",
				prev.what, name, prev.rng, pluralOf(namespace)),
			Subject: rng.Ptr(),
		}}
	}
	names[name] = declaration{what: what, rng: rng}
	return nil
}

func pluralOf(namespace string) string {
	switch namespace {
	case "node":
		return "sources, stages and sinks (they name consumer groups and dead-letter streams)"
	case "local":
		return "local values"
	case "retry":
		return "retry policies"
	}
	return namespace + "s"
}

// checkComplete reports what a pipeline lacks as a whole once every file is read.
func (c *Config) checkComplete() hcl.Diagnostics {
	if c.Pipeline != nil {
		return nil
	}
	// Point at the first file so that the error has a location.
	var subject *hcl.Range
	names := make([]string, 0, len(c.Files()))
	for n := range c.Files() {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 0 {
		subject = &hcl.Range{Filename: names[0], Start: hcl.InitialPos, End: hcl.InitialPos}
	}
	return hcl.Diagnostics{{
		Severity: hcl.DiagError,
		Summary:  "Missing pipeline block",
		Detail:   `Every pipeline declares itself once, for example: pipeline "orders" { key_prefix = "orders" }.`,
		Subject:  subject,
	}}
}

// decodeBlock checks a block against its declaration: labels, kind, attribute names, nested blocks and
// required attributes. Values are evaluated later, by Compile.
func decodeBlock(hb *hcl.Block, spec *BlockSpec) (*Block, hcl.Diagnostics) {
	b := &Block{Type: hb.Type, Spec: spec, DeclRange: hb.DefRange}
	var diags hcl.Diagnostics
	if len(hb.Labels) > 0 {
		b.Name, b.LabelRange = hb.Labels[0], hb.LabelRanges[0]
		if !hclsyntax.ValidIdentifier(b.Name) {
			diags = diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  fmt.Sprintf("Invalid %s name", hb.Type),
				Detail: fmt.Sprintf("%q cannot be referenced as %s.%s: a name starts with a letter and holds only "+
					"letters, digits, underscores and dashes.", b.Name, hb.Type, b.Name),
				Subject: b.LabelRange.Ptr(),
			})
			return nil, diags // nothing could refer to it
		}
	}

	body := hb.Body
	if len(spec.Kinds) > 0 {
		var kindDiags hcl.Diagnostics
		b.Kind, b.KindRange, body, kindDiags = decodeKind(hb, spec)
		diags = append(diags, kindDiags...)
	}

	attrs, blocks := spec.attributes(b.Kind), spec.blocks(b.Kind)
	var content *hcl.BodyContent
	var moreDiags hcl.Diagnostics
	if len(spec.Kinds) > 0 && b.Kind == nil {
		// Without a valid kind, attribute names cannot be checked without drowning the kind error.
		content, _, moreDiags = body.PartialContent(bodySchema(attrs, blocks))
	} else {
		foreign := foreignKindAttributes(spec, b.Kind)
		content, moreDiags = body.Content(bodySchema(append(append([]Attribute(nil), attrs...), foreign...), blocks))
		diags = append(diags, misplacedAttributes(content, spec, b.Kind, foreign)...)
	}
	diags = append(diags, moreDiags...)
	b.Attributes = content.Attributes
	delete(b.Attributes, "kind")

	if !(len(spec.Kinds) > 0 && b.Kind == nil) {
		diags = append(diags, checkRequired(hb, attrs, content)...)
	}
	nested, moreDiags := decodeNestedBlocks(hb, blocks, content.Blocks)
	b.Blocks = nested
	diags = append(diags, moreDiags...)
	return b, diags
}

// decodeKind reads a block's kind attribute, which must be a literal string naming a known kind.
func decodeKind(hb *hcl.Block, spec *BlockSpec) (*Kind, hcl.Range, hcl.Body, hcl.Diagnostics) {
	content, rest, diags := hb.Body.PartialContent(&hcl.BodySchema{
		Attributes: []hcl.AttributeSchema{{Name: "kind"}},
	})
	attr, ok := content.Attributes["kind"]
	if !ok {
		return nil, hb.DefRange, rest, diags.Append(&hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("Missing %s kind", spec.Type),
			Detail: fmt.Sprintf("A %s needs a kind attribute; the kinds are %s.",
				spec.Type, QuotedList(spec.KindNames())),
			Subject: hb.DefRange.Ptr(),
		})
	}
	// With a nil context, a JSON string comes back literally and a native expression with any
	// reference fails: the kind must be written out, so that the schema can be known without evaluating.
	v, valDiags := attr.Expr.Value(nil)
	if valDiags.HasErrors() || v.IsNull() || !v.Type().Equals(cty.String) || !v.IsKnown() {
		return nil, attr.Expr.Range(), rest, diags.Append(&hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid kind",
			Detail:   fmt.Sprintf("The kind must be a literal string, one of %s.", QuotedList(spec.KindNames())),
			Subject:  attr.Expr.Range().Ptr(),
		})
	}
	name := v.AsString()
	k := spec.Kind(name)
	if k == nil {
		detail := fmt.Sprintf("There is no %s kind %q.%s The kinds are %s.",
			spec.Type, name, DidYouMean(name, spec.KindNames()), QuotedList(spec.KindNames()))
		return nil, attr.Expr.Range(), rest, diags.Append(&hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("Unknown %s kind", spec.Type),
			Detail:   detail,
			Subject:  attr.Expr.Range().Ptr(),
		})
	}
	return k, attr.Expr.Range(), rest, diags
}

// foreignKindAttributes lists the attributes that other kinds of the block type declare and this one
// does not, so that using one gets a message naming the kinds it belongs to.
func foreignKindAttributes(spec *BlockSpec, k *Kind) []Attribute {
	if k == nil {
		return nil
	}
	own := map[string]bool{}
	for _, a := range spec.attributes(k) {
		own[a.Name] = true
	}
	var out []Attribute
	for _, other := range spec.Kinds {
		for _, a := range other.Attributes {
			if !own[a.Name] {
				own[a.Name] = true
				out = append(out, Attribute{Name: a.Name})
			}
		}
	}
	return out
}

// misplacedAttributes reports attributes that belong to other kinds than the block's.
func misplacedAttributes(content *hcl.BodyContent, spec *BlockSpec, k *Kind, foreign []Attribute) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, f := range foreign {
		attr, ok := content.Attributes[f.Name]
		if !ok {
			continue
		}
		delete(content.Attributes, f.Name)
		var owners []string
		for _, other := range spec.Kinds {
			if _, ok := findAttribute(other.Attributes, f.Name); ok {
				owners = append(owners, other.Name)
			}
		}
		diags = diags.Append(&hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Unsupported argument",
			Detail: fmt.Sprintf("A %s %s has no argument %q; it belongs to the %s kind%s of %s.",
				k.Name, spec.Type, f.Name, strings.Join(owners, ", "), plural(len(owners)), spec.Type),
			Subject: attr.NameRange.Ptr(),
		})
	}
	return diags
}

// checkRequired reports required attributes that are absent, pointing at the block header.
func checkRequired(hb *hcl.Block, attrs []Attribute, content *hcl.BodyContent) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, a := range attrs {
		if !a.Required || a.Name == "kind" {
			continue
		}
		if _, ok := content.Attributes[a.Name]; !ok {
			diags = diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Missing required argument",
				Detail:   fmt.Sprintf("The argument %q is required here: %s", a.Name, a.Doc),
				Subject:  hb.DefRange.Ptr(),
			})
		}
	}
	return diags
}

// decodeNestedBlocks decodes nested blocks and checks how many of each there are.
func decodeNestedBlocks(parent *hcl.Block, allowed []NestedBlock, hbs hcl.Blocks) ([]*Block, hcl.Diagnostics) {
	var out []*Block
	var diags hcl.Diagnostics
	counts := map[string]int{}
	for _, hb := range hbs {
		var spec *BlockSpec
		var most int
		for _, nb := range allowed {
			if nb.Spec.Type == hb.Type {
				spec, most = nb.Spec, nb.Max
			}
		}
		counts[hb.Type]++
		if most > 0 && counts[hb.Type] > most {
			diags = diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  fmt.Sprintf("Duplicate %s block", hb.Type),
				Detail:   fmt.Sprintf("A %s block may hold at most %d %s block%s.", parent.Type, most, hb.Type, plural(most)),
				Subject:  hb.DefRange.Ptr(),
			})
			continue
		}
		b, moreDiags := decodeBlock(hb, spec)
		diags = append(diags, moreDiags...)
		out = append(out, b)
	}
	for _, nb := range allowed {
		if counts[nb.Spec.Type] < nb.Min {
			diags = diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  fmt.Sprintf("Missing %s block", nb.Spec.Type),
				Detail: fmt.Sprintf("This %s needs at least %d %s block%s: %s", parent.Type, nb.Min,
					nb.Spec.Type, plural(nb.Min), nb.Spec.Doc),
				Subject: parent.DefRange.Ptr(),
			})
		}
	}
	return out, diags
}

// sortedAttributes returns attributes in source order, since hcl returns them in a map.
func sortedAttributes(attrs hcl.Attributes) []*hcl.Attribute {
	out := make([]*hcl.Attribute, 0, len(attrs))
	for _, a := range attrs {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return rangeLess(out[i].Range, out[j].Range) })
	return out
}

func rangeLess(a, b hcl.Range) bool {
	if a.Filename != b.Filename {
		return a.Filename < b.Filename
	}
	return a.Start.Byte < b.Start.Byte
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
