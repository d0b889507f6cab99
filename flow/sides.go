package flow

// A stage that reads two inputs (a join: Kind.Sides) keeps the state of both in one place: each
// key's events of both sides in one partition's slot, so that matching them, trimming them and
// acknowledging them is one commit. Its sides are nested blocks, each with an input, a key and an
// event time. The compiler gives the stage one repartition topic, <stage>.by_key, and one
// repartition stage per side, <stage>.<side>, which reads the side's input and writes each message
// to the topic under the side's key, tagged with its side and its event time (stages.SideHeader,
// stages.EventTimeHeader). The stage then reads the repartition topic as its input.
//
// Time: each side's repartition stage keeps its input's watermark in the side's own event time,
// and passes it on to the repartition topic as the watermark of what it writes, as an aggregate
// passes on the watermark of its results: the stage's watermark is thus the least of its sides',
// in the one time that the tags carry (the entry's time domain, read from stages.EventTimeHeader).

// SideAttributes are the attributes of each side block of a stage with sides.
func SideAttributes(what string) []Attribute {
	return []Attribute{
		{Name: "input", Type: TypeInputRef, Required: true, Doc: "What the " + what + " side reads: topic.NAME, or stage.NAME."},
		{Name: SideKeyAttribute, Type: TypeMessageExpr, Required: true, Roots: []string{"msg"}, Deterministic: true, Doc: "What the " + what + " side's messages are matched by, such as msg.ad_id."},
		{
			Name: EventTimeAttribute, Type: TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the time the message's entry was written",
			Doc: "The event time of the " + what + " side's messages: an RFC 3339 string, or Unix milliseconds.",
		},
	}
}

// SideKeyAttribute is the attribute of a side that its messages are keyed by.
const SideKeyAttribute = "key"

// sidesSuffix names the repartition topic of a stage with sides, as for other repartitions.
const sidesSuffix = repartitionSuffix

// insertSides gives a stage with sides its repartition topic and a repartition stage per side, and
// returns those stages, in the order of the kind's sides.
func (c *compiler) insertSides(s *Stage) []*Stage {
	if s.Spec == nil || len(s.Spec.Sides) == 0 {
		return nil
	}
	partitions := 1
	var inputs []*Topic
	for _, side := range s.Spec.Sides {
		blocks := s.Config.Blocks(side)
		if len(blocks) != 1 || blocks[0].Topic("input") == nil {
			return nil // reported where the block or its input is
		}
		in := blocks[0].Topic("input")
		inputs = append(inputs, in)
		partitions = max(partitions, in.Partitions)
	}
	name := s.Name + sidesSuffix
	t := &Topic{Name: name, Partitions: partitions, Retention: inputs[0].Retention, Range: s.Range}
	c.topics[name] = t
	c.topicUsed[name] = true
	var out []*Stage
	for i, side := range s.Spec.Sides {
		r := &Stage{
			Name: s.Name + "." + side, Kind: RepartitionKind, Input: inputs[i], Output: t,
			Retry: s.Retry, RetryInPlace: true, DeadLetter: s.DeadLetter, Ordering: OrderByPartition, Concurrency: 1,
			Timeout: s.Timeout, Delivery: s.Delivery, Config: s.Config.Blocks(side)[0], Range: s.Range,
			Repartitions: s, Side: side,
		}
		out = append(out, r)
	}
	// The topic is partitioned like the side's input with the most partitions (for the check at start
	// that a partition count did not change under a stage's state).
	t.Repartition = out[0]
	for i, in := range inputs {
		if in.Partitions > t.Repartition.Input.Partitions {
			t.Repartition = out[i]
		}
	}
	s.Input = t
	return out
}

// sideInputPartitions is the partition count that the implicit output of a stage with sides takes:
// that of its repartition topic, the most of its sides' inputs.
func (c *compiler) sideInputPartitions(b *Block) int {
	partitions := 1
	for _, nb := range b.Blocks {
		if in, ok := nb.Attributes["input"]; ok {
			if it := c.resolveTopicQuiet(in.Expr); it != nil {
				partitions = max(partitions, it.Partitions)
			}
		}
	}
	return partitions
}
