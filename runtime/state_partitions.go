package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// A stateful stage keeps its state per input partition, and a message's key picks its partition
// (hash mod partitions): if the input topic's partition count changed while state exists, a key's
// messages would go to another partition than the one that holds its state (its open windows, its
// remembered keys), and the stage would start it afresh there while the old state lingered. So the
// run records, per stateful stage and input topic, the partition count its state is for
// (Keys.StatePartitions), and at start refuses a count that differs from the recorded one while the
// recorded partitions hold any state: keys or timers of the kind (their watermarks do not count).
// With no such state the new count is recorded and the run goes on. Every command is on one key,
// so the check works on a cluster as on a single server.

// checkStatePartitions checks each stateful stage this process runs; see above. A refusal is a
// *ConfigError (the pipeline's partitions, not Redis, are at fault); a check that cannot read
// Redis ends the run too, rather than risk running on misplaced state.
func (r *runner) checkStatePartitions(ctx context.Context) error {
	for _, n := range r.nodes {
		if !n.stateful {
			continue
		}
		if err := r.checkStatePartitionsOf(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) checkStatePartitionsOf(ctx context.Context, n *node) error {
	t := n.input
	record := r.keys.StatePartitions(t.Name, n.name)
	recorded, found, err := r.rdb.RecordedPartitions(ctx, record)
	if err != nil {
		return fmt.Errorf("stage %s: %w", n.name, err)
	}
	if found && recorded == t.Partitions {
		return nil
	}
	if found {
		hashes, timers := make([]string, recorded), make([]string, recorded)
		for p := range recorded {
			hashes[p], timers[p] = r.keys.State(t.Name, p, n.name), r.keys.Timers(t.Name, p, n.name)
		}
		keys, timerCounts, err := r.rdb.StateSizes(ctx, hashes, timers)
		if err != nil {
			return fmt.Errorf("stage %s: %w", n.name, err)
		}
		var held []string
		var heldKeys, heldTimers int64
		for p := range recorded {
			if keys[p]+timerCounts[p] > 0 {
				held = append(held, fmt.Sprint(p))
				heldKeys, heldTimers = heldKeys+keys[p], heldTimers+timerCounts[p]
			}
		}
		if len(held) > 0 {
			return &ConfigError{r.partitionsChanged(n, recorded, held, heldKeys, heldTimers)}
		}
		r.log.Info("the partitions of a stateful stage's input changed while it held no state: the new count is recorded",
			slog.String("stage", n.name), slog.String("topic", t.Name), slog.Int("was", recorded), slog.Int("now", t.Partitions))
	}
	return r.rdb.RecordPartitions(ctx, record, t.Partitions)
}

// partitionsChanged says why a stateful stage cannot start on its input's new partition count, and
// the three ways on.
func (r *runner) partitionsChanged(n *node, recorded int, held []string, keys, timers int64) string {
	t := n.input
	topic := "topic " + t.Name
	if t.Implicit && t.Stage != "" {
		topic += " (the output of stage " + t.Stage + ", partitioned like its input)"
	} else if t.Range.Filename != "" {
		topic += fmt.Sprintf(" (%s:%d)", t.Range.Filename, t.Range.Start.Line)
	}
	// The keys of partition $p, for the shell loop: a partition's state and timers share its hash
	// tag, so one DEL takes both, on a cluster too.
	tag := "{" + t.Name + ":0}"
	state := strings.Replace(r.keys.State(t.Name, 0, n.name), tag, "{"+t.Name+":$p}", 1)
	timerSet := strings.Replace(r.keys.Timers(t.Name, 0, n.name), tag, "{"+t.Name+":$p}", 1)
	return fmt.Sprintf("stage %s keeps state for %s with %d partitions, and the topic has %d now: "+
		"a key's messages would go to another partition than the one that holds its state "+
		"(partition%s %s hold%s %d key%s and %d timer%s). Either keep partitions = %d; "+
		"or, with partitions = %d, let the state drain before changing the count "+
		"(a job, flowrun run --until-drained, closes an aggregate's open windows; a dedupe forgets a key once event time is past its within); "+
		"or delete the state, losing what it holds (open windows, remembered keys): "+
		`for p in $(seq 0 %d); do redis-cli -c DEL "%s" "%s"; done`,
		n.name, topic, recorded, t.Partitions,
		pluralS(int64(len(held))), strings.Join(held, ", "), verbS(len(held)), keys, pluralS(keys), timers, pluralS(timers),
		recorded, recorded, recorded-1, state, timerSet)
}

// verbS is the ending of a verb in the present whose subject counts n.
func verbS(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}
