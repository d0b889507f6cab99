package flow

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// A pipeline's test files sit beside it, and the pipeline loader knows them by name only: to skip
// them, and to list them with their pipeline (FindTestFiles, for flowrun fmt, validate and test).
// What is in them, the test-file language, is package flow/testfile's.
const (
	TestFileExt     = ".flowtest.hcl"
	TestFileJSONExt = ".flowtest.hcl.json"
	// TestDir is the directory under a pipeline's directory where its test files may also live.
	TestDir = "tests"
)

// IsTestFile reports whether a path names a test file (.flowtest.hcl or .flowtest.hcl.json), which
// the pipeline loader skips.
func IsTestFile(path string) bool {
	return strings.HasSuffix(path, TestFileExt) || strings.HasSuffix(path, TestFileJSONExt)
}

// FindTestFiles returns the test files of the pipeline at path, sorted. The rule is by name only,
// so that a user can predict it:
//
//   - for a pipeline directory D: D/*.flowtest.hcl[.json] and D/tests/*.flowtest.hcl[.json];
//   - for a pipeline file D/x.hcl (or D/x.hcl.json): D/x.flowtest.hcl[.json] and
//     D/tests/x.flowtest.hcl[.json], and, when x is D's only pipeline file, every test file of D and
//     D/tests as for a directory;
//   - for a test file: that file (its pipeline is TestFilePipeline's).
//
// A pipeline without test files gets none and no diagnostic.
func FindTestFiles(path string) ([]string, hcl.Diagnostics) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Pipeline not found",
			Detail:   fmt.Sprintf("Cannot read %s: %s.", path, DescribeFSError(err)),
		}}
	}
	switch {
	case info.IsDir():
		return testFilesIn(path, ""), nil
	case IsTestFile(path):
		return []string{path}, nil
	case !isPipelineFile(path):
		return nil, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Not a pipeline file",
			Detail:   fmt.Sprintf("%s: pipeline files end in %s or %s.", path, nativeExt, jsonExt),
		}}
	}
	dir := filepath.Dir(path)
	if onlyPipelineFile(dir, path) {
		return testFilesIn(dir, ""), nil
	}
	return testFilesIn(dir, pipelineBase(filepath.Base(path))), nil
}

// TestFilePipeline returns the pipeline that a test file tests: the directory it is in, or the
// directory above when it is in a tests directory.
func TestFilePipeline(testPath string) string {
	dir := filepath.Dir(testPath)
	if filepath.Base(dir) == TestDir {
		return filepath.Dir(dir)
	}
	return dir
}

// testFilesIn lists the test files of dir and dir/tests, sorted; with base, only those named
// base.flowtest.hcl[.json].
func testFilesIn(dir, base string) []string {
	var out []string
	for _, d := range []string{dir, filepath.Join(dir, TestDir)} {
		entries, err := os.ReadDir(d) // a missing tests directory has no test files
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !IsTestFile(name) || base != "" && testBase(name) != base {
				continue
			}
			out = append(out, filepath.Join(d, name))
		}
	}
	sort.Strings(out)
	return out
}

// onlyPipelineFile reports whether path is the only pipeline file of dir.
func onlyPipelineFile(dir, path string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if !e.IsDir() && isPipelineFile(e.Name()) && e.Name() != filepath.Base(path) {
			return false
		}
	}
	return true
}

// pipelineBase is a pipeline file's name without its extension.
func pipelineBase(name string) string {
	if strings.HasSuffix(name, jsonExt) {
		return strings.TrimSuffix(name, jsonExt)
	}
	return strings.TrimSuffix(name, nativeExt)
}

// testBase is a test file's name without its extension.
func testBase(name string) string {
	if strings.HasSuffix(name, TestFileJSONExt) {
		return strings.TrimSuffix(name, TestFileJSONExt)
	}
	return strings.TrimSuffix(name, TestFileExt)
}
