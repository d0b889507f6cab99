// Package schema holds the JSON Schema of flowrun pipeline files in JSON syntax (*.hcl.json), for
// editors and tools that generate pipelines. The file is generated from the language registry in
// package flow (flowrun schema prints the same document); a test fails when it is stale.
package schema

import _ "embed"

// JSON is the schema document, flowrun.schema.json.
//
//go:embed flowrun.schema.json
var JSON []byte
