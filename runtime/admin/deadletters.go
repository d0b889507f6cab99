package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// DeadLetters are the dead letters of one source, stage or sink, for the operator: flowrun dlq
// lists, shows, replays and purges them. They live in the node's own dead-letter stream and, when
// the node has a dead_letter topic, in that topic's partitions, among the dead letters of other
// nodes.
type DeadLetters struct {
	rdb     *redis.Client
	keys    redis.Keys
	node    string
	nodeTyp string
	input   *flow.Topic // nil for a source
	// retryTo is the node whose retry sets take the replays: the node itself, or for a stage fused
	// after others (flow.Chain) the chain's first stage, which reads for the chain; resume is then
	// the node's name, where the chain starts the replayed message.
	retryTo, resume string
	retryIn         *flow.Topic
	streams         []string

	// Clock says when "now" is for Replay, which makes the replayed messages due now. Default: the
	// wall clock.
	Clock stages.Clock
}

// OpenDeadLetters returns the dead letters of the named source, stage or sink of the plan. It fails
// when the plan has no such node.
func OpenDeadLetters(c *redis.Client, plan *flow.Plan, node string) (*DeadLetters, error) {
	d := &DeadLetters{rdb: c, keys: redis.Keys{Prefix: plan.KeyPrefix}, node: node}
	var deadLetter *flow.Topic
	for _, s := range plan.Sources {
		if s.Name == node {
			d.nodeTyp = "source"
		}
	}
	for _, s := range plan.Stages {
		if s.Name == node {
			d.nodeTyp, d.input, deadLetter = "stage", s.Input, s.DeadLetter
			if s.FusedAfter() {
				d.retryTo, d.retryIn, d.resume = s.Chain.Head().Name, s.Chain.Head().Input, s.Name
			}
		}
	}
	for _, s := range plan.Sinks {
		if s.Name == node {
			d.nodeTyp, d.input, deadLetter = "sink", s.Input, s.DeadLetter
		}
	}
	if d.nodeTyp == "" {
		return nil, noNode(plan, node)
	}
	if d.retryTo == "" {
		d.retryTo, d.retryIn = node, d.input
	}
	d.streams = []string{d.keys.DeadLetter(node)}
	if deadLetter != nil {
		d.streams = append(d.streams, d.keys.Streams(deadLetter.Name, deadLetter.Partitions)...)
	}
	return d, nil
}

// List returns every dead letter of the node, oldest first.
func (d *DeadLetters) List(ctx context.Context) ([]runtime.DeadLetter, error) {
	var out []runtime.DeadLetter
	for _, stream := range d.streams {
		replayed, err := d.rdb.ReplayedAt(ctx, d.keys.Replayed(stream))
		if err != nil {
			return nil, err
		}
		after := "0"
		for {
			recs, err := d.rdb.Read(ctx, stream, after, 0, 0)
			if err != nil {
				return nil, err
			}
			if len(recs) == 0 {
				break
			}
			for _, rec := range recs {
				if dl, ok := d.deadLetter(stream, rec); ok {
					dl.Replayed = replayed[dl.ID]
					out = append(out, dl)
				}
			}
			after = recs[len(recs)-1].ID
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		c, err := redis.CompareIDs(out[i].ID, out[j].ID)
		return err == nil && c < 0
	})
	return out, nil
}

// Get returns one dead letter by its ID.
func (d *DeadLetters) Get(ctx context.Context, id string) (runtime.DeadLetter, error) {
	for _, stream := range d.streams {
		rec, ok, err := d.rdb.EntryByID(ctx, stream, id)
		if err != nil {
			return runtime.DeadLetter{}, err
		}
		if !ok {
			continue
		}
		if dl, ok := d.deadLetter(stream, rec); ok {
			replayed, err := d.rdb.ReplayedAt(ctx, d.keys.Replayed(stream))
			if err != nil {
				return runtime.DeadLetter{}, err
			}
			dl.Replayed = replayed[id]
			return dl, nil
		}
	}
	return runtime.DeadLetter{}, fmt.Errorf("%s %s has no dead letter %s", d.nodeTyp, d.node, id)
}

// deadLetter reads an entry of a dead-letter stream; entries of a dead_letter topic that another
// node wrote are not this node's.
func (d *DeadLetters) deadLetter(stream string, rec redis.Record) (runtime.DeadLetter, bool) {
	dl := runtime.DeadLetter{ID: rec.ID, Stream: stream}
	if rec.Malformed != nil {
		dl.Malformed = rec.Malformed.Reason
		return dl, stream == d.streams[0]
	}
	if err := json.Unmarshal(rec.Payload, &dl.Envelope); err != nil || dl.Envelope.Node == "" {
		dl.Malformed = "not a dead-letter envelope"
		return dl, stream == d.streams[0]
	}
	if dl.Envelope.TraceParent == "" {
		dl.Envelope.TraceParent, dl.Envelope.TraceState = rec.TraceParent, rec.TraceState
	}
	return dl, dl.Envelope.Node == d.node
}

