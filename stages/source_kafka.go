// This file holds the kafka source kind: it reads Kafka topics through a consumer group, and
// commits each record's offset to the group only once Redis has its entry. The kafka sink is
// sink_kafka.go; what both share (brokers, headers) is at the end of this file.

package stages

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flowrun/flowrun/flow"
)

// The kafka kinds' attributes.
const (
	kafkaFieldBrokers       = "brokers"
	kafkaFieldClientID      = "client_id"
	kafkaSourceFieldTopics  = "topics"
	kafkaSourceFieldGroup   = "group"
	kafkaSourceFieldStart   = "start_offset"
	kafkaSourceFieldRecords = "max_poll_records"
)

// kafkaCommitEvery is how often the source reads, from Redis, how far its records are written, and
// commits those records' offsets to the consumer group.
const kafkaCommitEvery = 100 * time.Millisecond

// The kafka source emits each record of its topics keyed by the record's key (by "topic/partition"
// for a record without one), and commits a record's offset to the consumer group only after Redis
// has it: each record's Origin.Position is a counter of the run's, which the runtime records in
// Redis with the record's entry, and a goroutine of the source reads it back (Emitter.Resume) and
// commits, per partition, the offset after the last record written. What is not committed, the group
// delivers again after a restart (a crash, a rebalance): each record's Origin.ID is its topic,
// partition and offset, the same on every delivery, which effectively-once delivery writes once.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "kafka",
			Doc: "Reads Kafka topics through a consumer group: each record (a JSON object) is passed on keyed by its " +
				"record key (\"topic/partition\" when it has none), with its record headers and trace context, and its offset " +
				"is committed to the group only once Redis has it, so a crash or an outage loses nothing; a record delivered " +
				"again is written once with delivery = \"effectively_once\" (its ID is topic/partition/offset). See docs/connectors.md.",
			Attributes: []flow.Attribute{
				kafkaBrokersAttribute,
				{Name: kafkaSourceFieldTopics, Type: flow.TypeStringList, Required: true, Doc: "The topics to read."},
				{Name: kafkaSourceFieldGroup, Type: flow.TypeString, Required: true,
					Doc: "The consumer group, which keeps the committed offsets across restarts. The source joins it as a static member " +
						"(group.instance.id: the pipeline's and the source's names), so that a restarted flowrun takes its partitions back at once."},
				{Name: kafkaSourceFieldStart, Type: flow.TypeString, Default: "earliest", Enum: []string{"earliest", "latest"},
					Doc: "Where a group without committed offsets starts on a partition (Kafka's auto.offset.reset): \"earliest\" reads " +
						"what the partition holds, \"latest\" only what is produced from then on."},
				kafkaClientIDAttribute,
				{Name: kafkaSourceFieldRecords, Type: flow.TypeInteger, Default: int64(1000), Min: flow.Bound(1),
					Doc: "The most records taken from a poll at once: fetched and not yet written to Redis."},
			},
			Example: `source "orders" {
  kind    = "kafka"
  brokers = ["127.0.0.1:9092"]
  topics  = ["orders"]
  group   = "flowrun_orders"
  output  = topic.orders
}`,
			Detail: func(c flow.Attrs) string {
				return "kafka: " + strings.Join(c.Strings(kafkaSourceFieldTopics), ",") + " group " + c.String(kafkaSourceFieldGroup)
			},
			Check: func(c *flow.KindCheck) {
				checkKafkaBrokers(c)
				if c.Config.Has(kafkaSourceFieldTopics) {
					if len(c.Config.Strings(kafkaSourceFieldTopics)) == 0 {
						c.Errorf(kafkaSourceFieldTopics, "Invalid topics", "Name at least one topic to read.")
					}
					for _, t := range c.Config.Strings(kafkaSourceFieldTopics) {
						if !kafkaTopicName(t) {
							c.Errorf(kafkaSourceFieldTopics, "Invalid topics", "%q is not a Kafka topic name: use up to 249 letters, digits, '.', '_' and '-'.", t)
						}
					}
				}
				if c.Config.Has(kafkaSourceFieldGroup) && strings.TrimSpace(c.Config.String(kafkaSourceFieldGroup)) == "" {
					c.Errorf(kafkaSourceFieldGroup, "Invalid group", "Name the consumer group.")
				}
			},
		},
		// Resumes: the runtime records each batch's last position, which is how the source learns
		// what Redis has; where to start again is Kafka's, in the group's committed offsets.
		Traits: SourceTraits{Resumes: true, Finite: func(flow.Attrs) (bool, int64) { return false, -1 }},
		New: func(s *flow.Source, env Env) (Source, error) {
			c := s.Config
			src := &kafkaSource{
				brokers: kafkaBrokers(c.Strings(kafkaFieldBrokers)), topics: c.Strings(kafkaSourceFieldTopics),
				group: c.String(kafkaSourceFieldGroup), clientID: c.String(kafkaFieldClientID),
				instance: env.Pipeline + "/" + s.Name, latest: c.String(kafkaSourceFieldStart) == "latest",
				maxRecords: int(c.Int(kafkaSourceFieldRecords)), run: NewRunID(), log: env.Logger, clock: env.Clock,
			}
			if src.log == nil {
				src.log = slog.New(slog.DiscardHandler)
			}
			if src.clock == nil {
				src.clock = SystemClock{}
			}
			src.log = src.log.With("source", s.Name, "group", src.group)
			return src, nil
		},
	})
}

