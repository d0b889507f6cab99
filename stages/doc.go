// Package stages is what a pipeline is built from: every kind of source, stage and sink, and the
// public API through which Go code adds its own (Go stage functions, and whole kinds).
//
// Each kind is one file, named by its family and its name: source_file.go is the file source,
// sink_http.go the http sink, stage_map.go the map stage. The file registers the kind once, in
// init, with its spec (attributes and docs, which the language, the JSON Schema and the reference
// docs are made from), its traits (what the runtime must know to run it) and its constructor:
// RegisterSource, RegisterStage, RegisterSink (kinds.go). A kind too large for one file keeps its
// registration and its processor there, and its parts beside it, named for the kind:
// aggregate_window.go, aggregate_session.go and aggregate_accumulator.go are the aggregate's.
//
// The contracts a constructor returns are in component.go: a Source produces through an Emitter,
// a Processor turns a message into outputs, a Sink delivers, and a stateful stage is a
// StatefulStage, which declares what it does besides processing; each gets an Env (logger, clock,
// meter, HTTP client). jsonlines.go holds what the file and stdin sources share; message.go,
// json.go and errors.go the message and its errors; eventtime.go a message's event time.
//
// A team's package registers its Go stage functions in init:
//
//	func init() {
//		stages.Register("acme.score", func(ctx context.Context, m stages.Message) ([]stages.Message, error) {
//			m.Value["score"] = score(m.Value)
//			return []stages.Message{m}, nil
//		}, stages.KeepsKey())
//	}
//
// and a custom binary blank-imports that package and calls cmd.Main (see examples/plugins, which
// also registers a sink kind of its own). KeepsKey declares that the function passes every message
// on with the key it got, so that the stage after it may run fused with it. A pipeline then uses
// the function with kind = "go" and func = "acme.score". A function that keeps state per key, with
// timers in event time, registers with RegisterStateful instead (a StatefulFunc), and gets the
// stage's State. func.go holds the types of the functions, registry.go the registry of them by
// name, and stage_go.go the kind that runs them.
//
// This package does not load code at run time: Go's plugin package is deliberately not used, as
// version skew between host and plugin breaks loading, it needs cgo, and plugins cannot be unloaded.
// It never speaks to Redis either, nor schedules anything: the runtime reads, batches, retries,
// dead-letters, acknowledges, and writes what kinds return (a sink's Writes included).
package stages
