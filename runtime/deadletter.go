package runtime

import (
	"encoding/json"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A message that fails for good, an entry that cannot be decoded, and an entry trimmed before it was
// processed all become dead letters: entries of the node's dead-letter stream (or of the topic its
// dead_letter names) whose payload is an envelope saying what failed, where, how often and when,
// with the original payload. Nothing is dropped and nothing loops.

// deadLetterMessage is the dead letter of a message that failed for good.
func (r *processing) deadLetterMessage(n *node, m *message, err error, attempts int, first time.Time) redis.Output {
	payload, perr := m.msg.Payload()
	env := Envelope{
		Error: r.redact(err.Error()), Attempts: attempts, FirstFailedAt: first, LastFailedAt: r.clock.Now(),
		Partition: m.partition, ID: m.id, Path: m.path, Key: m.msg.Key, Headers: m.msg.Headers,
	}
	if perr == nil && json.Valid(payload) {
		env.Payload = payload
	} else if perr == nil {
		env.RawFields = map[string]string{"payload": string(payload)}
	}
	return r.deadLetter(n, m.partition, env, m.out)
}

// deadLetterMalformed is the dead letter of an entry that cannot be decoded.
func (r *processing) deadLetterMalformed(n *node, u *unit, bad *redis.MalformedEntryError) redis.Output {
	now := r.clock.Now()
	env := Envelope{
		Error: "malformed entry: " + bad.Reason, Attempts: 1, FirstFailedAt: now, LastFailedAt: now,
		Stream: u.stream, Partition: u.partition, ID: bad.ID, RawFields: bad.Fields,
	}
	return r.deadLetter(n, u.partition, env, traceContext{})
}

// deadLetterDeleted records an entry that retention trimmed while it was pending: its contents are
// gone, but its ID and the fact are kept.
func (r *processing) deadLetterDeleted(n *node, u *unit, id string) redis.Output {
	now := r.clock.Now()
	env := Envelope{
		Error:    "the entry was deleted from the stream (trimmed by retention) before it was processed; its contents are lost",
		Attempts: 0, FirstFailedAt: now, LastFailedAt: now, Stream: u.stream, Partition: u.partition, ID: id,
	}
	return r.deadLetter(n, u.partition, env, traceContext{})
}

// deadLetter addresses an envelope to the node's dead-letter topic or stream.
func (r *processing) deadLetter(n *node, partition int, env Envelope, trace traceContext) redis.Output {
	env.Node, env.NodeType = n.name, n.typ
	env.TraceParent, env.TraceState = trace.parent, trace.state
	if n.input != nil {
		env.Topic = n.input.Name
		if env.Stream == "" {
			env.Stream = r.keys.Stream(n.input.Name, partition)
		}
	}
	body, err := json.Marshal(env)
	if err != nil { // only strings, numbers and valid JSON go in
		body = []byte(`{"error":"the dead letter could not be encoded"}`)
	}
	// Logged (rate-limited) as it is made; counted when its batch commits (outcomes.go).
	r.deadLetters.record(r.log, n, &env, r.redact(env.Error), r.pipelinePath, r.clock.Now())
	msg := stages.NewMessage(env.Key, body, env.Headers)
	stream := r.keys.DeadLetter(n.name)
	key := env.Key
	if n.deadLetter != nil {
		k, p, err := route(n.deadLetter, &msg, partition)
		if err == nil {
			stream, key = r.keys.Stream(n.deadLetter.Name, p), k
		} else {
			// The dead-letter topic's key expression does not suit the envelope; the node's own
			// dead-letter stream takes it, so that it is not lost.
			r.log.Warn("dead-letter topic's key failed; using the node's own dead-letter stream",
				"node", n.name, "topic", n.deadLetter.Name, "err", err)
		}
	}
	return redis.Output{Stream: stream, Entry: redis.Entry{
		Key: key, Payload: body, Headers: env.Headers, TraceParent: trace.parent, TraceState: trace.state,
	}}
}