// kafkaSource is a kafka source.
type kafkaSource struct {
	brokers    []string
	topics     []string
	group      string
	clientID   string
	instance   string // the group.instance.id
	latest     bool
	maxRecords int
	run        string // names this run's positions: a position of another run commits nothing
	log        *slog.Logger
	clock      Clock

	mu      sync.Mutex
	pending []kafkaInFlight          // emitted, not yet known written, in the order emitted
	emitted uint64                   // the counter of the last record emitted
	written map[kafkaPartition]int64 // per partition, the offset after the last record written, to commit
	lags    map[kafkaPartition]int64 // per partition, the high watermark less the next offset to read
}

// kafkaPartition is a topic's partition.
type kafkaPartition struct {
	topic     string
	partition int32
}

// kafkaInFlight is a record emitted and not yet known written.
type kafkaInFlight struct {
	n      uint64 // its position's counter
	at     kafkaPartition
	offset int64
	epoch  int32
}

// kafkaPosition is the position the source gives each record: the run and the record's counter in
// it. Redis's copy says that every record up to it is written.
type kafkaPosition struct {
	Run string `json:"run"`
	N   uint64 `json:"n"`
}

func (s *kafkaSource) Produce(ctx context.Context, out Emitter) error {
	s.written, s.lags = map[kafkaPartition]int64{}, map[kafkaPartition]int64{}
	start := kgo.NewOffset().AtStart()
	if s.latest {
		start = kgo.NewOffset().AtEnd()
	}
	var cl *kgo.Client
	// A partition taken away (a rebalance) first gets what Redis has committed; what was emitted
	// and is not written yet is delivered again to whoever reads the partition next.
	revoked := func(rctx context.Context, _ *kgo.Client, lost map[string][]int32) {
		s.commit(rctx, cl, out)
		s.mu.Lock()
		defer s.mu.Unlock()
		gone := map[kafkaPartition]bool{}
		for t, ps := range lost {
			for _, p := range ps {
				gone[kafkaPartition{t, p}] = true
				delete(s.written, kafkaPartition{t, p})
				delete(s.lags, kafkaPartition{t, p})
			}
		}
		keep := s.pending[:0]
		for _, f := range s.pending {
			if !gone[f.at] {
				keep = append(keep, f)
			}
		}
		s.pending = keep
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(s.brokers...), kgo.ClientID(s.clientID),
		kgo.ConsumerGroup(s.group), kgo.ConsumeTopics(s.topics...), kgo.InstanceID(s.instance),
		// The classic group protocol, whose static members take their partitions back at once
		// when they rejoin after a crash; one flowrun process at a time reads a source.
		kgo.Balancers(kgo.RoundRobinBalancer()),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(start),
		kgo.OnPartitionsRevoked(revoked), kgo.OnPartitionsLost(revoked),
	)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.commitLoop(ctx, cl, out) }()
	defer wg.Wait()
	defer cancel()

	var warned time.Time
	for {
		fetches := cl.PollRecords(ctx, s.maxRecords)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if fetches.IsClientClosed() {
			return errors.New("kafka: the client closed")
		}
		for _, e := range fetches.Errors() {
			if errors.Is(e.Err, context.Canceled) {
				continue
			}
			// The client heals what it can (brokers away, leaders moving) by itself; say so
			// now and then.
			if now := s.clock.Now(); now.Sub(warned) > 10*time.Second {
				warned = now
				s.log.Warn("kafka: reading failed; the client tries again", "topic", e.Topic, "partition", e.Partition, "err", e.Err.Error())
			}
		}
		var emitErr error
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if emitErr != nil || len(p.Records) == 0 {
				return
			}
			for _, r := range p.Records {
				if emitErr = s.pass(ctx, r, out); emitErr != nil {
					return
				}
			}
			last := p.Records[len(p.Records)-1]
			s.mu.Lock()
			s.lags[kafkaPartition{p.Topic, p.Partition}] = max(0, p.HighWatermark-last.Offset-1)
			s.mu.Unlock()
		})
		if emitErr != nil {
			return emitErr
		}
		s.mu.Lock()
		var lag int64
		for _, l := range s.lags {
			lag += l
		}
		s.mu.Unlock()
		out.ReportLag(lag)
	}
}

