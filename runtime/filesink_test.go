package runtime_test

import (
	"path/filepath"
	"testing"

	"github.com/flowrun/flowrun/runtime"
)

const fileSinkPipeline = `
pipeline "files" {}
variable "out" {}
variable "mode" {}
topic "in" {}
source "gen" {
  kind     = "generate"
  count    = 3
  output   = topic.in
  template = { n = index }
}
sink "out" {
  kind  = "file"
  input = topic.in
  path  = var.out
  mode  = var.mode
}
`

// TestFileSinkModes: a file sink makes the directories its path needs; append (the default) adds
// to what the file holds, truncate replaces it.
func TestFileSinkModes(t *testing.T) {
	c := server.open(t)
	out := filepath.Join(t.TempDir(), "not", "yet", "there", "out.jsonl")
	want := "{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n"
	for _, step := range []struct {
		mode, want string
	}{
		{"append", want},        // into directories that do not exist yet
		{"append", want + want}, // a second run adds its lines
		{"truncate", want},      // replaces both runs' lines
		{"truncate", want},
	} {
		plan := buildSource(t, fileSinkPipeline, "out="+out, "mode="+step.mode)
		runJob(t, c, plan, runtime.Options{})
		if got := readFile(t, out); got != step.want {
			t.Fatalf("mode %s: the file holds\n%s\nwant\n%s", step.mode, got, step.want)
		}
	}
}
