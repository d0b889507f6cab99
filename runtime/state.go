package runtime

import (
	"context"
	"sync"
	"time"
)

// A running pipeline polls the state of its streams on a timer (lag and pending per stage and
// partition, the length of every dead-letter stream), never per message. The HTTP page, the metrics
// and the progress report read the latest poll from a Snapshot.

// Snapshot is what a running pipeline is doing.
type Snapshot struct {
	Taken   time.Time
	Elapsed time.Duration
	// Nodes are this process's counters, since it started.
	Nodes []NodeSummary
	// Sources say how far the producing sources of this process are.
	Sources []SourceProgress
	// Partitions are the input partitions of the stages and sinks this process runs, with their lag
	// and pending entries over all processes, as of Polled.
	Partitions []PartitionState
	// DeadLetters is the length of each node's own dead-letter stream, as of Polled.
	DeadLetters map[string]int64
	// Polled is when the streams were last read; PollErr why the last poll failed, if it did.
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
	Name     string
	Produced int64
	Total    int64 // 0 when the source cannot tell (an endless generate source, a file, stdin)
	Done     bool
}

// PartitionState is a stage's or sink's view of one input partition.
type PartitionState struct {
	Node      string
	Topic     string
	Partition int
	Length    int64 // entries in the stream
	Lag       int64 // entries not yet delivered to the node's group
	Pending   int64 // delivered, not yet acknowledged
	Retries   int64 // waiting in the node's retry set
}

// poll is the latest poll of the streams.
type poll struct {
	mu          sync.Mutex
	at          time.Time
	err         error
	partitions  []PartitionState
	deadLetters map[string]int64
}

// pollLoop reads the streams' state every PollInterval until ctx ends.
func (r *runner) pollLoop(ctx context.Context) {
	ticker := time.NewTicker(r.opts.PollInterval)
	defer ticker.Stop()
	for {
		r.pollOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (r *runner) pollOnce(ctx context.Context) {
	var parts []PartitionState
	dead := map[string]int64{}
	err := func() error {
		for _, u := range r.units {
			if u.node.input == nil {
				continue // a source's input is someone else's stream
			}
			st, err := r.rdb.StreamStats(ctx, u.stream)
			if err != nil {
				return err
			}
			ps := PartitionState{Node: u.node.name, Topic: u.node.input.Name, Partition: u.partition, Length: st.Length, Lag: st.Length}
			for _, g := range st.Groups {
				if g.Name == u.node.group {
					ps.Lag, ps.Pending = g.Lag, g.Pending
				}
			}
			if u.retryKey != "" {
				n, err := r.rdb.ScheduledRetries(ctx, u.retryKey)
				if err != nil {
					return err
				}
				ps.Retries = n
			}
			parts = append(parts, ps)
		}
		for _, n := range r.nodes {
			length, err := r.rdb.StreamLen(ctx, r.keys.DeadLetter(n.name))
			if err != nil {
				return err
			}
			dead[n.name] = length
		}
		return nil
	}()
	r.poll.mu.Lock()
	defer r.poll.mu.Unlock()
	r.poll.at, r.poll.err = time.Now(), err
	if err == nil {
		r.poll.partitions, r.poll.deadLetters = parts, dead
	} else if ctx.Err() == nil {
		r.log.Debug("polling the streams failed", "err", err)
	}
}

// Snapshot returns what the pipeline is doing now.
func (rt *Runtime) Snapshot() Snapshot {
	r := rt.r
	s := Snapshot{Taken: time.Now()}
	if start := r.started.Load(); start != 0 {
		s.Elapsed = s.Taken.Sub(time.Unix(0, start))
	}
	s.Nodes = r.nodeSummaries()
	for _, p := range r.producers {
		s.Sources = append(s.Sources, SourceProgress{
			Name: p.node.name, Produced: p.node.stats.out.Load(), Total: p.total, Done: p.done.Load(),
		})
	}
	r.poll.mu.Lock()
	s.Polled, s.PollErr = r.poll.at, r.poll.err
	s.Partitions = append([]PartitionState(nil), r.poll.partitions...)
	s.DeadLetters = map[string]int64{}
	for k, v := range r.poll.deadLetters {
		s.DeadLetters[k] = v
	}
	r.poll.mu.Unlock()
	if own := r.own.Load(); own != nil {
		s.Leases, s.Balanced = own.holdings()
	}
	s.RedisFailingSince, _ = r.outage.failing()
	return s
}

// Ready reports whether the pipeline is working: Redis answered the last poll, recently, and this
// process holds its share of the partitions.
func (rt *Runtime) Ready() error {
	s := rt.Snapshot()
	switch {
	case s.Polled.IsZero():
		return errNotStarted
	case s.PollErr != nil:
		return s.PollErr
	case time.Since(s.Polled) > 3*rt.r.opts.PollInterval+time.Second:
		return errStalePoll
	case !s.Balanced:
		return errUnbalanced
	}
	return nil
}

var (
	errNotStarted = readinessError("the pipeline has not started")
	errStalePoll  = readinessError("Redis has not answered for a while")
	errUnbalanced = readinessError("the process has not taken its share of the partitions yet")
)

type readinessError string

func (e readinessError) Error() string { return string(e) }
