// Package flow is flowrun's pipeline language: it reads HCL pipeline files, checks them, and
// compiles them into a Plan, the only thing the runtime sees.
//
// The work happens in stages, each in its own place:
//
//   - load.go and config.go parse the files (native .hcl and JSON .hcl.json) and decode each block
//     against its declaration into a Config, the source representation, without evaluating anything.
//     files.go knows a pipeline's test files by name, to skip them and to list them (FindTestFiles).
//   - spec.go and the types.*.go files declare the language: every block type and its attributes.
//     The kinds of sources, stages and sinks are declared by the files that implement them (package
//     stages, or a package of the user's) and reach the language through RegisterKind. Validation,
//     the JSON Schema (jsonschema.go) and the reference docs (refdocs.go) are generated from these
//     declarations, so a binary's schema and docs show the kinds compiled into it.
//   - eval.go, values.go and references.go evaluate attributes: config-time expressions (var, local,
//     path, functions) once, references to other blocks by address, and per-message expressions
//     (msg) compiled by package flow/expr into closures.
//   - compile.go and dag.go assemble the Plan and check the graph: cycles, unused topics, stage order.
//   - graph.go is the one graph view of a Plan (Plan.Graph: nodes, edges, implicit topics drawn as
//     edges, labels) and renders it as DOT or Mermaid, or the Plan as JSON; the live page of package
//     runtime/web lays out the same view. format.go is flowrun fmt.
//
// Every problem is an hcl.Diagnostic with a source range, and all of them are reported at once;
// diagnostics.go words and orders them (DidYouMean, SortDiagnostics, ...) and gives their JSON form.
//
// The test-file language (*.flowtest.hcl) is package flow/testfile's. It builds on this package:
// Build, the spec machinery (BlockSpec, LanguageJSONSchema, WriteBlocksMarkdown), the function
// table and the diagnostics helpers; this package never imports it.
//
// This package does not run anything and does not know Redis: key layout, partition hashing and
// delivery belong to packages runtime and transport/redis. It implements no kind either: without
// package stages linked in, it knows no source, stage or sink kind.
package flow
