// Package testfile is flowrun's test-file language: it reads test files (NAME.flowtest.hcl, or
// NAME.flowtest.hcl.json in JSON syntax), checks them against the pipeline they test, and
// describes the language in its JSON Schema and reference docs.
//
// A test file holds tests of the pipeline beside it or above its tests/ directory; flowrun test
// runs them and flowrun validate checks them.
//
//   - file.go is the model: File and its mocks, overrides, runs, steps, sends and expectations.
//   - spec.go declares the language as package flow declares the pipeline language, as BlockSpecs
//     (Language). The decoder takes its hcl schemas from them, and the JSON Schema and the
//     reference (reference.go) are generated from them.
//   - decode.go reads a file as far as it can without the pipeline (Load, LoadSource): every
//     block, attribute (attributes.go) and message (messages.go), and references to the
//     pipeline's blocks kept as written.
//   - check.go resolves those references against a flow.Plan (File.Check), and LoadAndCheck finds,
//     loads and checks every test file of a pipeline; eval.go evaluates an assert's condition.
//
// Package flow is what this package builds on, never the other way round: it compiles the
// pipeline (flow.Build), words and orders diagnostics, and supplies the spec machinery and the
// function table. It also owns the test files' names (flow.TestFileExt, flow.FindTestFiles),
// since the pipeline loader skips them and flowrun fmt lists them with their pipeline.
//
// This package does not run tests: package runtime/flowtest runs a checked File against the
// pipeline on an embedded Redis and a virtual clock.
package testfile