// pass emits one record, keyed by its key, with its headers and trace context, and notes it for
// its offset to be committed once Redis has it.
func (s *kafkaSource) pass(ctx context.Context, r *kgo.Record, out Emitter) error {
	at := kafkaPartition{r.Topic, r.Partition}
	s.mu.Lock()
	s.emitted++
	n := s.emitted
	s.pending = append(s.pending, kafkaInFlight{n: n, at: at, offset: r.Offset, epoch: r.LeaderEpoch})
	s.mu.Unlock()
	pos, _ := json.Marshal(kafkaPosition{Run: s.run, N: n}) // strings and numbers only
	where := r.Topic + "/" + strconv.Itoa(int(r.Partition))
	origin := Origin{ID: where + "/" + strconv.FormatInt(r.Offset, 10), Position: string(pos)}
	key := string(r.Key)
	if len(r.Key) == 0 {
		key = where
	}
	headers, parent, state := fromKafkaHeaders(r.Headers)
	m := NewMessage(key, r.Value, headers)
	if parent != "" {
		ctx = ContextWithTrace(ctx, parent, state)
	}
	if err := CheckPayload(r.Value); err != nil {
		// Dead-lettered, with its position: committed like a record written.
		return out.Reject(ctx, Permanent(fmt.Errorf("the record at %s offset %d is not a JSON object: %w", where, r.Offset, err)), m, origin)
	}
	return out.Emit(ctx, m, origin)
}

// commitLoop commits, every kafkaCommitEvery, the offsets of the records whose entries Redis has.
func (s *kafkaSource) commitLoop(ctx context.Context, cl *kgo.Client, out Emitter) {
	tick := s.clock.NewTicker(kafkaCommitEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// What Redis has by now, committed with a last breath (a clean stop).
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s.commit(cctx, cl, out)
			cancel()
			return
		case <-tick.C():
		}
		s.commit(ctx, cl, out)
	}
}

