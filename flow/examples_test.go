package flow_test

import (
	"bytes"
	"flag"
	. "github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/internal/fixturetest"
	_ "github.com/flowrun/flowrun/stages"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden and generated files instead of comparing with them")

const examplesDir = "../examples/pipelines"

// examplePipelines lists the example pipelines: the directories and single files of examplesDir.
func examplePipelines(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(examplesDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() || IsPipelineFile(e.Name()) {
			out = append(out, filepath.Join(examplesDir, e.Name()))
		}
	}
	if len(out) < 4 {
		t.Fatalf("found %d example pipelines in %s, want at least 4", len(out), examplesDir)
	}
	return out
}

// exampleName is an example's name for golden files: its directory or file name without extension.
func exampleName(path string) string {
	base := filepath.Base(path)
	return strings.TrimSuffix(strings.TrimSuffix(base, JSONExt), NativeExt)
}

func TestExamplesAreValidWithoutWarnings(t *testing.T) {
	for _, path := range examplePipelines(t) {
		t.Run(exampleName(path), func(t *testing.T) {
			plan, _, diags := Build(path, Options{})
			for _, d := range diags {
				t.Errorf("%s: %s: %s", d.Subject, d.Summary, d.Detail)
			}
			if plan == nil {
				return
			}
			if len(plan.Sinks) == 0 {
				t.Errorf("example %s has no sink: an example should show where its messages go", path)
			}
		})
	}
}

func TestExamplesAreFormatted(t *testing.T) {
	for _, path := range examplePipelines(t) {
		files, diags := FormatFiles(path)
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if ok, diags := IsFormatted(f, src); !ok || diags.HasErrors() {
				t.Errorf("%s is not formatted: run make fmt", f)
			}
		}
	}
}

func TestGraphGolden(t *testing.T) {
	for _, path := range examplePipelines(t) {
		plan, _, diags := Build(path, Options{})
		if diags.HasErrors() {
			t.Fatalf("%s: %s", path, diags)
		}
		for _, format := range GraphFormats {
			var buf bytes.Buffer
			if err := WriteGraph(&buf, plan, format); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "graphs", exampleName(path)+"."+format)
			fixturetest.Golden(t, golden, buf.Bytes(), *update)
		}
	}
}

// TestGraphRendersWithDot renders every example's DOT graph with Graphviz, which rejects malformed
// DOT. Without dot installed the test is skipped, unless FLOWRUN_REQUIRE_TOOLS is set (as in CI).
func TestGraphRendersWithDot(t *testing.T) {
	dot, err := exec.LookPath("dot")
	if err != nil {
		if os.Getenv("FLOWRUN_REQUIRE_TOOLS") != "" {
			t.Fatal("Graphviz's dot is not installed (apt-get install graphviz)")
		}
		t.Skip("Graphviz's dot is not installed")
	}
	for _, path := range examplePipelines(t) {
		plan, _, diags := Build(path, Options{})
		if diags.HasErrors() {
			t.Fatalf("%s: %s", path, diags)
		}
		var src bytes.Buffer
		if err := WriteGraph(&src, plan, "dot"); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(dot, "-Tsvg")
		cmd.Stdin = &src
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		svg, err := cmd.Output()
		if err != nil || stderr.Len() > 0 {
			t.Errorf("dot -Tsvg on %s: %v\n%s", path, err, stderr.String())
			continue
		}
		for _, s := range plan.Stages {
			if !bytes.Contains(svg, []byte(">"+s.Name+"<")) {
				t.Errorf("the SVG of %s does not show stage %s", path, s.Name)
			}
		}
	}
}

func TestReferenceDocsGenerated(t *testing.T) {
	fixturetest.Golden(t, "../docs/reference.md", ReferenceMarkdown(), *update)
}
