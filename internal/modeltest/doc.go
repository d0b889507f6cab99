// Package modeltest proves stateful results by drawing: from a seed it draws a random pipeline
// (chains and fan-outs of filter, map, route, rate_limit, dedupe, aggregate, join, pattern and
// lookup stages, lookups latest or as_of an event time, joined
// by stage references and by declared topics of random partitions and keys, with tumbling, hopping
// and session windows, aggregates of aggregates, topics that several stages write, and a table
// whose updates the test writes before the run), random input data whose disorder stays within
// every grace, and the settings to run it with (batch size, fusion, delivery, kills). It renders
// the pipeline as a pipeline file and evaluates it with a reference model: the same pipeline
// computed in memory over the whole input at once, without partitions, batches, processes, clocks
// or Redis. What the pipeline's sinks receive when it runs must equal what the model gives them,
// with nothing late.
//
// The model is written from the documented semantics of each kind (docs/reference.md), not from
// the runtime's code, so that a shared mistake is unlikely. It knows only the expressions the
// generator draws: each drawn expression carries its pipeline text and a Go function that means
// the same. The package runs nothing itself; runtime's TestGeneratedPipelines runs the draws
// (`make test` a few dozen, `make soak` hundreds, with kills and a cluster).
package modeltest
