// Package runtime runs a compiled pipeline (a flow.Plan) on Redis: as a service that runs until it is
// stopped, or as a job that exits when its finite sources are exhausted and every stage is drained.
//
// Its files form groups, by what changes together; each group's types hold only what it needs of
// the run, and the runner (runner.go) makes them and hands them that.
//
//   - The public side: runtime.go (Run, New, Runtime with Snapshot and Ready), options.go (Options,
//     ConfigError), publish.go (publishing into a pipeline's topics), activity.go, and what a run
//     did and is doing as data: summary.go (Summary), state.go (Snapshot, and the poll of the
//     streams behind it), rates.go (Rates).
//   - The engine's loop: runner.go assembles the nodes of the plan (assemble.go), checks at start
//     what the run needs of Redis (access.go), shares the partitions among processes through leases
//     (ownership.go), runs a worker per partition it owns (worker.go: read; worker_batch.go: process
//     a batch; worker_commit.go: commit it in one fenced step), keeps the order of each key inside a
//     batch (lanes.go), ends a job once all work is done (drain.go), trims retained topics
//     (retention.go) and shuts down in order (stop.go). A running service takes a new plan node by
//     node (reload.go; reload_diff.go says what changed and what a reload refuses). failures.go is how the run ends on an
//     error and waits out a failing Redis (with runtime/outage); backoff.go spaces out its retries.
//   - The nodes' model, used by every group: nodes.go (node, unit, chain), message.go (message,
//     handler, and the layers' functions, pass and result), outcomes.go (what became of each
//     message, counted per node), envelope.go (a dead letter's payload).
//   - The per-message path, on processing (processing.go): layers.go and one file per layer
//     (layer_*.go: metrics, tracing, dead letters, poison messages, retries, timeouts) around a
//     node's handler (handlers.go for stages, sinks.go, source_stream.go for sources that read a
//     stream); route.go partitions outputs, deadletter.go makes dead letters, breaker.go pauses a
//     node whose downstream fails, tracing.go continues the messages' traces.
//   - Sources' writers (source_*.go), on sourceRun: producing sources and what they emit
//     (source_produce.go), the writer that puts their messages in Redis and never loses one
//     (source_write.go), and their watermarks (source_time.go).
//   - Fusion: fusion.go wires the plan's chains into the nodes at start; fused.go runs a chain's
//     messages through its stages in one hop.
//   - State, watermarks and timers, the runtime's side of package runtime/state: marks.go (a unit's
//     watermark spec, from the plan), worker_time.go (the worker's steps that move watermarks),
//     timers.go (firing a stateful stage's due timers), state_partitions.go (the partition counts
//     that state was written under, checked at start), state_fingerprints.go (what a stateful
//     stage's state means, checked at start and on a reload).
//   - What operators see: metrics.go (the instruments, registered per family), observe.go (the
//     poll of the streams and the samples behind Rates), deadletter_log.go (dead letters logged and
//     summed up).
//
// Subpackages own what needs nothing of the run: runtime/backpressure the gates of topics with a
// max_lag, runtime/outage the tracking of Redis outages, runtime/redact the log's redaction of
// secrets, runtime/state a batch's state and a partition's watermarks. What an operator does from
// outside a running pipeline (dead letters, inspect, tail, connecting to Redis) is package
// runtime/admin. Running a pipeline's test files on a virtual clock (flowrun test) is package
// runtime/flowtest.
//
// It does not parse pipelines (package flow does), implement kinds (package stages does), issue
// Redis commands itself (package transport/redis does), serve HTTP or the live page (package
// runtime/web does, from Snapshot and Ready), or format anything for a terminal (package cmd draws
// the progress line and prints the summary).
package runtime
