package redis

import (
	"fmt"
	"strconv"
	"strings"
)

// Keys builds every Redis key flowrun uses. All keys start with Prefix followed by ':'.
//
// Keys that a Lua script touches together share a hash tag (the part in braces), so that they
// live in one Redis Cluster slot; different topic partitions have different tags, so they spread
// over the shards of a cluster:
//
//	<prefix>:{<topic>:<p>}                         stream: partition p of a topic
//	<prefix>:{<topic>:<p>}:lease:<stage>           string: lease "<owner>#<token>" of stage on p
//	<prefix>:{<topic>:<p>}:lease:<stage>:fence     string: fencing-token counter (INCR)
//	<prefix>:{<topic>:<p>}:lease:<stage>:commit    string: the last effectively-once commit under it
//	<prefix>:{<topic>:<p>}:retry:<stage>           sorted set: scheduled retries of stage on p
//	<prefix>:{<topic>:<p>}:dedup:<stage>:<src>     string: effectively-once marker of an output
//	<prefix>:{<topic>:<p>}:state:<stage>           hash: a stateful stage's state on p
//	<prefix>:{<topic>:<p>}:timers:<stage>          sorted set: its durable timers on p
//	<prefix>:{<topic>:<p>}:holds:<stage>           sorted set: what holds its output watermark back on p
//	<prefix>:{<topic>:<p>}:watermarks              hash: the watermarks of the writers of p
//	<prefix>:{<topic>}:state:<stage>:partitions    string: the partition count its state is for
//	<prefix>:{<topic>}:state:<stage>:fingerprint   hash: what its state means (fingerprint, shape)
//	<prefix>:dlq:{<stage>}                         stream: dead letters of a stage
//	<prefix>:members                               sorted set: running processes, by expiry
//	<prefix>:members:<node>                        sorted set: the running processes that run node
//	<prefix>:source:{<source>}:lease               string: lease of a source that produces
//	<prefix>:source:{<source>}:position            string: how far a file source has read
//	<prefix>:{<stream tag>}:lease:<source>         string: lease of a redis_stream source
//	<prefix>:ratelimit:<stage>:<key>               string: a rate limit's next time (one key per limited key)
//
// The consumer group of a stage on each of its input partitions is named after the stage.
// Topic and stage names are HCL identifiers (see ValidName), so they cannot contain braces or
// colons and a tag is never ambiguous. See docs/redis-keys.md for who reads and writes each key.
type Keys struct {
	// Prefix starts every key, for example "flow". It must be non-empty and must not contain
	// braces (they would change the hash tag).
	Prefix string
}

// Validate reports whether the prefix is usable.
func (k Keys) Validate() error {
	if k.Prefix == "" {
		return fmt.Errorf("redis: empty key prefix")
	}
	if strings.ContainsAny(k.Prefix, "{}") {
		return fmt.Errorf("redis: key prefix %q contains a brace, which would change the cluster hash tag", k.Prefix)
	}
	if strings.ContainsAny(k.Prefix, " \t\r\n") {
		return fmt.Errorf("redis: key prefix %q contains white space", k.Prefix)
	}
	return nil
}

// ValidName reports whether name is usable as a topic, stage or consumer-group name: an HCL
// identifier, that is a letter or '_' followed by letters, digits, '_' or '-' (ASCII only).
func ValidName(name string) error {
	if name == "" {
		return fmt.Errorf("redis: empty name")
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '_':
		case i > 0 && (r >= '0' && r <= '9' || r == '-'):
		default:
			return fmt.Errorf("redis: invalid name %q: want a letter or '_' followed by letters, digits, '_' or '-'", name)
		}
	}
	return nil
}

// tag returns "{<topic>:<p>}".
func tag(topic string, partition int) string {
	return "{" + topic + ":" + strconv.Itoa(partition) + "}"
}

// Stream returns the stream key of partition p of topic: "<prefix>:{<topic>:<p>}".
func (k Keys) Stream(topic string, partition int) string {
	return k.Prefix + ":" + tag(topic, partition)
}

// Streams returns the stream keys of all partitions of a topic, in partition order.
func (k Keys) Streams(topic string, partitions int) []string {
	out := make([]string, partitions)
	for p := range out {
		out[p] = k.Stream(topic, p)
	}
	return out
}

// Lease returns the key of the lease that stage holds on partition p of its input topic:
// "<prefix>:{<topic>:<p>}:lease:<stage>". Its fencing-token counter is LeaseFence of that key.
func (k Keys) Lease(topic string, partition int, stage string) string {
	return k.Stream(topic, partition) + ":lease:" + stage
}

// LeaseFence returns the key of the fencing-token counter that belongs to a lease key:
// "<lease key>:fence". AcquireLease INCRs it; it never expires, so tokens only grow.
func LeaseFence(leaseKey string) string { return leaseKey + ":fence" }

// LeaseCommit returns the key that records the last effectively-once commit made under a lease
// on a single server (see Commit): "<lease key>:commit". It shares the lease's hash tag, and lives
// as long as the commit's DedupTTL.
func LeaseCommit(leaseKey string) string { return leaseKey + ":commit" }

// Retry returns the key of the sorted set of retries that stage has scheduled for entries of
// partition p of its input topic: "<prefix>:{<topic>:<p>}:retry:<stage>". It shares the tag of
// the input stream, so a script can move an entry there and ack it atomically.
// RateLimit returns the key of the rate limit of a stage or sink (node) for one limited key:
// "<prefix>:ratelimit:<node>:<key>". Its script touches it alone, so it needs no hash tag of ours;
// a key that holds braces puts it in the slot of what they enclose, which changes nothing.
func (k Keys) RateLimit(node, key string) string {
	return k.Prefix + ":ratelimit:" + node + ":" + key
}

