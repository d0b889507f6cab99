package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The kafka sink's attributes (brokers and client_id are the source's).
const (
	kafkaSinkFieldTopic   = "topic"
	kafkaSinkFieldKey     = "key"
	kafkaSinkFieldTimeout = "timeout"
	kafkaSinkFieldMaxSize = "max_message_bytes"
)

// kafkaIDHeader is the record header that names the entry a record was produced from (the
// pipeline, the sink, the input partition and the entry's ID), the same on every delivery of the
// entry: a consumer that must see each entry once drops a record whose flowrun-id it has seen.
const kafkaIDHeader = "flowrun-id"

// The kafka sink produces each message to the topic its expression gives, with the idempotent
// producer and acks=all, and the runtime acknowledges the message's entry only once every in-sync
// replica has it. A Kafka that is away pauses the sink; a record Kafka refuses (too large, no such
// topic, invalid) is dead-lettered with Kafka's reason. A delivery the runtime attempts again in
// the same process waits for the record already produced instead of producing it twice.
//
// After a crash, an entry whose record Kafka had and that was not acknowledged in Redis yet comes
// again. With at-least-once delivery it is produced again, with the same flowrun-id header. With
// effectively-once delivery the sink first reads back what the topic holds since the entry was made
// (kafka_readback.go) and produces only the entries whose records are not there.
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "kafka",
			Doc: "Produces each message to Kafka, to the topic its expression gives, keyed by the message's key (or the key " +
				"expression's), with the message's headers and trace context as record headers, through the idempotent " +
				"producer with acks=all. The entry is acknowledged only once Kafka has confirmed the record. Kafka away pauses " +
				"the sink; a record Kafka refuses (too large, no such topic) is dead-lettered with the reason. With delivery = " +
				"\"effectively_once\", an entry delivered again after a crash is produced only when a read-back of the topic " +
				"does not find its record (by its flowrun-id header). See docs/connectors.md.",
			Attributes: []flow.Attribute{
				kafkaBrokersAttribute,
				{Name: kafkaSinkFieldTopic, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg", "key"},
					Doc: "The topic to produce each message to, which must exist unless the brokers create topics, such as " +
						"\"orders\" or \"orders.${msg.region}\"; key is the message's key."},
				{Name: kafkaSinkFieldKey, Type: flow.TypeMessageExpr, Roots: []string{"msg", "key"},
					Doc: "The record key, which picks the partition (Kafka's default partitioner: murmur2 of the key, as the Java " +
						"client's), such as \"${msg.customer}\"; default: the message's key, so a key's messages stay in order in one " +
						"partition. A key that is \"\" produces a record without one."},
				kafkaClientIDAttribute,
				{Name: kafkaSinkFieldMaxSize, Type: flow.TypeSize, Default: flow.Size(1000012), Min: flow.Bound(1024), Max: flow.Bound(1 << 30),
					Doc: "The largest record batch the sink sends, as the brokers' message.max.bytes (default: Kafka's, 1000012 bytes): " +
						"a record larger than this is refused with MESSAGE_TOO_LARGE before it is sent, and dead-lettered, as the brokers would refuse it."},
				{Name: kafkaSinkFieldTimeout, Type: flow.TypeDuration, Default: 10 * time.Second,
					Doc: "How long Kafka may take to confirm a batch of records (Kafka's delivery.timeout.ms for each record)."},
			},
			Example: `sink "shipped" {
  kind    = "kafka"
  input   = stage.shipped
  brokers = ["127.0.0.1:9092"]
  topic   = "shipped"
  key     = "${msg.customer}"
}`,
			Check: func(c *flow.KindCheck) {
				checkKafkaBrokers(c)
				if c.Config.Duration(kafkaSinkFieldTimeout) <= 0 {
					c.Errorf(kafkaSinkFieldTimeout, "Invalid timeout", "Give a duration above 0, such as \"10s\".")
				}
			},
		},
		Traits: SinkTraits{Inline: true}, // a batch at a time, in order: DeliverBatch produces it at once
		New: func(s *flow.Sink, env Env) (Sink, error) {
			k := &kafkaSink{
				brokers: kafkaBrokers(s.Config.Strings(kafkaFieldBrokers)), clientID: s.Config.String(kafkaFieldClientID),
				topic: s.Config.Expr(kafkaSinkFieldTopic), timeout: s.Config.Duration(kafkaSinkFieldTimeout),
				maxBytes: int32(s.Config.Size(kafkaSinkFieldMaxSize)),
				idPrefix: env.Pipeline + "/" + s.Name + "/", inflight: map[string]*kafkaProduce{},
			}
			if s.Delivery == flow.EffectivelyOnce {
				k.readBack, k.log = &kafkaReadBack{scans: map[string]*kafkaScan{}}, env.Logger
			}
			if s.Config.Has(kafkaSinkFieldKey) {
				k.key = s.Config.Expr(kafkaSinkFieldKey)
			}
			return k, nil
		},
	})
}

