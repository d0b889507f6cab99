// Package admin is the operator's side of flowrun: what an operator (or a program acting as one)
// does to a pipeline's Redis from outside a running pipeline. The flowrun commands dlq, inspect,
// reset and tail are built on it, and every command opens Redis through it.
//
//   - connect.go: opening Redis (URLs, TLS files) and telling why a connection failed.
//   - deadletters.go: a node's dead letters: list, show, replay to the node that gave them up, purge.
//   - replay_edits.go: the edits that replay makes to each payload on the way back (dlq replay --set).
//   - inspect.go: what Redis holds for a pipeline: processes, source leases, and per topic
//     partition and reader the lag, pending entries, scheduled retries and lease holder.
//   - reset.go: what a pipeline keeps in Redis, found by scanning its key prefix on every master and
//     recognising the names the runtime writes, and removing it while no process runs the pipeline.
//   - tail.go: reading a topic's entries, merged across partitions, without a consumer group.
//
// It does not run pipelines (package runtime does), print anything (package cmd formats what it
// returns for the terminal), or issue Redis commands itself (package transport/redis does). It
// reads and changes only what the runtime's key layout defines, so a running pipeline sees its
// changes as it would a peer process's. Publishing into a pipeline's topics is runtime.Publisher:
// it shares its routing, encoding and max_lag gates with the engine's own writers.
package admin
