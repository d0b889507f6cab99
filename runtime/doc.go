// Package runtime runs a compiled pipeline (a flow.Plan) on Redis: as a service that runs until it is
// stopped, or as a job that exits when its finite sources are exhausted and every stage is drained.
//
// The moving parts, each in its own file:
//
//   - runtime.go: Run, its Options, and the assembly of nodes (sources, stages, sinks) from the plan.
//   - ownership.go: which process works on which partition. Processes register as members and share
//     the partitions of every stage and sink through leases; a dead process's partitions move to the
//     others within a lease period.
//   - worker.go: the loop of one node on one partition: read a batch with XREADGROUP, process it,
//     and commit the batch's outputs and acks in one round trip, fenced by the partition's lease.
//   - lanes.go: parallel processing inside a batch that keeps the order of each key.
//   - deadletter.go: failed and malformed messages go to dead-letter streams, never lost, never looped.
//   - drain.go: job mode's test for "all work done".
//   - layers.go and layer_*.go: the policies around a node's handler, one file each: metrics,
//     tracing, dead letters, poison messages, retries, timeouts.
//   - source_produce.go, source_write.go, source_stream.go and sinks.go: how the runtime runs the
//     source and sink kinds of package stages (producing sources, their writer, sources that read a
//     stream, sinks).
//   - state.go, summary.go and rates.go: what a run is doing and did, as data (Snapshot, Ready,
//     Summary, Rates) for the programs that show it.
//
// What an operator does from outside a running pipeline (dead letters, inspect, tail, connecting
// to Redis) is package runtime/admin; publishing into a pipeline's topics is publish.go here.
// Running a pipeline's test files on a virtual clock (flowrun test) is package runtime/flowtest.
//
// It does not parse pipelines (package flow does), implement kinds (package stages does), issue
// Redis commands itself (package transport/redis does), serve HTTP or the live page (package
// runtime/web does, from Snapshot and Ready), or format anything for a terminal (package cmd draws
// the progress line and prints the summary).
package runtime
