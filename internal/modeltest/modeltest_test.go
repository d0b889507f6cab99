package modeltest

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// Every drawn pipeline is valid, the same seed draws the same pipeline, and the draws cover each
// way a lookup misses and each way a table is keyed.
func TestDrawsCompile(t *testing.T) {
	dir := t.TempDir()
	drawn := map[string]int{}
	for seed := uint64(1); seed <= 300; seed++ {
		d := New(seed)
		for _, s := range d.Pipeline.Stages {
			if s.Kind == "lookup" {
				drawn["missing = "+s.Missing]++
			}
			if s.Kind == "rate_limit" {
				drawn["a rate_limit"]++
			}
			if s.Kind == "lookup" {
				if s.AsOf != nil {
					drawn["a lookup as_of"]++
					if asOfFeedsState(d.Pipeline, s) {
						drawn["a stateful stage after a lookup as_of"]++
					}
				}
			}
		}
		for _, tb := range d.Pipeline.Tables {
			switch {
			case tb.Input.Key == nil:
				drawn["a topic keyed by the messages' keys"]++
			case tb.Key == nil || tb.Key.HCL == tb.Input.Key.HCL:
				drawn["a table keyed like its topic"]++
			default:
				drawn["a table keyed otherwise"]++
			}
		}
		files := Files{KeyPrefix: "drawn", Stream: func(s string) string { return "drawn:" + s }}
		for i := range d.Inputs {
			files.Inputs = append(files.Inputs, filepath.Join(dir, "in"+strconv.Itoa(i)+".jsonl"))
		}
		src := d.HCL(files)
		if again := New(seed).HCL(files); again != src {
			t.Fatalf("seed %d drew two pipelines:\n%s\n%s", seed, src, again)
		}
		cfg, diags := flow.LoadSource(map[string][]byte{"drawn.hcl": []byte(src)})
		if !diags.HasErrors() {
			_, diags = flow.Compile(cfg, flow.Options{GoFuncs: stages.Names()})
		}
		if diags.HasErrors() {
			t.Fatalf("seed %d: %s\n%s", seed, diags, src)
		}
		if len(d.Expected()) != len(d.Pipeline.Sinks) {
			t.Fatalf("seed %d: the model has no output for some sinks", seed)
		}
	}
	for _, what := range []string{"missing = null", "missing = drop", "missing = dead_letter",
		"a lookup as_of", "a stateful stage after a lookup as_of", "a rate_limit",
		"a topic keyed by the messages' keys", "a table keyed like its topic", "a table keyed otherwise"} {
		if drawn[what] == 0 {
			t.Errorf("no draw of 300 has %s", what)
		}
	}
}

// asOfFeedsState reports whether a stateful stage reads what lookup passes on, straight or
// through stateless stages.
func asOfFeedsState(p *Pipeline, lookup *Stage) bool {
	for _, s := range p.Stages {
		if s.Input != (Ref{Stage: lookup}) && (lookup.Output == nil || s.Input != (Ref{Topic: lookup.Output})) {
			continue
		}
		switch s.Kind {
		case "aggregate", "dedupe", "pattern", "join":
			return true
		case "filter", "map", "lookup":
			if asOfFeedsState(p, s) {
				return true
			}
		}
	}
	return false
}
