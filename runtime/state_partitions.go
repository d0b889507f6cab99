package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/flowrun/flowrun/flow"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A stateful stage keeps its state per input partition, and a message's key picks its partition
// (hash mod partitions): if the input topic's partition count changed while state exists, a key's
// messages would go to another partition than the one that holds its state (its open windows, its
// remembered keys), and the stage would start it afresh there while the old state lingered. So the
// run records, per stateful stage and input topic, the partition count its state is for
// (Keys.StatePartitions), and at start refuses a count that differs from the recorded one while the
// recorded partitions hold any state: keys or timers of the kind (flowrun's own fields, such as the
// watermark, do not count).
// With no such state the new count is recorded and the run goes on. Every command is on one key,
// so the check works on a cluster as on a single server.

// stateCheck checks at start what the stateful stages' state in Redis says of the plan: their
// inputs' partition counts (see above), and whether Redis may evict their state.
type stateCheck struct {
	rdb   *redis.Client
	keys  redis.Keys
	log   *slog.Logger
	plan  *flow.Plan
	nodes []*node // the nodes this process runs
}

// checkStatePartitions checks each stateful stage this process runs, and records the new counts
// once none is refused; see above. A refusal is a *ConfigError (the pipeline's partitions, not
// Redis, are at fault); a check that cannot read Redis ends the run too, rather than risk running
// on misplaced state.
func (sc *stateCheck) checkStatePartitions(ctx context.Context) error {
	type change struct {
		n   *node
		was int // the recorded count; 0: none
	}
	var changes []change
	for _, n := range sc.nodes {
		if !n.stateful {
			continue
		}
		was, record, err := sc.checkStatePartitionsOf(ctx, n)
		if err != nil {
			return err
		}
		if record {
			changes = append(changes, change{n, was})
		}
	}
	for _, c := range changes {
		n := c.n
		if err := sc.rdb.RecordPartitions(ctx, sc.keys.StatePartitions(n.input.Name, n.name), n.input.Partitions); err != nil {
			return fmt.Errorf("stage %s: %w", n.name, err)
		}
		if c.was != 0 {
			sc.log.Info("the partitions of a stateful stage's input changed while it held no state: the new count is recorded",
				slog.String("stage", n.name), slog.String("topic", n.input.Name), slog.Int("was", c.was), slog.Int("now", n.input.Partitions))
		}
	}
	return nil
}

// checkStatePartitionsOf checks one stateful stage: an error when its input's count changed under
// its state; otherwise the recorded count (0: none) and whether to record the topic's (there is no
// record, or the count changed while the stage held no state).
func (sc *stateCheck) checkStatePartitionsOf(ctx context.Context, n *node) (recorded int, record bool, err error) {
	t := n.input
	recorded, found, err := sc.rdb.RecordedPartitions(ctx, sc.keys.StatePartitions(t.Name, n.name))
	if err != nil {
		return 0, false, fmt.Errorf("stage %s: %w", n.name, err)
	}
	if found && recorded == t.Partitions {
		return recorded, false, nil
	}
	if found {
		hashes, timers := make([]string, recorded), make([]string, recorded)
		for p := range recorded {
			hashes[p], timers[p] = sc.keys.State(t.Name, p, n.name), sc.keys.Timers(t.Name, p, n.name)
		}
		holds, err := sc.rdb.StateHeld(ctx, hashes, timers)
		if err != nil {
			return 0, false, fmt.Errorf("stage %s: %w", n.name, err)
		}
		var held []string
		for p, h := range holds {
			if h {
				held = append(held, fmt.Sprint(p))
			}
		}
		if len(held) > 0 {
			return 0, false, &ConfigError{sc.partitionsChanged(n, recorded, held)}
		}
	}
	return recorded, true, nil
}

// partitionsChanged says why a stateful stage cannot start on its input's new partition count, and
// the three ways on.
func (sc *stateCheck) partitionsChanged(n *node, recorded int, held []string) string {
	t := sc.declaredTopic(n.input) // the topic whose partitions to keep
	declared := "declared"
	if t.Range.Filename != "" {
		declared += fmt.Sprintf(" at %s:%d", t.Range.Filename, t.Range.Start.Line)
	}
	topic := "topic " + n.input.Name + " (" + declared + ")"
	if t != n.input {
		topic = "topic " + n.input.Name + " (partitioned like topic " + t.Name + ", " + declared + ")"
	}
	// The keys of partition $p, for the shell loop: a partition's state and timers share its hash
	// tag, so one DEL takes both, on a cluster too.
	in := n.input.Name
	tag := "{" + in + ":0}"
	state := strings.Replace(sc.keys.State(in, 0, n.name), tag, "{"+in+":$p}", 1)
	timerSet := strings.Replace(sc.keys.Timers(in, 0, n.name), tag, "{"+in+":$p}", 1)
	return fmt.Sprintf("stage %s keeps state for %s with %d partitions, and it has %d now: "+
		"a key's messages would go to another partition than the one that holds its state "+
		"(partition%s %s of %d hold%s state: flowrun inspect --state shows it). Either keep partitions = %d for topic %s; "+
		"or, with partitions = %d, let the state drain before changing the count "+
		"(a job, flowrun run --until-drained, closes an aggregate's open windows; a dedupe forgets a key once event time is past its within); "+
		"or delete the state, losing what it holds (open windows, remembered keys): "+
		`for p in $(seq 0 %d); do redis-cli -c DEL "%s" "%s"; done`,
		n.name, topic, recorded, n.input.Partitions,
		pluralS(int64(len(held))), strings.Join(held, ", "), recorded, verbS(len(held)),
		recorded, t.Name, recorded, recorded-1, state, timerSet)
}

// declaredTopic returns the topic whose partitions t has: t itself, or for a topic that no block
// declares (a stage's implicit output, a repartition topic), the declared topic it is partitioned
// like.
func (sc *stateCheck) declaredTopic(t *flow.Topic) *flow.Topic {
	for range len(sc.plan.Topics) + len(sc.plan.Stages) { // no loop lasts longer
		var from *flow.Stage
		switch {
		case t.Repartition != nil:
			from = t.Repartition
		case t.Implicit && t.Stage != "":
			from = sc.plan.Stage(t.Stage)
		}
		if from == nil || from.Input == nil {
			return t
		}
		t = from.Input
	}
	return t
}

// verbS is the ending of a verb in the present whose subject counts n.
func verbS(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}

// warnIfStateMayBeEvicted says at start when the server may evict a stateful stage's state, which has
// no time to live: under memory pressure an allkeys-* policy would drop windows and dedupe keys.
func (sc *stateCheck) warnIfStateMayBeEvicted(ctx context.Context) {
	var stateful []string
	for _, n := range sc.nodes {
		if n.stateful {
			stateful = append(stateful, n.name)
		}
	}
	if len(stateful) == 0 {
		return
	}
	policy, err := sc.rdb.EvictsKeysWithoutTTL(ctx)
	switch {
	case err != nil:
		sc.log.Debug("cannot tell whether Redis may evict the state of stateful stages", "err", err)
	case policy != "":
		sc.log.Warn("Redis may evict keys without a time to live under memory pressure, which would lose the state of stateful stages; "+
			"set maxmemory-policy to noeviction or a volatile-* policy", "maxmemory_policy", policy, "stages", strings.Join(stateful, ", "))
	}
}