// commit commits to the group, per partition, the offset after the last record that Redis has:
// those up to the position the runtime recorded with the last batch written. A commit that fails
// (the brokers away) is tried again with the next; a record whose offset is never committed is
// delivered again after a restart, which effectively-once delivery writes once.
func (s *kafkaSource) commit(ctx context.Context, cl *kgo.Client, out Emitter) {
	raw, found, err := out.Resume(ctx)
	if err != nil || !found {
		return
	}
	var pos kafkaPosition
	if json.Unmarshal([]byte(raw), &pos) != nil || pos.Run != s.run {
		return
	}
	s.mu.Lock()
	i := 0
	for ; i < len(s.pending) && s.pending[i].n <= pos.N; i++ {
		s.written[s.pending[i].at] = s.pending[i].offset + 1
	}
	s.pending = s.pending[i:]
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for p, o := range s.written {
		if offsets[p.topic] == nil {
			offsets[p.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[p.topic][p.partition] = kgo.EpochOffset{Epoch: -1, Offset: o}
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return
	}
	var failed error
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			failed = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					failed = fmt.Errorf("partition %s/%d: %w", t.Topic, p.Partition, kerr.ErrorForCode(p.ErrorCode))
				}
			}
		}
	})
	if failed != nil {
		if ctx.Err() == nil {
			s.log.Debug("kafka: committing offsets failed; trying again", "err", failed.Error())
		}
		return
	}
	// Committed: forget what is not newer (a partition written since keeps its newer offset).
	s.mu.Lock()
	for t, ps := range offsets {
		for p, o := range ps {
			if s.written[kafkaPartition{t, p}] == o.Offset {
				delete(s.written, kafkaPartition{t, p})
			}
		}
	}
	s.mu.Unlock()
}

// The attributes both kafka kinds have.
var (
	kafkaBrokersAttribute = flow.Attribute{Name: kafkaFieldBrokers, Type: flow.TypeStringList, Required: true,
		Doc: "The bootstrap brokers, host:port each, such as [\"kafka1:9092\", \"kafka2:9092\"] (an entry may also list several separated by commas)."}
	kafkaClientIDAttribute = flow.Attribute{Name: kafkaFieldClientID, Type: flow.TypeString, Default: "flowrun",
		Doc: "The client.id the connections give the brokers (their logs and quotas)."}
)

// kafkaBrokers splits the brokers attribute's entries at commas.
func kafkaBrokers(list []string) []string {
	var out []string
	for _, e := range list {
		for _, b := range strings.Split(e, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
	}
	return out
}

// checkKafkaBrokers checks the brokers attribute: host:port each.
func checkKafkaBrokers(c *flow.KindCheck) {
	if !c.Config.Has(kafkaFieldBrokers) {
		return
	}
	list := kafkaBrokers(c.Config.Strings(kafkaFieldBrokers))
	if len(list) == 0 {
		c.Errorf(kafkaFieldBrokers, "Invalid brokers", "Name at least one broker, such as \"127.0.0.1:9092\".")
	}
	for _, b := range list {
		host, port, err := net.SplitHostPort(b)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n <= 0 || n > 65535 {
			c.Errorf(kafkaFieldBrokers, "Invalid brokers", "%q is not a broker address: write host:port, such as \"127.0.0.1:9092\".", b)
		}
	}
}

// kafkaTopicName is what a Kafka topic's name may be.
func kafkaTopicName(s string) bool {
	if s == "" || len(s) > 249 || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if !(r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// fromKafkaHeaders splits a record's headers into the message's (the first value of each key), and
// its W3C trace context.
func fromKafkaHeaders(hs []kgo.RecordHeader) (headers map[string]string, parent, state string) {
	for _, h := range hs {
		switch {
		case strings.EqualFold(h.Key, natsTraceparent):
			if parent == "" {
				parent = string(h.Value)
			}
		case strings.EqualFold(h.Key, natsTracestate):
			if state == "" {
				state = string(h.Value)
			}
		default:
			if headers == nil {
				headers = map[string]string{}
			}
			if _, ok := headers[h.Key]; !ok {
				headers[h.Key] = string(h.Value)
			}
		}
	}
	return headers, parent, state
}
