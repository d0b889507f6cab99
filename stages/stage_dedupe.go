package stages

import (
	"context"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The dedupe stage's attributes, and the values of duplicates.
const (
	dedupeFieldKey        = "key"
	dedupeFieldWithin     = "within"
	dedupeFieldDuplicates = "duplicates"
	dedupeDuplicatesDrop  = "drop"
)

// The dedupe stage passes on the first message of each key and drops, or routes, the messages of
// the same key that follow within a span of event time. Its memory of a key is state of the input
// partition, committed with the acks: a crash neither forgets a key nor remembers one twice.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name:     "dedupe",
			StateKey: dedupeFieldKey,
			Doc: "Passes on the first message of each key and drops (or sends to a topic) every later message of " +
				"the same key whose event time is less than within apart from the first's. A key is forgotten once " +
				"the partition's watermark (the latest event time it has seen) is within past its first message. " +
				"A key's messages must share a partition: where the input topic is keyed otherwise, the stage reads a " +
				"repartition topic keyed by the key (<stage>.by_key), and its outputs are keyed by it.",
			Attributes: []flow.Attribute{
				{Name: dedupeFieldKey, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg"}, Deterministic: true, Doc: "What makes two messages the same, such as msg.order_id."},
				{Name: dedupeFieldWithin, Type: flow.TypeDuration, Required: true, Doc: "How long a key is remembered, in event time."},
				{
					Name: flow.EventTimeAttribute, Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the time the message's entry was written",
					Doc: "The message's event time: an RFC 3339 string, or Unix milliseconds.",
				},
				{
					Name: dedupeFieldDuplicates, Type: flow.TypeTopicOrChoice, Enum: []string{dedupeDuplicatesDrop}, Default: dedupeDuplicatesDrop,
					Doc: `Where duplicates go: "drop" (they are counted as filtered), or topic.NAME.`,
				},
				maxKeysAttribute("remembered keys", "A key counts until the timer that forgets it fires, at the end of the batch whose watermark passed it."),
			},
			Example: `stage "orders_once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.order_id
  within     = "24h"
  event_time = msg.created_at
  duplicates = "drop"
}`,
			Check: func(c *flow.KindCheck) {
				if c.Has(dedupeFieldWithin) && c.Config.Duration(dedupeFieldWithin) <= 0 {
					c.Errorf(dedupeFieldWithin, "Invalid within", "within must be a positive duration, such as \"24h\".")
				}
			},
		},
		// Inline: it computes on the state that the runtime read ahead for the batch (StateKeys), so
		// its attempts need no timer of their own.
		Traits: StageTraits{Stateful: true, KeepsKey: true, Inline: true},
		NewStateful: func(s *flow.Stage, env Env) (StatefulStage, error) {
			d := &dedupeStage{out: s.Output, key: s.Config.Expr(dedupeFieldKey), eventTime: flow.EventTimeOf(s),
				within: s.Config.Duration(dedupeFieldWithin), keys: newKeyLimit(s)}
			d.reads = fieldsRead(d.key, d.eventTime)
			d.duplicates, _ = s.Config.TopicOrChoice(dedupeFieldDuplicates)
			// Its timers forget keys: they do not fire at a job's end, and stay for the next run.
			// Its keys are packed: a field per new key cost Redis as much as an output's XADD.
			return StatefulStage{Processor: d, TimerHandler: d, StatePrefetcher: d, PacksKeys: true}, nil
		},
	})
}

type dedupeStage struct {
	out        *flow.Topic
	key        *expr.Program
	eventTime  *expr.Program // nil: the entry's time
	within     time.Duration
	duplicates *flow.Topic // nil: drop them
	keys       keyLimit
	// reads are the fields of a message that key and event_time read: the others are not decoded
	// (fieldsRead; nil: all are). Its messages pass on as they came, undecoded.
	reads []string
}

// keyTimerPrefix names the timers that forget keys: the keys whose first messages of a batch share
// an event time (to the millisecond) share one (TimerGroupName); a key alone has "key:<key>".
const keyTimerPrefix = "key:"

func (s *dedupeStage) Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error) {
	key, err := scannedStateKey(s.key, s.eventTime, s.reads, m)
	if err != nil {
		return out, err
	}
	if err := checkStateKey(key); err != nil {
		return out, err
	}
	at, err := EventTime(s.eventTime, m)
	if err != nil {
		return out, err
	}
	first, seen, err := st.Get(ctx, key)
	if err != nil {
		return out, err
	}
	watermark, err := st.Watermark(ctx)
	if err != nil {
		return out, err
	}
	if seen {
		ms, err := strconv.ParseInt(string(first), 10, 64)
		// A key whose time is up is forgotten, whether or not its timer has fired yet: the timers
		// of a batch fire after its messages, and the answer must not depend on where batches end.
		firstAt := time.UnixMilli(ms)
		if err == nil && firstAt.Add(s.within).After(watermark) && absDuration(at.Sub(firstAt)) < s.within {
			st.Record(Duplicate)
			if s.duplicates == nil {
				return out, nil
			}
			return append(out, Output{Topic: s.duplicates, Message: *m}), nil
		}
	}
	if !seen {
		if err := s.keys.admit(ctx, st); err != nil {
			return out, err
		}
	}
	if err := st.Put(ctx, key, strconv.AppendInt(nil, at.UnixMilli(), 10)); err != nil {
		return out, err
	}
	if err := SetTimerMember(ctx, st, keyTimerPrefix, at.Add(s.within), key); err != nil {
		return out, err
	}
	return append(out, Output{Topic: s.out, Message: *m}), nil
}

