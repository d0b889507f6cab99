package runtime

import (
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
		var plain bool
		if name, ok := t.Key.Field(); ok {
			key, plain = m.PlainField(name) // read from the payload as it came, decoding nothing
		}
		if !plain {
			if key, err = keyOf(t, m); err != nil {
				return "", 0, err
			}
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

// keyOf evaluates the key expression of topic t on m's fields.
func keyOf(t *flow.Topic, m *stages.Message) (string, error) {
	fields, lent, err := m.BorrowFields(t.Key.Fields())
	if err != nil {
		return "", err
	}
	var key string
	var plain bool
	if name, ok := t.Key.Field(); ok {
		key, plain = stages.PlainKey(fields[name])
	}
	if !plain {
		key, err = t.Key.EvalString(&expr.Env{Msg: fields})
	}
	stages.ReturnFields(lent)
	if err != nil {
		return "", stages.Permanent(err)
	}
	return key, nil
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
