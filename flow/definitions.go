package flow

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// A running pipeline reloads its files (flowrun run --watch, SIGHUP) node by node: what did not
// change goes on, what changed restarts. Two hashes tell them apart, both made here from the
// blocks as written, so that a reload compares what the user wrote and nothing the compiler
// derived:
//
//   - a node's definition (Plan.Definitions): its block's kind, attributes and nested blocks, each
//     attribute's expression by its source text, with the values of the variables and locals it
//     reads and the definitions of the topics, retry policies and tables it names. Formatting and
//     comments do not count; neither do the contents of files read by file() nor environment
//     variables read by env() (they are read again on a reload, but a change of them alone changes
//     no definition).
//   - a stateful stage's state shape (Plan.StateShapes): what its state means, the part of its
//     definition that the state kept in Redis depends on (its kind, the key its state is kept by,
//     and the attributes its kind lists in Kind.StateShape: an aggregate's window and aggregate
//     set). Its hash is the stage's state fingerprint, which the runtime keeps in Redis.

// The rendering of a state shape is recorded in Redis: a change of how shapes are rendered would
// change every stateful stage's fingerprint, and the runtime would refuse them all after an upgrade.
// TestDefinitionsChangeWithWhatTheyRead holds it fixed.

// StateFingerprint is the hash of a state shape, as the runtime records it in Redis.
func StateFingerprint(shape string) string { return hashOf(shape) }

// definer renders blocks as written, for Plan.Definitions and Plan.StateShapes.
type definer struct {
	c      *compiler
	blocks map[string]*Block // topics, retries and tables, by address
	memo   map[string]string // their renderings, by address; "" while one is being rendered
}

// computeDefinitions fills Plan.Definitions and Plan.StateShapes once the plan is compiled.
func (c *compiler) computeDefinitions(stageBlocks map[*Stage]*Block) {
	d := &definer{c: c, blocks: map[string]*Block{}, memo: map[string]string{}}
	for _, list := range [][]*Block{c.cfg.Topics, c.cfg.Retries, c.cfg.Tables} {
		for _, b := range list {
			d.blocks[b.Address()] = b
		}
	}
	p := c.plan
	p.Definitions, p.StateShapes = map[string]string{}, map[string]string{}
	for i, s := range p.Sources {
		if i < len(c.cfg.Sources) {
			p.Definitions["source."+s.Name] = hashOf(d.block(c.cfg.Sources[i], nil))
		}
	}
	for i, s := range p.Sinks {
		if i < len(c.cfg.Sinks) {
			p.Definitions["sink."+s.Name] = hashOf(d.block(c.cfg.Sinks[i], nil))
		}
	}
	for _, s := range p.Stages {
		b := d.stageBlock(s, stageBlocks)
		if b == nil {
			continue
		}
		def := d.block(b, nil)
		if s.Kind == RepartitionKind {
			// Made by the compiler for the stage it repartitions for: its definition is that
			// stage's, as a repartition of one side.
			def = "repartition " + s.Side + " for " + def
		}
		p.Definitions["stage."+s.Name] = hashOf(def)
		if s.Spec != nil && s.Spec.Stateful != nil && s.Spec.Stateful(s.Config) {
			p.StateShapes[s.Name] = d.stateShape(s, b)
		}
	}
}

// stageBlock returns the block a stage is written in: its own, for a stage the compiler inserted
// (a repartition) that of the stage it was inserted for, for a table's stage the table's.
func (d *definer) stageBlock(s *Stage, own map[*Stage]*Block) *Block {
	if b := own[s]; b != nil {
		return b
	}
	if s.Repartitions != nil {
		return d.stageBlock(s.Repartitions, own)
	}
	if s.Kind == TableKind {
		return d.blocks["table."+strings.TrimSuffix(s.Name, tableSuffix)]
	}
	return nil
}

