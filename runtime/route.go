package runtime

import (
	"encoding/json"
	"math"
	"sync/atomic"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A message's way into a topic: its key (the topic's key expression, or the key it already has)
// picks the partition, so that all messages of a key stay in one partition and in order. A message
// without a key keeps the partition number it came from, modulo the topic's partitions, which keeps
// the order of an unkeyed partition across hops; sources spread unkeyed messages by their origin's
// ID (sourceSpread). A message whose payload is null (a table's delete: it has no fields for the
// key expression to read) keeps the key it comes with, when it has one.

// validate checks a message against the schema of topic t, the one check of every message written
// to a topic (a stage's output, a source's message, the Publisher's): a message that does not
// satisfy it fails for good, with a *flow.SchemaError that says where. A topic without a schema
// costs nothing, and neither does a table's delete (a null payload, which has no fields).
func validate(t *flow.Topic, m *stages.Message) error {
	if t.Schema == nil || m.IsNull() {
		return nil
	}
	if err := m.Decode(); err != nil {
		return err
	}
	err := t.Schema.Validate(m.Value)
	if err != nil && m.Unchanged() == nil {
		// Fields that a stage set may hold Go values that the validator does not know (a Go
		// function's int32 or struct): the message is what its JSON says, so that decides.
		payload, perr := m.Payload()
		if perr != nil {
			return perr
		}
		if v, derr := stages.DecodePayload(payload); derr == nil {
			err = t.Schema.Validate(v)
		}
	}
	if err != nil {
		return stages.Permanent(err)
	}
	return nil
}

// route computes the key and partition of m on topic t. fallback is the partition for a message
// without a key.
func route(t *flow.Topic, m *stages.Message, fallback int) (key string, partition int, err error) {
	key = m.Key
	if t.Key != nil && !(key != "" && m.IsNull()) {
		fields, lent, err := m.BorrowFields(t.Key.Fields())
		if err != nil {
			return "", 0, err
		}
		var plain bool
		if name, ok := t.Key.Field(); ok {
			key, plain = plainKey(fields[name])
		}
		if !plain {
			key, err = t.Key.EvalString(&expr.Env{Msg: fields})
		}
		stages.ReturnFields(lent)
		if err != nil {
			return "", 0, stages.Permanent(err)
		}
	}
	if key == "" {
		if fallback < 0 {
			fallback = -fallback
		}
		return "", fallback % t.Partitions, nil
	}
	return key, redis.Partition(key, t.Partitions), nil
}

// plainKey returns the key that a topic keyed by a field (key = msg.NAME) gets from the field's
// decoded value v, when that is v itself: a string, or the JSON text of an integer that a number
// prints as (no sign but a minus, no leading zero, at most 15 digits: exact in a float64, which
// prints it with the same digits). Anything else (other numbers, a missing field, null, a bool, a
// list) is for the expression to convert or refuse. It spares a keyed source's every message an
// evaluation, a parse of its number, and the number's digits made again.
func plainKey(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		digits := string(v)
		if len(digits) > 0 && digits[0] == '-' {
			digits = digits[1:]
		}
		if len(digits) == 0 || len(digits) > 15 || digits[0] == '0' && (len(digits) > 1 || len(v) > 1) {
			return "", false // "0" is plain; "-0" prints as "0", "007" as "7"
		}
		for i := 0; i < len(digits); i++ {
			if digits[i] < '0' || digits[i] > '9' {
				return "", false
			}
		}
		return string(v), true
	}
	return "", false
}

// entryOf encodes a message as a stream entry.
//
// A large message that changed (one that arrived larger than a staging chunk) is not encoded here
// but measured: its entry's payload is made while the commit writes it, a piece at a time (see
// redis.Entry.Large), so that its JSON is never whole in memory next to the message it is made
// from. Measuring it finds anything in it that cannot be encoded now, as encoding would.
func entryOf(key string, m *stages.Message, trace traceContext) (redis.Entry, error) {
	e := redis.Entry{Key: key, Headers: m.Headers, TraceParent: trace.parent, TraceState: trace.state}
	if m.Unchanged() == nil && m.SizeHint() > redis.StagingChunk {
		changed := *m // its own copy: the output slices of a stage are reused before the commit
		var size int64
		err := changed.WritePayload(redis.StagingChunk, func(piece []byte) error { size += int64(len(piece)); return nil })
		if err != nil {
			return redis.Entry{}, err
		}
		e.Large = &redis.LargePayload{Size: size, Write: changed.WritePayload}
		return e, nil
	}
	payload, err := m.Payload()
	if err != nil {
		return redis.Entry{}, err
	}
	e.Payload = payload
	return e, nil
}

// sourceSpread picks the partition of a source's unkeyed messages. A message with an origin ID (a
// file's line, a generated message's number, an external stream's entry) goes where its ID hashes
// to: produced again after a crash, by this process or another, it lands in the partition it
// landed in first, where effectively-once delivery recognises it (its marker lives in that
// partition's slot: on a cluster a source's writes are not one transaction). Messages without one
// (those of a Publisher: flowrun produce, a test's sends) go round-robin.
type sourceSpread struct{ n atomic.Uint64 }

func (s *sourceSpread) next(id string) int {
	if id == "" {
		return int(s.n.Add(1) - 1)
	}
	h := uint32(2166136261) // FNV-1a, inline: no allocation per message
	for i := 0; i < len(id); i++ {
		h = (h ^ uint32(id[i])) * 16777619
	}
	return int(h & math.MaxInt32)
}
