package flow_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/flowrun/flowrun/flow"
)

func TestFindTestFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(names ...string) {
		for _, n := range names {
			p := filepath.Join(dir, n)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	rel := func(paths []string) []string {
		out := []string{}
		for _, p := range paths {
			r, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(r))
		}
		return out
	}
	find := func(path string) []string {
		t.Helper()
		got, diags := FindTestFiles(filepath.Join(dir, path))
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		return rel(got)
	}
	write("one/p.hcl", "one/p.flowtest.hcl", "one/other.flowtest.hcl.json", "one/tests/q.flowtest.hcl", "one/tests/notes.txt",
		"many/a.hcl", "many/b.hcl.json", "many/a.flowtest.hcl", "many/b.flowtest.hcl", "many/tests/b.flowtest.hcl.json", "many/tests/c.flowtest.hcl")
	cases := map[string][]string{
		// a directory: every test file of it and of its tests directory
		"one":  {"one/other.flowtest.hcl.json", "one/p.flowtest.hcl", "one/tests/q.flowtest.hcl"},
		"many": {"many/a.flowtest.hcl", "many/b.flowtest.hcl", "many/tests/b.flowtest.hcl.json", "many/tests/c.flowtest.hcl"},
		// the only pipeline file of its directory: as the directory
		"one/p.hcl": {"one/other.flowtest.hcl.json", "one/p.flowtest.hcl", "one/tests/q.flowtest.hcl"},
		// one of several: only the test files of its name
		"many/a.hcl":      {"many/a.flowtest.hcl"},
		"many/b.hcl.json": {"many/b.flowtest.hcl", "many/tests/b.flowtest.hcl.json"},
		// a test file: itself
		"many/tests/c.flowtest.hcl": {"many/tests/c.flowtest.hcl"},
	}
	for path, want := range cases {
		if got := find(path); !slices.Equal(got, want) {
			t.Errorf("FindTestFiles(%s) = %q, want %q", path, got, want)
		}
	}
	if got := TestFilePipeline(filepath.Join("many", "tests", "c.flowtest.hcl")); got != "many" {
		t.Errorf("TestFilePipeline(many/tests/c) = %q", got)
	}
	if got := TestFilePipeline(filepath.Join("one", "p.flowtest.hcl")); got != "one" {
		t.Errorf("TestFilePipeline(one/p) = %q", got)
	}
	if _, diags := FindTestFiles(filepath.Join(dir, "one", "tests", "notes.txt")); !diags.HasErrors() {
		t.Error("a file that is neither a pipeline nor a test file has test files")
	}
}

func TestLoaderSkipsTestFiles(t *testing.T) {
	dir := t.TempDir()
	for name, src := range map[string]string{
		"shop.hcl":                  `pipeline "shop" {}`,
		"shop.flowtest.hcl":         `run "r" {}`, // no pipeline file
		"tests/x.flowtest.hcl.json": `{}`,
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, diags := Load(dir)
	if diags.HasErrors() || len(cfg.Files()) != 1 {
		t.Fatalf("files %v, diagnostics %s", cfg.Files(), diags)
	}
	if IsPipelineFile("x.flowtest.hcl") || IsPipelineFile("x.flowtest.hcl.json") || !IsPipelineFile("x.hcl") {
		t.Error("IsPipelineFile does not tell test files from pipeline files")
	}
	_, diags = Load(filepath.Join(dir, "shop.flowtest.hcl"))
	if !diags.HasErrors() || !strings.Contains(diags.Error(), "is a test file; run it with flowrun test") {
		t.Errorf("loading a test file as a pipeline: %s", diags)
	}
}
