package flow

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// WriteBlocksMarkdown writes the reference of a language's blocks: a list of links, then each
// block's section. ReferenceMarkdown writes the pipeline language's with it, and package
// flow/testfile the test language's.
func WriteBlocksMarkdown(b *strings.Builder, specs []*BlockSpec) {
	b.WriteString("## Blocks\n\n")
	for _, spec := range specs {
		fmt.Fprintf(b, "- [`%s`](#%s)\n", spec.Type, spec.Type)
	}
	b.WriteString("\n")
	for _, spec := range specs {
		writeBlockDoc(b, spec)
	}
}

// ReferenceMarkdown returns the language reference, generated from Language and the function table;
// docs/reference.md holds it, and a test fails when that file is stale.
func ReferenceMarkdown() []byte {
	var b strings.Builder
	b.WriteString("# Pipeline language reference\n\n")
	b.WriteString("<!-- Generated from flowrun's language registry (flow.Language). Do not edit; run `make generate`. -->\n\n")
	b.WriteString("A pipeline is one `.hcl` (or `.hcl.json`) file, or a directory of them. Blocks refer to each other by ")
	b.WriteString("address (`topic.orders`, `stage.enrich`, `retry.standard`), in any order and across files.\n\n")
	b.WriteString("Values are computed when the pipeline compiles and may use `var.NAME`, `local.NAME`, `path.pipeline`, ")
	b.WriteString("`path.cwd` and [functions](#functions). Attributes marked *per message* are evaluated for each message ")
	b.WriteString("and may also use `msg` (the message) or, in a generate template, `index`.\n\n")
	b.WriteString("Durations are strings of numbers with units: `\"250ms\"`, `\"30s\"`, `\"5m\"`, `\"1h30m\"`, `\"7d\"` ")
	b.WriteString("(units ns, us, ms, s, m, h, d).\n\n")

	WriteBlocksMarkdown(&b, Language)
	writeFunctionDocs(&b)
	return []byte(b.String())
}

func writeBlockDoc(b *strings.Builder, spec *BlockSpec) {
	header := spec.Type
	for _, l := range spec.Labels {
		header += fmt.Sprintf(" \"%s\"", strings.ToUpper(l))
	}
	fmt.Fprintf(b, "### %s\n\n`%s { ... }`\n\n%s\n\n", spec.Type, header, spec.Doc)
	if len(spec.Attributes) > 0 {
		writeAttributeTable(b, spec.Attributes, spec)
	}
	for _, nb := range spec.Blocks {
		writeNestedBlockDoc(b, nb)
	}
	if len(spec.Kinds) == 0 {
		return
	}
	kinds := append([]*Kind(nil), spec.Kinds...)
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].Name < kinds[j].Name })
	fmt.Fprintf(b, "#### %s kinds\n\n", strings.ToUpper(spec.Type[:1])+spec.Type[1:])
	for _, k := range kinds {
		fmt.Fprintf(b, "##### %s `%s`\n\n%s\n\n", spec.Type, k.Name, k.Doc)
		if len(k.Sides) > 0 {
			fmt.Fprintf(b, "It has no `input`: its `%s` blocks name what it reads.\n\n", strings.Join(k.Sides, "` and `"))
		}
		if len(k.Attributes) > 0 {
			writeAttributeTable(b, k.Attributes, nil)
		}
		for _, nb := range k.Blocks {
			writeNestedBlockDoc(b, nb)
		}
		if k.Example != "" {
			fmt.Fprintf(b, "```hcl\n%s\n```\n\n", k.Example)
		}
	}
}

func writeNestedBlockDoc(b *strings.Builder, nb NestedBlock) {
	count := "any number of times"
	switch {
	case nb.Min == 0 && nb.Max == 1:
		count = "at most once"
	case nb.Min == 1 && nb.Max == 0:
		count = "at least once"
	case nb.Min == 1 && nb.Max == 1:
		count = "exactly once"
	}
	fmt.Fprintf(b, "Nested block `%s { ... }`, %s: %s\n\n", nb.Spec.Type, count, nb.Spec.Doc)
	writeAttributeTable(b, nb.Spec.Attributes, nil)
}

