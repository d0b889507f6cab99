package modeltest

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// Every drawn pipeline is valid, and the same seed draws the same pipeline.
func TestDrawsCompile(t *testing.T) {
	dir := t.TempDir()
	for seed := uint64(1); seed <= 300; seed++ {
		d := New(seed)
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
}
