package runtime

import (
	"context"
	"sync"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// stageHandler runs a stage's processor and routes its outputs to their topics' partitions.
type stageHandler struct {
	lifecycle // the processor's, if it has one
	r         *runner
	node      *node
	proc      stages.Processor
}

func (h *stageHandler) handle(ctx context.Context, m *message, outs []redis.Output) ([]redis.Output, error) {
	scratch := stageOutputs.Get().(*[]stages.Output)
	defer func() {
		clear(*scratch)
		*scratch = (*scratch)[:0]
		stageOutputs.Put(scratch)
	}()
	var results []stages.Output
	var err error
	dropped := false
	if h.node.stateful {
		results, dropped, err = withAttemptState(ctx, m.state, func(ctx context.Context) ([]stages.Output, error) {
			return h.proc.Process(ctx, &m.msg, *scratch)
		})
	} else {
		results, err = h.proc.Process(ctx, &m.msg, *scratch)
	}
	*scratch = results
	if err != nil {
		return outs, err
	}
	if len(results) == 0 {
		// What became of a message that passed nothing on (outcomes.go): a windowed kind
		// (FireAtEnd) holds its messages in windows, unless it dropped them (late = "drop").
		switch {
		case dropped:
			m.outcome = outcomeDropped
		case h.node.fireAtEnd:
			m.outcome = outcomeAbsorbed
		default:
			m.outcome = outcomeFiltered
		}
	}
	for i := range results {
		o := &results[i]
		out, err := h.r.topicOutput(h.node, m, o.Topic, &o.Message, i, m.partition)
		if err != nil {
			return outs, err
		}
		outs = append(outs, out)
	}
	return outs, nil
}

// stageOutputs recycles the slices that processors append their outputs to.
var stageOutputs = sync.Pool{New: func() any { s := make([]stages.Output, 0, 4); return &s }}

// topicOutput makes the entry that writes msg, the i-th output of input m at node n, to topic t;
// fallback is the partition of an unkeyed message. Effectively-once nodes mark the output so that
// writing it again after a crash writes nothing.
func (r *runner) topicOutput(n *node, m *message, t *flow.Topic, msg *stages.Message, i, fallback int) (redis.Output, error) {
	var key string
	var p int
	var err error
	if m.keptKey(n, t, msg) {
		key, p = msg.Key, redis.Partition(msg.Key, t.Partitions)
	} else if key, p, err = route(t, msg, fallback); err != nil {
		return redis.Output{}, err
	}
	e, err := entryOf(key, msg, m.out)
	if err != nil {
		return redis.Output{}, err
	}
	out := redis.Output{Stream: r.streamKey(t, p), Entry: e}
	if n.delivery == flow.EffectivelyOnce {
		out.DedupKey = r.keys.Dedup(t.Name, p, n.name, n.inputName(), m.partition, m.id+m.path, i)
	}
	return out, nil
}

// keptKey reports whether msg, an output of input m at node n, goes to topic t with the key it
// arrived with, which its route would compute again: t's key expression is the input topic's, and
// neither the payload it is computed from nor the key changed on the way (a filter, an identity
// map). The input's key was computed by that expression when the entry was written.
func (m *message) keptKey(n *node, t *flow.Topic, msg *stages.Message) bool {
	if t.Key == nil || n.input == nil || n.input.Key == nil || msg.Key == "" || msg.Key != m.inKey {
		return false
	}
	raw := msg.Unchanged()
	if len(raw) == 0 || len(raw) != len(m.inPayload) || &raw[0] != &m.inPayload[0] {
		return false
	}
	return t.Key.String() == n.input.Key.String()
}

// inputName names the node's input in dedup markers: its topic, or for a source the source itself.
func (n *node) inputName() string {
	if n.input != nil {
		return n.input.Name
	}
	return n.name
}