func writeAttributeTable(b *strings.Builder, attrs []Attribute, spec *BlockSpec) {
	b.WriteString("| Attribute | Type | Default | Description |\n|---|---|---|---|\n")
	for _, a := range attrs {
		typ := docType(a)
		if a.Name == "kind" && spec != nil && len(spec.Kinds) > 0 {
			typ = "one of " + backquotedList(spec.KindNames())
		}
		def := docDefault(a)
		if a.Required {
			def = "required"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", a.Name, typ, def, strings.ReplaceAll(a.Doc, "|", "\\|"))
	}
	b.WriteString("\n")
}

// docType describes an attribute's type for the reference.
func docType(a Attribute) string {
	switch {
	case a.Type == TypeTopicOrChoice:
		return "topic reference, or " + backquotedList(a.Enum)
	case a.Type == TypeAggregates:
		return "object of aggregate calls: " + backquotedList(sortedKeys(AggregateFuncs))
	case len(a.Enum) > 0 && a.Type != TypeSize:
		return "one of " + backquotedList(a.Enum)
	case a.Type == TypeReference:
		refs := make([]string, len(a.Refs))
		for i, r := range a.Refs {
			refs[i] = r + ".NAME"
		}
		return "reference: " + backquotedList(refs)
	case a.Type == TypeMessageExpr, a.Type == TypeMessageBool, a.Type == TypeMessageFields,
		a.Type == TypeMessageObject, a.Type == TypeMessageExprList:
		roots := backquotedList(a.Roots)
		if a.RootsFrom != "" {
			roots = "the names of the steps of `" + a.RootsFrom + "`"
		}
		return fmt.Sprintf("%s, per message (%s)", strings.TrimPrefix(a.Type.Describe(), "a "), roots)
	}
	t := a.Type.Describe()
	for _, p := range []string{"a ", "an "} {
		t = strings.TrimPrefix(t, p)
	}
	bound := formatBound
	if a.Type == TypeSize {
		bound = func(f float64) string { return "`" + FormatSize(Size(f)) + "`" }
	}
	if a.Min != nil && a.Max != nil {
		t += fmt.Sprintf(", %s to %s", bound(*a.Min), bound(*a.Max))
	} else if a.Min != nil {
		t += fmt.Sprintf(", at least %s", bound(*a.Min))
	} else if a.Max != nil {
		t += fmt.Sprintf(", at most %s", bound(*a.Max))
	}
	if a.Type == TypeSize && len(a.Enum) > 0 {
		t += ", or " + backquotedList(a.Enum)
	}
	return t
}

func docDefault(a Attribute) string {
	if a.DefaultDoc != "" {
		return a.DefaultDoc
	}
	switch v := a.Default.(type) {
	case nil:
		return "none"
	case string:
		return fmt.Sprintf("`%q`", v)
	case time.Duration:
		return fmt.Sprintf("`%q`", FormatDuration(v))
	case Size:
		return fmt.Sprintf("`%q`", FormatSize(v))
	}
	return fmt.Sprintf("`%v`", a.Default)
}

func backquotedList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "`" + n + "`"
	}
	return strings.Join(q, ", ")
}

// writeFunctionDocs lists every function with its parameters and description.
func writeFunctionDocs(b *strings.Builder) {
	fns := Functions(os.LookupEnv)
	b.WriteString("## Functions\n\n")
	b.WriteString("Every function works in both compile-time and per-message expressions. Calls whose arguments ")
	b.WriteString("are all known when the pipeline compiles are computed once; `env` and `file` read the ")
	b.WriteString("environment and files at compile time. `try(a, b, ...)` returns its first argument that ")
	b.WriteString("evaluates without an error, and `can(x)` whether `x` does.\n\n")
	b.WriteString("| Function | Description |\n|---|---|\n")
	for _, name := range sortedKeys(fns) {
		f := fns[name]
		var params []string
		for _, p := range f.Params() {
			params = append(params, p.Name)
		}
		if vp := f.VarParam(); vp != nil {
			params = append(params, vp.Name+"...")
		}
		desc := strings.ReplaceAll(strings.ReplaceAll(f.Description(), "\n", " "), "|", "\\|")
		fmt.Fprintf(b, "| `%s(%s)` | %s |\n", name, strings.Join(params, ", "), desc)
	}
	b.WriteString("\n")
}