// kafkaSink is a kafka sink. Its client connects with its first delivery.
type kafkaSink struct {
	brokers  []string
	clientID string
	topic    *expr.Program
	key      *expr.Program // nil: the message's key
	timeout  time.Duration
	maxBytes int32  // the largest record batch
	idPrefix string // of the flowrun-id header
	// readBack finds the records of redelivered entries that are in Kafka already; nil with
	// at-least-once delivery.
	readBack *kafkaReadBack
	log      *slog.Logger

	mu sync.Mutex
	cl *kgo.Client
	// inflight are the records produced and not yet reported delivered to the runtime, by the
	// entry's partition and ID: a delivery attempted again while its record is still on its way
	// (or confirmed after the runtime stopped waiting) waits for it rather than producing it twice.
	inflight map[string]*kafkaProduce
}

// kafkaProduce is a record on its way to Kafka.
type kafkaProduce struct {
	topic string
	done  chan struct{}
	err   error // set before done closes
}

func (s *kafkaSink) Timeout() time.Duration { return s.timeout }

// Deliver is DeliverBatch's for one message (the runtime calls DeliverBatch only).
func (s *kafkaSink) Deliver(ctx context.Context, m *Message, out []Write) ([]Write, error) {
	parent, state := TraceFrom(ctx)
	d := []Delivery{{Message: m, Traceparent: parent, Tracestate: state}}
	s.DeliverBatch(ctx, d)
	return out, d[0].Err
}

// DeliverBatch produces the batch, in order (so each key's order holds in its partition), and waits
// until Kafka has confirmed every record. With effectively-once delivery, the records of
// redelivered entries that Kafka has already are not produced again.
func (s *kafkaSink) DeliverBatch(ctx context.Context, batch []Delivery) {
	cl, err := s.client()
	if err != nil {
		for i := range batch {
			batch[i].Err = err
		}
		return
	}
	produced := make([]*kafkaProduce, len(batch))
	records := make([]*kgo.Record, len(batch))
	ids := make([]string, len(batch))
	var redelivered []int
	for i := range batch {
		ids[i] = strconv.Itoa(batch[i].Partition) + "/" + batch[i].ID
		if p := s.waiting(ids[i]); p != nil && batch[i].ID != "" {
			produced[i] = p
			continue
		}
		if records[i], err = s.record(batch[i], ids[i]); err != nil {
			batch[i].Err = err
			continue
		}
		if s.readBack != nil && batch[i].Redelivered && batch[i].ID != "" {
			redelivered = append(redelivered, i)
		}
	}
	if len(redelivered) == 0 {
		s.readBack.expire(time.Now()) // the crash is behind: what was read back is no longer needed
	} else if err := s.skipWritten(ctx, cl, batch, records, redelivered); err != nil {
		for i := range records {
			if records[i] != nil {
				records[i], batch[i].Err = nil, err // nothing is produced before the check is done
			}
		}
	}
	for i, rec := range records {
		if rec == nil {
			continue
		}
		p := &kafkaProduce{topic: rec.Topic, done: make(chan struct{})}
		if batch[i].ID != "" {
			s.mu.Lock()
			s.inflight[ids[i]] = p
			s.mu.Unlock()
		}
		produced[i] = p
		// The context cancels the record only while that is safe: before it was sent. Once sent,
		// it is confirmed or fails on its own, and a later attempt at the entry waits for it.
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			p.err = err
			close(p.done)
		})
	}
	for i, p := range produced {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
			s.mu.Lock()
			delete(s.inflight, ids[i])
			s.mu.Unlock()
			if p.err != nil {
				batch[i].Err = s.classify(p.topic, p.err)
			}
		case <-ctx.Done():
			batch[i].Err = Transient(fmt.Errorf("kafka: no acknowledgement from Kafka for the record to %s in time: %w", p.topic, ctx.Err()))
		}
	}
}

// waiting returns the record of an entry that an earlier attempt produced and that is on its way
// or was confirmed after that attempt stopped waiting; nil when there is none, or when it failed
// (such as cancelled before it was sent), so that it is produced again.
func (s *kafkaSink) waiting(id string) *kafkaProduce {
	s.mu.Lock()
	p := s.inflight[id]
	s.mu.Unlock()
	if p != nil {
		select {
		case <-p.done:
			if p.err != nil {
				return nil
			}
		default:
		}
	}
	return p
}

