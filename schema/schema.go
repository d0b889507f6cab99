// Package schema holds the JSON Schemas of flowrun pipeline files in JSON syntax (*.hcl.json) and of
// test files in JSON syntax (*.flowtest.hcl.json), for editors and tools that generate them. The
// files are generated from the language registries in packages flow and flow/testfile (flowrun
// schema and flowrun schema --tests print the same documents); a test fails when one is stale.
package schema

import _ "embed"

// JSON is the schema document, flowrun.schema.json.
//
//go:embed flowrun.schema.json
var JSON []byte

// TestJSON is the schema document of test files, flowtest.schema.json.
//
//go:embed flowtest.schema.json
var TestJSON []byte
