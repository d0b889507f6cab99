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
//   - source_produce.go, source_write.go, source_stream.go and sinks.go: how the runtime runs the
//     source and sink kinds of package stages (producing sources, their writer, sources that read a
//     stream, sinks).
//
// It does not parse pipelines (package flow does), implement kinds (package stages does), or
// issue Redis commands itself (package transport/redis does).
package runtime
