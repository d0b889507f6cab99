package admin

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Report is what Redis holds for a pipeline: Inspect's result, and flowrun inspect's output (its
// JSON form is documented by the field tags).
type Report struct {
	Pipeline    string        `json:"pipeline"`
	Description string        `json:"description,omitempty"`
	KeyPrefix   string        `json:"key_prefix"`
	Redis       string        `json:"redis"` // the connection, password redacted
	Topics      []TopicReport `json:"topics"`
	// Readers are the stages and sinks, each a consumer group on every partition of its input.
	Readers []ReaderReport `json:"readers"`
	// Processes are the flowrun processes running the pipeline: the members of the pipeline's
	// members set whose membership has not lapsed, the soonest to lapse first.
	Processes []ProcessReport `json:"processes"`
	// Sources are the pipeline's sources with the holders of their leases, in declaration order.
	Sources []SourceReport `json:"sources"`
	// State is what each stateful stage keeps, per partition of its input.
	State []StateReport `json:"state"`
}

// StateReport is one partition's state of a stateful stage (a dedupe stage, say).
type StateReport struct {
	Stage     string `json:"stage"`
	Kind      string `json:"kind"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// Watermark is the stage's watermark in the partition: the event time its committed state has
	// reached, before which an event read from the partition is late (RFC 3339; "" before any).
	Watermark string `json:"watermark,omitempty"`
	// Keys are the keys the kind holds: a dedupe stage's remembered keys, an aggregate's groups
	// with open windows (the count that max_keys bounds, stages.KeyCountKey); for a kind that
	// keeps no count, its Entries.
	Keys int64 `json:"keys"`
	// MaxKeys is the stage's max_keys; 0: no limit.
	MaxKeys int64 `json:"max_keys,omitempty"`
	// Entries are the fields of the kind's state, the runtime's and the key count left out (an
	// aggregate's windows and the index of each group's; a dedupe's records, of a batch's keys each).
	Entries   int64  `json:"entries"`
	Timers    int64  `json:"timers"` // timers set, and when the next is due (RFC 3339)
	NextTimer string `json:"next_timer,omitempty"`
	// Bytes is the memory of the partition's state and timers in Redis; -1 when the server cannot
	// tell (the embedded Redis).
	Bytes int64 `json:"bytes"`
}

type ProcessReport struct {
	ID string `json:"id"`
	// ExpiresInMS is the time until the membership lapses unless the process renews it, which a
	// running process does several times per lease period.
	ExpiresInMS int64 `json:"expires_in_ms"`
	// Leases counts the leases of this report (partitions of the readers, sources) that it holds.
	Leases int `json:"leases"`
}

type SourceReport struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Output string `json:"output"`
	// LeaseKey is the key of the lease that lets one process at a time run the source; empty
	// for a source that every process runs (stdin).
	LeaseKey   string       `json:"lease_key,omitempty"`
	Lease      *LeaseReport `json:"lease,omitempty"` // nil: nobody holds it
	LeaseError string       `json:"lease_error,omitempty"`
	// Input is a redis_stream source's: the stream it reads and its consumer group there.
	Input *SourceInputReport `json:"input,omitempty"`
	// Upstream is what a source reading another system (Kafka, NATS JetStream, AMQP) last
	// reported of the messages that system still holds for it; nil when none was published in the
	// last three poll intervals (no process runs the source, or its kind reports none).
	Upstream *UpstreamReport `json:"upstream,omitempty"`
}

// UpstreamReport is a source's upstream lag as the process running it published it.
type UpstreamReport struct {
	Lag     int64     `json:"lag"`
	At      time.Time `json:"at"`
	AgeMS   int64     `json:"age_ms"` // how long ago, as of the inspection
	Process string    `json:"process"`
}

// SourceInputReport is the stream a redis_stream source reads, with the source's consumer group:
// its lag is what the source has not read yet.
type SourceInputReport struct {
	Stream string      `json:"stream"`
	Exists bool        `json:"exists"`
	Length int64       `json:"length"`
	Group  GroupReport `json:"group"`
}

type TopicReport struct {
	Name   string `json:"name"`
	Length int64  `json:"length"` // all partitions
	// Fused names the chain (flow.Chain) inside which the topic is a link: its stages pass its
	// messages in memory, and its streams hold only what a run without fusion left there.
	Fused      string            `json:"fused,omitempty"`
	Partitions []PartitionReport `json:"partitions"`
}

type PartitionReport struct {
	Partition int    `json:"partition"`
	Stream    string `json:"stream"`
	Exists    bool   `json:"exists"`
	Length    int64  `json:"length"`
	FirstID   string `json:"first_id,omitempty"`
	LastID    string `json:"last_id,omitempty"`
	// Groups are the pipeline's readers of the topic, then any other consumer group of the stream.
	Groups []GroupReport `json:"groups"`
}

type GroupReport struct {
	Group string `json:"group"`
	// Reader is "stage.NAME" or "sink.NAME"; empty for a group that the pipeline does not have.
	Reader string `json:"reader,omitempty"`
	// Exists is false when the group has not been created yet; every count is then 0.
	Exists    bool  `json:"exists"`
	Lag       int64 `json:"lag"`
	LagExact  bool  `json:"lag_exact"` // false: Lag is a lower bound
	Pending   int64 `json:"pending"`
	Consumers int64 `json:"consumers"`

	LastDeliveredID string `json:"last_delivered_id,omitempty"`
	OldestPendingID string `json:"oldest_pending_id,omitempty"`
	// OldestPendingAgeMS is the time since the oldest pending entry was written (from its ID),
	// OldestPendingIdleMS the time since it was last delivered.
	OldestPendingAgeMS      int64 `json:"oldest_pending_age_ms,omitempty"`
	OldestPendingIdleMS     int64 `json:"oldest_pending_idle_ms,omitempty"`
	OldestPendingDeliveries int64 `json:"oldest_pending_deliveries,omitempty"`

	ScheduledRetries int64        `json:"scheduled_retries"`
	Lease            *LeaseReport `json:"lease,omitempty"` // nil: nobody holds the partition
	LeaseError       string       `json:"lease_error,omitempty"`
	leaseKey         string       // the pipeline's reader's: read last (Report.readLeases)
}

type LeaseReport struct {
	Owner string `json:"owner"`
	Token int64  `json:"token"`
	TTLMS int64  `json:"ttl_ms"`
}

type ReaderReport struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"` // "stage" or "sink"
	Input string `json:"input"`
	// Lag, Pending and ScheduledRetries add up the reader's partitions.
	Lag              int64 `json:"lag"`
	LagExact         bool  `json:"lag_exact"`
	Pending          int64 `json:"pending"`
	ScheduledRetries int64 `json:"scheduled_retries"`
	// DeadLetters is the length of the reader's own dead-letter stream, DeadLetterStream.
	DeadLetters      int64  `json:"dead_letters"`
	DeadLetterStream string `json:"dead_letter_stream"`
	// DeadLetterTopic is the topic the pipeline sends the reader's dead letters to instead, if any.
	DeadLetterTopic string `json:"dead_letter_topic,omitempty"`
}

// reader is a stage or sink: a consumer group on each partition of its input topic.
type reader struct {
	name, kind string
	input      *flow.Topic
	deadLetter *flow.Topic
}

func (r reader) label() string { return r.kind + "." + r.name }

func readersOf(plan *flow.Plan) []reader {
	var rs []reader
	for _, s := range plan.Stages {
		if s.Input != nil {
			rs = append(rs, reader{name: s.Name, kind: "stage", input: s.Input, deadLetter: s.DeadLetter})
		}
	}
	for _, s := range plan.Sinks {
		if s.Input != nil {
			rs = append(rs, reader{name: s.Name, kind: "sink", input: s.Input, deadLetter: s.DeadLetter})
		}
	}
	return rs
}

// Inspect reads what Redis holds for the plan; now is the time that ages are measured from. It only
// reads: it changes nothing. A topic or consumer group that does not exist yet reads as empty.
func Inspect(ctx context.Context, c *redis.Client, plan *flow.Plan, now time.Time) (*Report, error) {
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	report := &Report{
		Pipeline: plan.Name, Description: plan.Description, KeyPrefix: plan.KeyPrefix, Redis: c.String(),
		Topics: []TopicReport{}, Readers: []ReaderReport{}, Processes: []ProcessReport{}, Sources: []SourceReport{},
		State: []StateReport{},
	}
	for _, s := range plan.Stages {
		kind, err := stages.StageKindOf(s)
		if err != nil || !kind.TraitsFor(s.Config).Stateful {
			continue
		}
		for p := 0; p < s.Input.Partitions; p++ {
			hash := keys.State(s.Input.Name, p, s.Name)
			st, err := c.StateStats(ctx, hash, keys.Timers(s.Input.Name, p, s.Name))
			if err != nil {
				return nil, err
			}
			sr := StateReport{
				Stage: s.Name, Kind: s.Kind, Topic: s.Input.Name, Partition: p, Watermark: msTime(st.Watermark),
				Keys: st.Keys, MaxKeys: stages.MaxKeys(s), Entries: st.Keys, Timers: st.Timers, NextTimer: msTime(st.NextTimer), Bytes: st.Bytes,
			}
			count, found, err := c.ReadState(ctx, hash, stages.KeyCountKey)
			if err != nil {
				return nil, err
			}
			if n, err := strconv.ParseInt(string(count), 10, 64); found && err == nil {
				sr.Keys, sr.Entries = n, st.Keys-1
			}
			report.State = append(report.State, sr)
		}
	}
	for _, s := range plan.Sources {
		sr := SourceReport{Name: s.Name, Kind: s.Kind}
		if s.Output != nil {
			sr.Output = s.Output.Name
		}
		kind, err := stages.SourceKindOf(s)
		if err != nil {
			return nil, err
		}
		if key, ok := sourceLeaseKey(keys, s, kind); ok {
			sr.LeaseKey = key // its holder is read last, with the others (readLeases)
		}
		switch up, found, err := c.ReadUpstreamLag(ctx, keys.SourceUpstreamLag(s.Name)); {
		case err != nil:
			return nil, fmt.Errorf("source %s: %w", s.Name, err)
		case found:
			sr.Upstream = &UpstreamReport{Lag: up.Lag, At: up.At, AgeMS: max(now.Sub(up.At), 0).Milliseconds(), Process: up.Process}
		}
		if kind.Stream != nil {
			in, err := sourceInput(ctx, c, s, kind.Stream(s), now)
			if err != nil {
				return nil, err
			}
			sr.Input = in
		}
		report.Sources = append(report.Sources, sr)
	}
	readers := readersOf(plan)
	totals := make(map[string]*ReaderReport, len(readers))
	for _, r := range readers {
		rr := ReaderReport{Name: r.name, Kind: r.kind, Input: r.input.Name, LagExact: true, DeadLetterStream: keys.DeadLetter(r.name)}
		if r.deadLetter != nil {
			rr.DeadLetterTopic = r.deadLetter.Name
		}
		n, err := c.StreamLen(ctx, rr.DeadLetterStream)
		if err != nil {
			return nil, fmt.Errorf("reading the dead letters of %s: %w", r.label(), err)
		}
		rr.DeadLetters = n
		report.Readers = append(report.Readers, rr)
	}
	for i := range report.Readers {
		totals[readers[i].label()] = &report.Readers[i]
	}

	for _, t := range plan.Topics {
		tr := TopicReport{Name: t.Name, Partitions: []PartitionReport{}}
		if ch, _ := plan.LinkOf(t); ch != nil {
			tr.Fused = ch.Name()
		}
		for p := 0; p < t.Partitions; p++ {
			var ours []reader
			var polled []redis.ReaderKeys
			for _, r := range readers {
				if r.input == t {
					ours = append(ours, r)
					polled = append(polled, redis.ReaderKeys{Group: redis.Group(r.name), RetryKey: keys.Retry(t.Name, p, r.name)})
				}
			}
			info, states, err := c.PollReaders(ctx, keys.Stream(t.Name, p), polled...)
			if err != nil {
				return nil, err
			}
			pr := PartitionReport{
				Partition: p, Stream: info.Stream, Exists: info.Exists, Length: info.Length,
				FirstID: info.FirstID, LastID: info.LastID, Groups: []GroupReport{},
			}
			tr.Length += info.Length
			seen := map[string]bool{}
			for i, r := range ours {
				st := states[i]
				seen[st.Group.Name] = true
				gr := GroupReport{Group: st.Group.Name, Reader: r.label()}
				if st.Exists {
					gr = groupOf(st.Group, now)
					gr.Reader = r.label()
				}
				gr.ScheduledRetries = st.Retries
				gr.leaseKey = keys.Lease(t.Name, p, r.name)
				if total := totals[r.label()]; total != nil {
					total.Lag += gr.Lag
					total.LagExact = total.LagExact && (gr.LagExact || !gr.Exists)
					total.Pending += gr.Pending
					total.ScheduledRetries += gr.ScheduledRetries
				}
				pr.Groups = append(pr.Groups, gr)
			}
			for _, g := range info.Groups {
				if !seen[g.Name] {
					pr.Groups = append(pr.Groups, groupOf(g, now))
				}
			}
			tr.Partitions = append(tr.Partitions, pr)
		}
		report.Topics = append(report.Topics, tr)
	}

	report.readLeases(ctx, c)
	members, err := c.Members(ctx, keys.Members())
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		if left := m.Expires.Sub(now); left > 0 {
			report.Processes = append(report.Processes, ProcessReport{
				ID: m.ID, ExpiresInMS: left.Milliseconds(), Leases: report.leasesHeldBy(m.ID),
			})
		}
	}
	return report, nil
}

