package runtime

import (
	"sync"
	"time"
)

// A running pipeline polls the state of its streams on a timer (lag and pending per stage and
// partition, each stateful stage's watermark per partition, the length of every dead-letter
// stream), never per message. The HTTP page, the metrics and the progress report read the latest
// poll from a Snapshot.

// Snapshot is what a running pipeline is doing.
type Snapshot struct {
	Taken   time.Time
	Elapsed time.Duration
	// Nodes are this process's counters, since it started.
	Nodes []NodeSummary
	// Sources say how far the producing sources of this process are.
	Sources []SourceProgress
	// Partitions are the input partitions of the stages and sinks this process runs, and the streams
	// of its redis_stream sources, with their lag and pending entries over all processes, as of
	// Polled.
	Partitions []PartitionState
	// DeadLetters is the length of each node's own dead-letter stream, as of Polled.
	DeadLetters map[string]int64
	// Rates are the nodes' rates over the last few seconds, from the runtime's own samples.
	Rates Rates
	// Polled is when the streams were last read; PollErr why the last poll failed to read some of
	// them, if it did (their state is then the last one read).
	Polled  time.Time
	PollErr error
	// Leases counts the partition leases this process holds; Balanced says that it holds its fair
	// share (or more, while it gives units up), or less only because other processes hold the
	// rest: no partition it lacks is free.
	Leases   int
	Balanced bool
	// RedisFailingSince is when calls to Redis began to fail, while they fail; zero otherwise.
	RedisFailingSince time.Time
}

// SourceProgress is how far a producing source is.
type SourceProgress struct {
	Name string
	// Produced counts the messages it produced that Redis has: written to its topic, or rejected
	// to its dead letters (its in, see NodeSummary).
	Produced int64
	Total    int64 // 0 when the source cannot tell (an endless generate source, a file, stdin)
	Done     bool
	// Unwritten counts the messages and rejects the source produced that are not in Redis yet.
	Unwritten int64
	// UpstreamLag is what the source last reported of the messages its upstream system still
	// holds for it (stages.Emitter.ReportLag: a Kafka group's lag, a JetStream consumer's pending
	// count, an AMQP queue's depth); -1 when it reports none, or this process does not run it now.
	UpstreamLag int64
}

// PartitionState is a stage's or sink's view of one input partition, or a redis_stream source's
// view of its stream.
type PartitionState struct {
	Node      string
	Topic     string // "" for a redis_stream source, which reads a stream of no topic
	Stream    string // the stream's key
	Partition int    // 0 for a redis_stream source
	Length    int64  // entries in the stream
	Lag       int64  // entries not yet delivered to the node's group
	Pending   int64  // delivered, not yet acknowledged
	Retries   int64  // waiting in the node's retry set
	// Watermark is a stateful stage's own watermark in the partition, as committed with its state
	// (redis.WatermarkField, read as flowrun inspect --state reads it); zero for other nodes and
	// before the stage has one.
	Watermark time.Time

	unit *unit // whose state it is, to keep it when a poll fails to read it
}

// poll is the latest poll of the streams.
type poll struct {
	mu          sync.Mutex
	at          time.Time
	err         error
	partitions  []PartitionState
	deadLetters map[string]int64
}

var (
	errNotStarted = readinessError("the pipeline has not started")
	errStalePoll  = readinessError("Redis has not answered for a while")
	errUnbalanced = readinessError("the process has not taken its share of the partitions yet")
)

type readinessError string

func (e readinessError) Error() string { return string(e) }
