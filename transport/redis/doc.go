// Package redis is the only package of flowrun that speaks Redis commands. It owns the key
// layout, the partition hash, the wire format of stream entries, consumer groups, the batched
// producer, group reads, the fenced commit (outputs plus acks), reclaim of idle entries, leases
// with fencing tokens, retention trimming and inspection. It works on a single Redis server
// (including an embedded miniredis, for the paths miniredis supports) and on a Redis Cluster;
// every Lua script touches keys of one hash tag only.
//
// What it deliberately does not do:
//
//   - No pipeline semantics: it does not know stages, DAGs, retry policies or ordering modes.
//     Callers (the runtime) decide what to read, what to write, when to ack and when to
//     dead-letter; this package makes each of those one efficient, correct Redis operation.
//   - No decoding of payloads: a payload is JSON bytes; DecodeEntry only checks that it is valid
//     JSON (and builds a JSON object from the fields of a "flat" entry written by another
//     application). Interpreting the JSON is the caller's business.
//   - No retry policy: a failed call returns a wrapped error (errors.Is/As work on ErrLeaseLost,
//     ErrNoGroup, *MalformedEntryError and the go-redis errors underneath). Whether and when to
//     retry is the caller's decision; even go-redis's own retry after network errors is off
//     unless Options.MaxRetries asks for it (except for what a cluster client does to follow
//     redirections, see Options.MaxRetries), and a connection is dialled once (see
//     Options.DialAttempts). go-redis's own log lines are silenced for the same reason.
//
// Every call that can block takes a context. Cancellation interrupts a call that is waiting for
// a connection or for a reply with a deadline; a blocking XREADGROUP already on the wire returns
// at the latest when its Block duration ends.
//
// The key layout is documented in docs/redis-keys.md and in Keys. The partition hash is
// Partition.
package redis