// stateShape says what a stateful stage's state means: its kind, the key its state is kept by
// (its kind's StateKey attribute, or the messages' keys: its input topic's key), and the attributes
// and blocks its kind lists in StateShape.
func (d *definer) stateShape(s *Stage, b *Block) string {
	var sb strings.Builder
	sb.WriteString("kind = " + s.Kind)
	keyed := false
	if k := s.Spec.StateKey; k != "" {
		if a, ok := b.Attributes[k]; ok {
			sb.WriteString("\n" + k + " = " + d.expr(a.Expr))
			keyed = true
		}
	}
	if !keyed && s.Input != nil {
		key := "the key it arrived with"
		if s.Input.Key != nil {
			key = s.Input.Key.String()
		}
		sb.WriteString("\nkey = " + key)
	}
	shape := map[string]bool{}
	for _, name := range s.Spec.StateShape {
		shape[name] = true
	}
	if len(shape) > 0 {
		if rest := d.block(b, func(name string) bool { return shape[name] }); rest != "" {
			sb.WriteString("\n" + rest)
		}
	}
	return sb.String()
}

// block renders a block: its kind, then its attributes by name, then its nested blocks in order;
// with only, just the attributes and nested blocks it names, and nothing of the block itself.
func (d *definer) block(b *Block, only func(name string) bool) string {
	var lines []string
	if only == nil {
		head := strings.TrimSpace(b.Type + " " + b.Name)
		if b.Kind != nil {
			head += " kind = " + b.Kind.Name
		}
		lines = append(lines, head)
	}
	names := make([]string, 0, len(b.Attributes))
	for name := range b.Attributes {
		if only == nil || only(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		lines = append(lines, name+" = "+d.expr(b.Attributes[name].Expr))
	}
	for _, nb := range b.Blocks {
		if only == nil || only(nb.Type) {
			lines = append(lines, "{ "+strings.ReplaceAll(d.block(nb, nil), "\n", "; ")+" }")
		}
	}
	return strings.Join(lines, "\n")
}

// expr renders an expression: its source text, then what it reads of the configuration (the
// values of variables and locals, the definitions of the blocks it names).
func (d *definer) expr(e hcl.Expression) string {
	out := d.source(e.Range())
	seen := map[string]bool{}
	for _, t := range e.Variables() {
		addr := t.RootName()
		if len(t) > 1 {
			if a, ok := t[1].(hcl.TraverseAttr); ok {
				addr += "." + a.Name
			}
		}
		if seen[addr] {
			continue
		}
		seen[addr] = true
		switch t.RootName() {
		case "var", "local":
			if v, diags := t.TraverseAbs(d.c.ctx); !diags.HasErrors() {
				out += " [" + addr + " = " + v.GoString() + "]"
			}
		case "topic", "retry", "table":
			out += " [" + addr + ": " + d.named(addr) + "]"
		}
	}
	return out
}

// named renders the topic, retry or table block at addr, once.
func (d *definer) named(addr string) string {
	if r, ok := d.memo[addr]; ok {
		return r // "" when addr is being rendered: a cycle, which the compiler reported
	}
	b := d.blocks[addr]
	if b == nil {
		return ""
	}
	d.memo[addr] = ""
	r := strings.ReplaceAll(d.block(b, nil), "\n", "; ")
	d.memo[addr] = r
	return r
}

// source returns the text of a range of a pipeline file, as its tokens without comments, with
// one space where there was any between them, so that layout does not count.
func (d *definer) source(r hcl.Range) string {
	f := d.c.cfg.Files()[r.Filename]
	if f == nil || r.End.Byte > len(f.Bytes) || r.Start.Byte > r.End.Byte {
		return fmt.Sprintf("%s:%d", r.Filename, r.Start.Line)
	}
	text := f.Bytes[r.Start.Byte:r.End.Byte]
	tokens, diags := hclsyntax.LexExpression(text, r.Filename, r.Start)
	if diags.HasErrors() {
		return string(text)
	}
	var sb strings.Builder
	end := -1 // where the last token written ended
	for _, t := range tokens {
		switch t.Type {
		case hclsyntax.TokenComment, hclsyntax.TokenNewline, hclsyntax.TokenEOF:
			continue
		}
		if end >= 0 && t.Range.Start.Byte > end {
			sb.WriteByte(' ')
		}
		sb.Write(t.Bytes)
		end = t.Range.End.Byte
	}
	return sb.String()
}

// hashOf is the hash of a definition.
func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}
