package runtime_test

import (
	"path/filepath"
	"testing"

	"github.com/flowrun/flowrun/flow"
)

// The pipelines that several tests share are files in testdata/, named after their pipeline blocks
// and commented with what they are for; a pipeline that one test alone uses stays in that test.

// buildTestdata compiles the pipeline testdata/name (a file, or a directory of files) as build
// does, with a key prefix of the test's own.
func buildTestdata(t *testing.T, name string, vars ...string) *flow.Plan {
	t.Helper()
	return build(t, filepath.Join("testdata", name), vars...)
}

// testdataSource returns the text of the pipeline file testdata/name, for a test that changes it.
func testdataSource(t *testing.T, name string) string {
	t.Helper()
	return readFile(t, filepath.Join("testdata", name))
}
