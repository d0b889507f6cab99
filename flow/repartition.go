package flow

import "strings"

// A stateful stage keeps its state per input partition, so each key's messages must all be in one
// partition: its input must be partitioned by what its state is keyed by (Kind.StateKey, such as
// an aggregate's group_by). Where the input topic is keyed otherwise, or not at all, and has more
// than one partition, the compiler inserts a repartition topic, <stage>.by_key, keyed by the
// state's key, and a stage of the same name that copies the input into it. The stateful stage then
// reads the repartition topic.
//
// Each partition of a repartition topic is written by every partition of the input, each at its
// own pace; its watermark is therefore the minimum of its writers' watermarks (the runtime's
// rule, docs/kinds.md), so that a fast input partition does not make a slow one's events late.

// RepartitionKind is the kind of the stages the compiler inserts before a stateful stage whose input
// is keyed otherwise. It is no kind a pipeline may name.
const RepartitionKind = "repartition"

// repartitionSuffix names a stage's repartition topic and stage, stage.by_key; like the implicit
// topics' .out, the dot keeps it apart from every declared name.
const repartitionSuffix = ".by_key"

// insertRepartitions gives each stateful stage whose input is not keyed by its state's key a
// repartition topic and the stage that writes it.
func (c *compiler) insertRepartitions() {
	if c.unresolved {
		return
	}
	var stages []*Stage
	for _, s := range c.plan.Stages {
		stages = append(stages, c.insertSides(s)...)
		if r := c.repartition(s); r != nil {
			stages = append(stages, r)
		}
		stages = append(stages, s)
	}
	c.plan.Stages = stages
}

// repartition returns the stage that repartitions s's input by its state's key, and points s at
// its topic; nil when s needs none.
func (c *compiler) repartition(s *Stage) *Stage {
	if s.Spec == nil || s.Spec.StateKey == "" || s.Input == nil || s.Input.Partitions < 2 {
		return nil
	}
	key := s.Config.Expr(s.Spec.StateKey)
	partitions := s.Input.Partitions
	switch {
	case whole(s):
		// A global table keeps every key in one partition: all its input goes to one, with the
		// table's key, or the message's own.
		partitions = 1
	case key == nil || (s.Input.Key != nil && sameExpr(s.Input.Key.String(), key.String())):
		return nil // keyed by the message's key, or by the same expression as the input
	}
	name := s.Name + repartitionSuffix
	t := &Topic{
		Name: name, Partitions: partitions, Key: key, Retention: s.Input.Retention, MaxLag: s.Input.MaxLag,
		Range: s.Range,
	}
	r := &Stage{
		Name: name, Kind: RepartitionKind, Input: s.Input, Output: t,
		Retry: s.Retry, RetryInPlace: true, DeadLetter: s.DeadLetter, Ordering: OrderByPartition, Concurrency: 1,
		Timeout: s.Timeout, Delivery: s.Delivery, Config: s.Config, Range: s.Range,
		Repartitions: s,
	}
	t.Repartition = r
	c.topics[name] = t
	c.topicUsed[name] = true
	s.Input = t
	return r
}

// whole reports whether a stage keeps all its state in one partition: a global table's.
func whole(s *Stage) bool {
	return s.Kind == TableKind && s.Config.Declares(TableGlobalAttribute) && s.Config.Bool(TableGlobalAttribute)
}

// sameExpr reports whether two expressions' source texts are the same but for spacing.
func sameExpr(a, b string) bool {
	return strings.Join(strings.Fields(a), "") == strings.Join(strings.Fields(b), "")
}