// skipWritten reads back the topics of the redelivered entries' records and drops the records that
// Kafka has already: those entries are delivered.
func (s *kafkaSink) skipWritten(ctx context.Context, cl *kgo.Client, batch []Delivery, records []*kgo.Record, redelivered []int) error {
	since := map[string]int64{} // by topic: the earliest entry's time
	want := map[string]string{} // the entries' flowrun-ids, to their records' topics
	for _, i := range redelivered {
		ms, _, _ := parseEntryID(batch[i].ID) // an ID of another form reads the topic from its start
		if t, ok := since[records[i].Topic]; !ok || ms < t {
			since[records[i].Topic] = ms
		}
		want[string(kafkaHeader(records[i], kafkaIDHeader))] = records[i].Topic
	}
	written, err := s.readBack.written(ctx, cl, s.brokers, s.idPrefix, since, want)
	if err != nil {
		return Transient(fmt.Errorf("kafka: reading back what Kafka holds of entries delivered before: %w", err))
	}
	for _, i := range redelivered {
		if written[string(kafkaHeader(records[i], kafkaIDHeader))] {
			records[i] = nil
		}
	}
	if len(written) > 0 && s.log != nil {
		s.log.Info("kafka: found in Kafka already, not produced again", "records", len(written), "redelivered", len(redelivered))
	}
	return nil
}

// record makes the Kafka record of a delivery: its topic, key, value, headers and trace context.
func (s *kafkaSink) record(d Delivery, id string) (*kgo.Record, error) {
	m := d.Message
	if err := m.Decode(); err != nil {
		return nil, err
	}
	env := &expr.Env{Msg: m.Value, Vars: map[string]any{"key": m.Key}}
	topic, err := s.topic.EvalString(env)
	if err != nil {
		return nil, evalError(err)
	}
	if !kafkaTopicName(topic) {
		return nil, Permanent(fmt.Errorf("kafka: %q is not a topic name a record can be produced to", topic))
	}
	key := m.Key
	if s.key != nil {
		if key, err = s.key.EvalString(env); err != nil {
			return nil, evalError(err)
		}
	}
	payload, err := m.Payload()
	if err != nil {
		return nil, err
	}
	rec := &kgo.Record{Topic: topic, Value: payload}
	if key != "" {
		rec.Key = []byte(key)
	}
	for k, v := range m.Headers {
		if k != kafkaIDHeader {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	if d.Traceparent != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: natsTraceparent, Value: []byte(d.Traceparent)})
		if d.Tracestate != "" {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: natsTracestate, Value: []byte(d.Tracestate)})
		}
	}
	if d.ID != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: kafkaIDHeader, Value: []byte(s.idPrefix + id)})
	}
	return rec, nil
}

// client returns the sink's client, making it first.
func (s *kafkaSink) client() (*kgo.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cl != nil {
		return s.cl, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...), kgo.ClientID(s.clientID),
		kgo.RequiredAcks(kgo.AllISRAcks()), // and the idempotent producer, the client's default
		kgo.RecordDeliveryTimeout(s.timeout), kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(s.maxBytes))
	if err != nil {
		return nil, Permanent(fmt.Errorf("kafka: %w", err))
	}
	s.cl = cl
	return cl, nil
}

// kafkaRefusals are Kafka's errors that say the record itself will never be taken: such a record
// is dead-lettered. Kafka's other errors (brokers away, leaders moving, not enough replicas) are
// transient: the client has retried them until the timeout, and the sink pauses.
var kafkaRefusals = []*kerr.Error{
	kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage,
	kerr.InvalidTopicException, kerr.UnknownTopicOrPartition, kerr.TopicAuthorizationFailed,
	kerr.PolicyViolation, kerr.InvalidTimestamp,
}

// classify says what a failed produce is: permanent when Kafka refused the record, transient
// otherwise.
func (s *kafkaSink) classify(topic string, err error) error {
	for _, r := range kafkaRefusals {
		if errors.Is(err, r) {
			return Permanent(fmt.Errorf("kafka: the record to %s was refused: %w", topic, err))
		}
	}
	return Transient(fmt.Errorf("kafka: producing to %s: %w", topic, err))
}

// Close closes the client, once the runtime is done with the sink: what it still holds is failed,
// and its entries are delivered again.
func (s *kafkaSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cl != nil {
		s.cl.Close()
		s.cl = nil
	}
	return nil
}