// StateKeys names what Process reads for m, so that the runtime reads a batch's keys at once
// (StatePrefetcher): the key, and the count of keys.
func (s *dedupeStage) StateKeys(m *Message, keys []string) []string {
	key, err := scannedStateKey(s.key, s.eventTime, s.reads, m)
	if err != nil {
		return keys
	}
	return append(keys, key, KeyCountKey)
}

// OnTimer forgets the keys of a timer whose time is up: those the state holds with a first message
// within or more before the watermark. A key of the timer that the state holds with a later first
// message was passed on again since (its time was up, or the message was within or more from its
// first), with a timer at that time too; one that it does not hold was forgotten by another timer
// of the key. So each key is forgotten once, at the end of the batch whose watermark passed its
// time, as a timer of its own would forget it.
func (s *dedupeStage) OnTimer(ctx context.Context, st State, name string, _ time.Time, out []Output) ([]Output, error) {
	keys, ok := TimerMembers(keyTimerPrefix, name, nil)
	if !ok {
		return out, nil
	}
	watermark, err := st.Watermark(ctx)
	if err != nil {
		return out, err
	}
	for _, key := range keys {
		first, found, err := st.Get(ctx, key)
		if err != nil {
			return out, err
		}
		if !found {
			continue
		}
		if ms, err := strconv.ParseInt(string(first), 10, 64); err == nil && time.UnixMilli(ms).Add(s.within).After(watermark) {
			continue
		}
		if err := st.Delete(ctx, key); err != nil {
			return out, err
		}
		if err := s.keys.release(ctx, st); err != nil {
			return out, err
		}
	}
	return out, nil
}

// TimerStateKeys names what OnTimer reads for a timer (TimerStatePrefetcher): its keys, and the
// count of keys.
func (s *dedupeStage) TimerStateKeys(timer string, keys []string) []string {
	n := len(keys)
	keys, ok := TimerMembers(keyTimerPrefix, timer, keys)
	if !ok || len(keys) == n {
		return keys
	}
	return append(keys, KeyCountKey)
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// The memory of a dedupe stage's state, for flowrun validate --json. Each remembered key is a
// member of the timer set ("key:" and the key, scored by its due time) or, where the first messages
// of several keys in a batch came at the same time (to the millisecond), a part of the one member
// they share (the key and its length, TimerGroupName); and it is in a record of keys, with its first
// event time in 13 digits and their lengths (state.PackedKeys). Measured with MEMORY USAGE on
// Redis 7.0 (jemalloc), a partition of more than 128 keys of their own times, whose sorted set is
// then a skip list, takes about 120 bytes per key besides twice the key's length; keys that share
// timers take less. The keys' length is the pipeline's data, unknown to the estimate: it assumes a
// UUID's. The owner of the partition holds the keys in its memory too (DedupeProcessBytesPerKey).
const (
	dedupeBytesPerKeyBase  = 120
	DedupeAssumedKeyLength = 36
)

// DedupeBytesPerKey estimates the bytes of Redis memory that a dedupe stage's state takes per
// remembered key of keyLength bytes (DedupeBytesPerKeyFormula).
func DedupeBytesPerKey(keyLength int) int64 { return dedupeBytesPerKeyBase + 2*int64(keyLength) }

// DedupeProcessBytesPerKey estimates the bytes of memory that the owner of a dedupe stage's
// partition takes per remembered key of keyLength bytes: the key's entry in a record, as in Redis
// (its length and 16 for the time and the lengths), and its slot in the index that finds it, 24
// bytes in a table a quarter to three quarters full: at most 64 (state.PackedKeys).
func DedupeProcessBytesPerKey(keyLength int) int64 { return 64 + 16 + int64(keyLength) }

// DedupeBytesPerKeyFormula is DedupeBytesPerKey in words, for flowrun validate --json.
const DedupeBytesPerKeyFormula = "120 + 2 * the key's length in bytes, per remembered key: a member of the timer set, " +
	"as Redis 7 stores them past 128 keys a partition, and the key in a record of keys (keys whose first messages " +
	"share a time share a timer, and take less)"

// DedupeProcessBytesPerKeyFormula is DedupeProcessBytesPerKey in words, for flowrun validate --json.
const DedupeProcessBytesPerKeyFormula = "80 + the key's length in bytes, per remembered key, in the process that owns the " +
	"partition, at most: the key in a record, as in Redis, and its slot in the index that finds it"