func (k Keys) Retry(topic string, partition int, stage string) string {
	return k.Stream(topic, partition) + ":retry:" + stage
}

// State returns the key of the hash that holds a stateful stage's per-key state for one partition of
// its input, and Timers that of the sorted set of its durable timers (by due time in ms). Both share
// the input stream's hash tag, so that the commit that acks a batch writes its state in the same
// fenced step (CommitArgs.State), and both move with the partition's lease.
func (k Keys) State(topic string, partition int, stage string) string {
	return k.Stream(topic, partition) + ":state:" + stage
}

// Timers: see State.
func (k Keys) Timers(topic string, partition int, stage string) string {
	return k.Stream(topic, partition) + ":timers:" + stage
}

// Holds returns the key of the sorted set of a stateful stage's holds on one partition of its
// input: by time in ms, what keeps the watermark it passes on at or before that time (an open
// session's start). It shares the input stream's hash tag, like State.
func (k Keys) Holds(topic string, partition int, stage string) string {
	return k.Stream(topic, partition) + ":holds:" + stage
}

// StatePartitions returns the key that records how many partitions the input topic of a stateful
// stage had when its state was written: "<prefix>:{<topic>}:state:<stage>:partitions". Its tag is
// the topic's alone, a slot of its own: nothing else is written with it.
func (k Keys) StatePartitions(topic, stage string) string {
	return k.Prefix + ":{" + topic + "}:state:" + stage + ":partitions"
}

// StateFingerprint returns the key that records what the state of a stateful stage means, written
// when the stage first runs: "<prefix>:{<topic>}:state:<stage>:fingerprint", a hash with the
// fields fingerprint (the hash of the shape) and shape (the stage's kind, key and the attributes
// its state depends on, in words). Like StatePartitions, a slot of its own.
func (k Keys) StateFingerprint(topic, stage string) string {
	return k.Prefix + ":{" + topic + "}:state:" + stage + ":fingerprint"
}

// Dedup returns the key of an effectively-once marker: the marker that stage's output number n
// for input entry id of partition inPartition of topic inTopic was written to partition p of
// topic outTopic. It carries the OUTPUT partition's tag, so a script can write the marker and
// the XADD atomically:
// "<prefix>:{<outTopic>:<p>}:dedup:<stage>:<inTopic>:<inPartition>:<id>:<n>".
func (k Keys) Dedup(outTopic string, partition int, stage, inTopic string, inPartition int, id string, n int) string {
	return k.Stream(outTopic, partition) + ":dedup:" + stage + ":" + inTopic + ":" +
		strconv.Itoa(inPartition) + ":" + id + ":" + strconv.Itoa(n)
}

// DeadLetter returns the key of a stage's dead-letter stream: "<prefix>:dlq:{<stage>}".
func (k Keys) DeadLetter(stage string) string {
	return k.Prefix + ":dlq:{" + stage + "}"
}

// Members returns the key of the sorted set of running processes: each member is a process ID
// whose score is the time (Unix milliseconds) its membership expires unless renewed. Processes
// count the live members to share partitions fairly.
func (k Keys) Members() string { return k.Prefix + ":members" }

// NodeMembers returns the key of the sorted set of the running processes that run a source, stage
// or sink, like Members: a process's fair share of a node's partitions is their number divided by
// that set's live members, so that processes that split a pipeline (flowrun run --stages) share
// each node among those that run it.
func (k Keys) NodeMembers(node string) string { return k.Prefix + ":members:" + node }

// SourceLease returns the key of the lease that lets one process at a time run a source that
// produces messages (generate, file): "<prefix>:source:{<source>}:lease".
func (k Keys) SourceLease(source string) string {
	return k.Prefix + ":source:{" + source + "}:lease"
}

// SourcePosition returns the key of a file source's checkpoint, the position up to which its
// messages are written: "<prefix>:source:{<source>}:position". It shares the source lease's hash
// tag, so that a script can check the lease and move the position in one step.
func (k Keys) SourcePosition(source string) string {
	return k.Prefix + ":source:{" + source + "}:position"
}

// SourceUpstreamLag returns the key where the process running a source publishes the lag the
// source last reported of its upstream system (UpstreamLag): "<prefix>:source:{<source>}:upstream_lag".
func (k Keys) SourceUpstreamLag(source string) string {
	return k.Prefix + ":source:{" + source + "}:upstream_lag"
}

// StreamLease returns the key of the lease of a source that reads an external stream. It lives in
// the stream's hash slot (it carries the stream's hash tag, or the whole stream key as its tag),
// so that acks on the stream can be fenced by it: "<prefix>:{<tag>}:lease:<source>". A stream key
// with an empty tag and a closing brace ("{}x}") has no such key; flowrun does not fence its acks on
// a cluster correctly, which no sensible stream name runs into.
func (k Keys) StreamLease(stream, source string) string {
	return k.Prefix + ":{" + hashTag(stream) + "}:lease:" + source
}

// StreamDedup returns the key of an effectively-once marker for an output to a stream that is not a
// topic (a redis_stream sink's): like Dedup, in the output stream's hash slot:
// "<prefix>:{<tag>}:dedup:<stage>:<inTopic>:<inPartition>:<id>".
func (k Keys) StreamDedup(stream, stage, inTopic string, inPartition int, id string) string {
	return k.Prefix + ":{" + hashTag(stream) + "}:dedup:" + stage + ":" + inTopic + ":" +
		strconv.Itoa(inPartition) + ":" + id
}

// hashTag returns the part of a key that Redis Cluster hashes: the content of the first {...}
// with something in it, or the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// Group returns the consumer-group name of a stage: the stage name itself.
func Group(stage string) string { return stage }
