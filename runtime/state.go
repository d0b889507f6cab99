package runtime

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/sourcegraph/conc"

	redis "github.com/flowrun/flowrun/transport/redis"
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
	// share (or more, while it gives units up).
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

// poller reads the state of the streams for Snapshot, readiness and metrics (poll), and samples
// the counters for the rates (observe.go): of the nodes and units this process runs, with the
// client, the options' intervals, and the per-message path's clock, keys and logger.
type poller struct {
	*processing
	rdb   *redis.Client
	opts  *Options
	nodes []*node
	units []*unit
	poll  *poll         // the runner's, which Snapshot reads
	obs   *observations // the runner's
}

// pollLoop reads the streams' state every PollInterval until ctx ends. It also runs observeLoop,
// which samples the counters every second: a poll of Redis may take longer than that.
func (r *poller) pollLoop(ctx context.Context) {
	var wg conc.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.observeLoop(ctx) })
	ticker := r.clock.NewTicker(r.opts.PollInterval)
	defer ticker.Stop()
	for {
		r.pollOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

// pollOnce reads the state of every unit's input and every dead-letter stream. A stream that does
// not exist yet (nothing was written to it) reads as empty. A read that fails spoils only its own
// unit or stream, which keeps its last known state: the others are still shown, and the error is
// kept for readiness.
func (r *poller) pollOnce(ctx context.Context) {
	r.poll.mu.Lock()
	previous, previousDead := r.poll.partitions, r.poll.deadLetters
	r.poll.mu.Unlock()
	last := map[*unit]PartitionState{}
	for _, ps := range previous {
		last[ps.unit] = ps
	}

	var parts []PartitionState
	dead := map[string]int64{}
	var firstErr error
	for _, u := range r.units {
		ps, err := r.pollUnit(ctx, u)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			var ok bool
			if ps, ok = last[u]; !ok {
				continue
			}
		}
		parts = append(parts, ps)
	}
	for _, n := range r.nodes {
		length, err := r.rdb.StreamLen(ctx, r.keys.DeadLetter(n.name))
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			var ok bool
			if length, ok = previousDead[n.name]; !ok {
				continue
			}
		}
		dead[n.name] = length
	}
	r.poll.mu.Lock()
	defer r.poll.mu.Unlock()
	r.poll.at, r.poll.err = r.clock.Now(), firstErr
	r.poll.partitions, r.poll.deadLetters = parts, dead
	if firstErr != nil && ctx.Err() == nil {
		r.log.Debug("polling the streams failed", "err", firstErr)
	}
}

// pollUnit reads one unit's input: a partition of a topic, or a redis_stream source's stream; for
// a stateful stage, its own watermark in the partition too.
func (r *poller) pollUnit(ctx context.Context, u *unit) (PartitionState, error) {
	ps := PartitionState{unit: u, Node: u.node.name, Stream: u.stream, Partition: u.partition}
	if u.node.input != nil {
		ps.Topic = u.node.input.Name
	}
	info, states, err := r.rdb.PollReaders(ctx, u.stream, redis.ReaderKeys{Group: u.node.group, RetryKey: u.retryKey})
	if err != nil {
		return ps, err
	}
	st := states[0]
	ps.Length, ps.Lag, ps.Pending, ps.Retries = info.Length, st.Lag, st.Pending, st.Retries
	if u.node.stateful {
		wm, found, err := r.rdb.Watermark(ctx, r.keys.State(u.node.input.Name, u.partition, u.node.name))
		if err != nil {
			return ps, err
		}
		if found {
			ps.Watermark = time.UnixMilli(wm).UTC()
		}
	}
	return ps, nil
}

var (
	errNotStarted = readinessError("the pipeline has not started")
	errStalePoll  = readinessError("Redis has not answered for a while")
	errUnbalanced = readinessError("the process has not taken its share of the partitions yet")
)

type readinessError string

func (e readinessError) Error() string { return string(e) }