// ListDeadLetters lists the dead letters of the given nodes (a run's Summary.Nodes), node by node,
// oldest first: all of them, not only that run's, with their errors redacted as the plan says. It
// is meant for an embedded Redis, whose dead letters are gone once the process exits.
func ListDeadLetters(ctx context.Context, c *redis.Client, plan *flow.Plan, nodes []runtime.NodeSummary) ([]runtime.DeadLetter, error) {
	var all []runtime.DeadLetter
	for _, n := range nodes {
		d, err := OpenDeadLetters(c, plan, n.Name)
		if err != nil {
			return nil, err
		}
		list, err := d.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing the dead letters of %s %s: %w", n.Type, n.Name, err)
		}
		for i := range list {
			if list[i].Envelope.Node == "" { // not an envelope: someone else wrote it there
				list[i].Envelope.Node, list[i].Envelope.NodeType = n.Name, n.Type
			}
			list[i].Envelope.Error = plan.Redact(list[i].Envelope.Error)
		}
		all = append(all, list...)
	}
	return all, nil
}

// ReplayResult says what Replay did.
type ReplayResult struct {
	Replayed []string          // IDs of the dead letters sent back
	Skipped  map[string]string // IDs that could not be replayed, and why
}

// Replay sends dead letters back to the node that gave them up, and to it alone: each goes into the
// node's retry set for its partition (for a stage fused after others, the chain's, marked to start
// at the stage), due now, with its attempts counted afresh. The node's running process picks it up
// (or the next one to run). Replaying again what was replayed is allowed: the operator decides.
// Edits, if any, change each payload on the way back; a dead letter that an edit fails for, or whose
// payload does not satisfy the schema of the node's input topic (which the node's expressions rely
// on), is skipped with the reason and stays as it is, not replayed.
func (d *DeadLetters) Replay(ctx context.Context, ids []string, edits ...PayloadEdit) (ReplayResult, error) {
	res := ReplayResult{Skipped: map[string]string{}}
	if d.input == nil {
		return res, fmt.Errorf("source %s: a source's dead letters cannot be replayed, since nothing reads them; "+
			"publish their payloads again with flowrun produce", d.node)
	}
	clock := d.Clock
	if clock == nil {
		clock = stages.SystemClock{}
	}
	now := clock.Now()
	for _, id := range ids {
		dl, err := d.Get(ctx, id)
		if err != nil {
			res.Skipped[id] = err.Error()
			continue
		}
		env := dl.Envelope
		switch {
		case dl.Malformed != "":
			res.Skipped[id] = "not a dead letter: " + dl.Malformed
			continue
		case len(env.Payload) == 0:
			res.Skipped[id] = "no payload to replay (the entry was malformed or trimmed before it was processed)"
			continue
		case env.Partition < 0 || env.Partition >= d.input.Partitions:
			res.Skipped[id] = fmt.Sprintf("partition %d is not a partition of topic %s", env.Partition, d.input.Name)
			continue
		}
		payload := []byte(env.Payload)
		if len(edits) > 0 {
			if payload, err = applyEdits(payload, edits); err != nil {
				res.Skipped[id] = err.Error()
				continue
			}
		}
		if err := satisfies(d.input, payload); err != nil {
			res.Skipped[id] = err.Error()
			continue
		}
		retry := redis.Retry{
			Entry: redis.Entry{
				ID: env.ID, Key: env.Key, Payload: payload, Headers: env.Headers,
				TraceParent: env.TraceParent, TraceState: env.TraceState,
			},
			Due:   now,
			Stage: d.resume, Path: env.Path,
		}
		if retry.Entry.ID == "" {
			retry.Entry.ID = dl.ID
		}
		if err := d.rdb.AddRetries(ctx, d.keys.Retry(d.retryIn.Name, env.Partition, d.retryTo), retry); err != nil {
			return res, err
		}
		if err := d.rdb.MarkReplayed(ctx, d.keys.Replayed(dl.Stream), now, dl.ID); err != nil {
			return res, err
		}
		res.Replayed = append(res.Replayed, id)
	}
	return res, nil
}

// satisfies checks a payload replayed to a node against its input topic's schema, if it has one.
func satisfies(t *flow.Topic, payload []byte) error {
	if t.Schema == nil {
		return nil
	}
	v, err := stages.DecodePayload(payload)
	if err != nil {
		return err
	}
	return t.Schema.Validate(v)
}

// Purge deletes dead letters: the given ones, or with all, every one of the node.
func (d *DeadLetters) Purge(ctx context.Context, ids []string, all bool) (int, error) {
	if all {
		list, err := d.List(ctx)
		if err != nil {
			return 0, err
		}
		ids = ids[:0]
		for _, dl := range list {
			ids = append(ids, dl.ID)
		}
	}
	n := 0
	var missing []string
	for _, id := range ids {
		dl, err := d.Get(ctx, id)
		if err != nil {
			missing = append(missing, id)
			continue
		}
		deleted, err := d.rdb.DeleteEntries(ctx, dl.Stream, id)
		if err != nil {
			return n, err
		}
		if err := d.rdb.ForgetReplayed(ctx, d.keys.Replayed(dl.Stream), id); err != nil {
			return n, err
		}
		n += int(deleted)
	}
	if len(missing) > 0 {
		return n, errors.New("no such dead letter: " + strings.Join(missing, ", "))
	}
	return n, nil
}