// msTime formats Unix ms as RFC 3339 in UTC; "" for 0.
func msTime(ms int64) string {
	if ms == 0 {
		return ""
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
}

// sourceLeaseKey returns the key of the lease that a process takes to run source s, as the runtime
// does: a source that reads a stream has its lease in the stream's hash slot (Keys.StreamLease), a
// Shared source has none (every process reads its own standard input), and any other source, which
// produces messages, takes Keys.SourceLease.
func sourceLeaseKey(keys redis.Keys, s *flow.Source, kind stages.SourceKind) (string, bool) {
	switch {
	case kind.Stream != nil:
		return keys.StreamLease(kind.Stream(s).Stream, s.Name), true
	case kind.Traits.Shared:
		return "", false
	}
	return keys.SourceLease(s.Name), true
}

// sourceInput reads the stream of a source that reads one, and the source's consumer group on it.
func sourceInput(ctx context.Context, c *redis.Client, s *flow.Source, in stages.StreamSource, now time.Time) (*SourceInputReport, error) {
	stream, group := in.Stream, in.Group
	info, err := c.StreamStats(ctx, stream)
	if err != nil {
		return nil, err
	}
	report := &SourceInputReport{Stream: stream, Exists: info.Exists, Length: info.Length,
		Group: GroupReport{Group: group, Reader: "source." + s.Name}}
	for _, g := range info.Groups {
		if g.Name == group {
			report.Group = groupOf(g, now)
			report.Group.Reader = "source." + s.Name
		}
	}
	return report, nil
}

// readLeases reads who holds the lease of each source and reader of the report, in one round trip
// and after everything else: who owns what is as of the report's end, for an operator who watches
// a dead process's partitions being taken over. Nobody holding a lease leaves it nil; an unreadable
// lease is reported, not fatal.
func (r *Report) readLeases(ctx context.Context, c *redis.Client) {
	type slot struct {
		lease **LeaseReport
		err   *string
	}
	var keys []string
	var slots []slot
	for i := range r.Sources {
		if s := &r.Sources[i]; s.LeaseKey != "" {
			keys, slots = append(keys, s.LeaseKey), append(slots, slot{&s.Lease, &s.LeaseError})
		}
	}
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			for i := range p.Groups {
				if g := &p.Groups[i]; g.leaseKey != "" {
					keys, slots = append(keys, g.leaseKey), append(slots, slot{&g.Lease, &g.LeaseError})
				}
			}
		}
	}
	for i, h := range c.LeaseHolders(ctx, keys) {
		switch {
		case h.Err != nil:
			*slots[i].err = oneLine(h.Err.Error())
		case h.Held:
			*slots[i].lease = &LeaseReport{Owner: h.Lease.Owner, Token: h.Lease.Token, TTLMS: h.TTL.Milliseconds()}
		}
	}
}

