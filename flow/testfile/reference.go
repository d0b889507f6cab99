package testfile

import (
	"fmt"
	"strings"

	"github.com/flowrun/flowrun/flow"
)

// JSONSchemaID identifies the schema of test files; schema/flowtest.schema.json holds the generated file.
const JSONSchemaID = "https://github.com/flowrun/flowrun/schema/flowtest.schema.json"

// JSONSchema returns the JSON Schema of test files in JSON syntax (*.flowtest.hcl.json), derived
// from Language as flow.JSONSchema is from flow.Language.
func JSONSchema() []byte {
	return flow.LanguageJSONSchema(JSONSchemaID, "flowrun pipeline test",
		"A flowrun test file in HCL's JSON syntax. Generated from flowrun's test language (testfile.Language) by `flowrun schema --tests`; do not edit.",
		Language)
}

// ReferenceMarkdown returns the reference of the test language, generated from Language;
// docs/testing-reference.md holds it, and a test fails when that file is stale.
func ReferenceMarkdown() []byte {
	var b strings.Builder
	b.WriteString("# Test language reference\n\n")
	b.WriteString("<!-- Generated from flowrun's test language (testfile.Language). Do not edit; run `make generate`. -->\n\n")
	fmt.Fprintf(&b, "A test file ends in `%s` (or `%s` in HCL's JSON syntax). For a pipeline directory D, its test files are ", flow.TestFileExt, flow.TestFileJSONExt)
	fmt.Fprintf(&b, "`D/*%s` and `D/%s/*%s`; for a pipeline file `D/x.hcl`, they are `D/x%s` and `D/%s/x%s`, ", flow.TestFileExt, flow.TestDir, flow.TestFileExt, flow.TestFileExt, flow.TestDir, flow.TestFileExt)
	b.WriteString("and every test file of D and D/tests when x.hcl is D's only pipeline file. `flowrun validate` checks them ")
	b.WriteString("and `flowrun test` runs them.\n\n")
	b.WriteString("References name the pipeline's blocks without quotes: `topic.orders`, `source.orders`, `stage.score` ")
	b.WriteString("(a stage's implicit output, where a topic is expected), `sink.out`. An assert's condition may use ")
	b.WriteString("`output`, `dead_letters`, `metrics` and the pipeline language's [functions](reference.md#functions); ")
	b.WriteString("`output.NAME` is the sink named NAME if there is one, else the topic (`output[\"score.out\"]` for an implicit output).\n\n")
	flow.WriteBlocksMarkdown(&b, Language)
	return []byte(b.String())
}
