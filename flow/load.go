package flow

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
)

// A pipeline is one file or a directory of files. Files in native syntax end in .hcl, files in JSON
// syntax in .hcl.json; both follow the same schema.
const (
	nativeExt = ".hcl"
	jsonExt   = ".hcl.json"
)

// Load reads and decodes the pipeline at path: a file, or a directory whose *.hcl and *.hcl.json files
// form one pipeline (subdirectories are not read). It always returns a Config, possibly partial, whose
// Files let the caller print the diagnostics with source snippets.
func Load(path string) (*Config, hcl.Diagnostics) {
	files, diags := pipelineFiles(path)
	cfg := newConfig(path)
	if diags.HasErrors() {
		return cfg, diags
	}
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			diags = diags.Append(&hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Cannot read pipeline file",
				Detail:   err.Error(),
			})
			continue
		}
		diags = append(diags, cfg.addSource(name, src)...)
	}
	diags = append(diags, cfg.checkComplete()...)
	return cfg, diags
}

// LoadSource decodes a pipeline from in-memory files, keyed by file name (used by tests and tools).
func LoadSource(files map[string][]byte) (*Config, hcl.Diagnostics) {
	cfg := newConfig(".")
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var diags hcl.Diagnostics
	for _, n := range names {
		diags = append(diags, cfg.addSource(n, files[n])...)
	}
	diags = append(diags, cfg.checkComplete()...)
	return cfg, diags
}

// PipelineFiles lists the files that make up the pipeline at path (the file, or the pipeline files
// of the directory), in a stable order: what flowrun run --watch looks at for changes.
func PipelineFiles(path string) ([]string, hcl.Diagnostics) { return pipelineFiles(path) }

// pipelineFiles lists the files that make up the pipeline at path, in a stable order.
func pipelineFiles(path string) ([]string, hcl.Diagnostics) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Pipeline not found",
			Detail:   fmt.Sprintf("Cannot read %s: %s.", path, DescribeFSError(err)),
		}}
	}
	if !info.IsDir() {
		if IsTestFile(path) {
			return nil, hcl.Diagnostics{{
				Severity: hcl.DiagError,
				Summary:  "Not a pipeline file",
				Detail:   fmt.Sprintf("%s is a test file; run it with flowrun test.", path),
			}}
		}
		if !isPipelineFile(path) {
			return nil, hcl.Diagnostics{{
				Severity: hcl.DiagError,
				Summary:  "Not a pipeline file",
				Detail:   fmt.Sprintf("%s: pipeline files end in %s or %s.", path, nativeExt, jsonExt),
			}}
		}
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Cannot read pipeline directory",
			Detail:   fmt.Sprintf("%s: %s.", path, DescribeFSError(err)),
		}}
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && isPipelineFile(e.Name()) {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "No pipeline files",
			Detail:   fmt.Sprintf("The directory %s holds no %s or %s files.", path, nativeExt, jsonExt),
		}}
	}
	return files, nil
}

// isPipelineFile reports whether a file name is a pipeline file's. Test files end in .hcl too
// (x.flowtest.hcl), but are no part of the pipeline.
func isPipelineFile(name string) bool {
	return (strings.HasSuffix(name, nativeExt) || strings.HasSuffix(name, jsonExt)) && !IsTestFile(name)
}

// ParseFile parses one file in the syntax its name says: JSON for a name that ends in .hcl.json
// (.flowtest.hcl.json included), native otherwise.
func ParseFile(p *hclparse.Parser, name string, src []byte) (*hcl.File, hcl.Diagnostics) {
	if strings.HasSuffix(name, jsonExt) {
		return p.ParseJSON(src, name)
	}
	return p.ParseHCL(src, name)
}