// leasesHeldBy counts the leases of the report that owner holds.
func (r *Report) leasesHeldBy(owner string) int {
	n := 0
	for _, s := range r.Sources {
		if s.Lease != nil && s.Lease.Owner == owner {
			n++
		}
	}
	for _, t := range r.Topics {
		for _, p := range t.Partitions {
			for _, g := range p.Groups {
				if g.Lease != nil && g.Lease.Owner == owner {
					n++
				}
			}
		}
	}
	return n
}

// groupOf converts transport's view of an existing group.
func groupOf(g redis.GroupInfo, now time.Time) GroupReport {
	gr := GroupReport{
		Group: g.Name, Exists: true, Lag: g.Lag, LagExact: g.LagExact, Pending: g.Pending, Consumers: g.Consumers,
		LastDeliveredID: g.LastDeliveredID, OldestPendingID: g.OldestPendingID,
		OldestPendingIdleMS: g.OldestPendingIdle.Milliseconds(), OldestPendingDeliveries: g.OldestPendingDeliveries,
	}
	if g.OldestPendingID != "" {
		ms, _ := redis.IDMillis(g.OldestPendingID) // Redis's IDs always parse
		gr.OldestPendingAgeMS = max(0, now.UnixMilli()-ms)
	}
	return gr
}

// oneLine joins the lines of a message.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
