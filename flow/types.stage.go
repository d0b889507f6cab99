package flow

import (
	"fmt"
	"time"
)

var stageSpec = &BlockSpec{
	Type:   "stage",
	Labels: []string{"name"},
	Doc: "Reads a topic, processes each message, and writes the results to its output. Each stage is a " +
		"consumer group on each partition of its input.",
	Attributes: []Attribute{
		{Name: "kind", Type: TypeString, Required: true, Doc: "What the stage does; see the stage kinds."},
		{
			Name: "input", Type: TypeInputRef, Required: true,
			Doc: "What the stage reads: topic.NAME, or stage.NAME for another stage's output. A join has none: its left and right blocks have the inputs.",
		},
		{
			Name: "output", Type: TypeTopicRef,
			Doc: "The topic the results go to. It may be left out when a stage or sink reads this stage " +
				"as stage.NAME: the stage then writes to a topic of its own, partitioned like its input.",
		},
		{Name: "retry", Type: TypeRetryRef, DefaultDoc: "the retry block defaults", Doc: "The retry policy for failed messages, as retry.NAME."},
		{
			Name: "dead_letter", Type: TypeTopicRef, DefaultDoc: "the stage's own dead-letter stream",
			Doc: "Where messages go that fail for good, as topic.NAME. Failures are never dropped.",
		},
		{
			Name: "ordering", Type: TypeString, Default: string(OrderByKey),
			Enum: []string{string(OrderByKey), string(OrderByPartition), string(OrderNone)},
			Doc: "What may run concurrently: key keeps the order of each key's messages and processes " +
				"different keys in parallel; partition processes each partition strictly in order; none " +
				"gives up order for the most parallelism.",
		},
		{
			Name: "retry_in_place", Type: TypeBool, DefaultDoc: `true when ordering = "partition", else false`,
			Doc: "Whether a failed message waits for its retry where it is, holding back the messages behind " +
				"it, or (false) waits in a retry set in Redis while later messages, of its key too, go on. " +
				"Delays of a second or less are always waited in place, and so are all retries of a stateful stage " +
				"(aggregate, dedupe), whose partition waits for the message so that its watermark does.",
		},
		{
			Name: "concurrency", Type: TypeInteger, Default: int64(4), Min: Bound(1), Max: Bound(1024),
			Doc: "How many messages of one partition are processed at once (lanes). Raise it for stages that wait on I/O.",
		},
		{Name: "timeout", Type: TypeDuration, Default: 30 * time.Second, Doc: "How long one message may take before the attempt fails."},
		{
			Name: "delivery", Type: TypeString, Enum: []string{string(AtLeastOnce), string(EffectivelyOnce)},
			DefaultDoc: "the pipeline's delivery", Doc: "The delivery guarantee of this stage's outputs.",
		},
		{
			Name: "fuse", Type: TypeBool, Default: true,
			Doc: "Whether the stage may run in one hop with the stage it reads as stage.NAME, and with the one " +
				"that reads it so: the messages between them then pass in memory, not through a stream. Two stages " +
				"fuse when both are stateless, the earlier one keeps its messages' keys (filter, map, and a go " +
				"stage whose function is registered with stages.KeepsKey), they have the same delivery, the later " +
				"one's ordering is no stricter, nothing else (no other stage or sink, no test file) reads the output " +
				"between them, and neither sets false; see Fusion in docs/running.md.",
		},
	},
}

// compileStage compiles a stage block. Its implicit output, if any, is attached once every reader
// is known (see finishStageOutputs).
func (c *compiler) compileStage(b *Block) *Stage {
	attrs := c.decodeAttributes(stageSpec.Attributes, b.Attributes)
	s := &Stage{
		Name:        b.Name,
		Input:       attrs.Topic("input"),
		Output:      attrs.Topic("output"),
		Retry:       DefaultRetry,
		DeadLetter:  attrs.Topic("dead_letter"),
		Ordering:    Ordering(attrs.String("ordering")),
		Concurrency: int(attrs.Int("concurrency")),
		Timeout:     attrs.Duration("timeout"),
		Delivery:    c.plan.Delivery,
		Fuse:        attrs.Bool("fuse"),
		Range:       b.DeclRange,
	}
	if p, ok := attrs.retry("retry"); ok {
		s.Retry = p
	}
	if attrs.Has("delivery") {
		s.Delivery = Delivery(attrs.String("delivery"))
	}
	s.RetryInPlace = s.Ordering == OrderByPartition
	if attrs.Has("retry_in_place") {
		s.RetryInPlace = attrs.Bool("retry_in_place")
	}
	if b.Kind == nil {
		return s
	}
	s.Kind, s.Spec = b.Kind.Name, b.Kind
	s.Config = c.decodeAttributes(b.Kind.Attributes, b.Attributes)
	c.decodeNested(&s.Config, b)
	if b.Kind.OwnOutputs != nil && s.Output != nil {
		c.errorf(b.Attributes["output"].NameRange, "Unsupported argument",
			fmt.Sprintf("A %s stage writes to %s; it has no output.", s.Kind, b.Kind.OutputsDoc))
		s.Output = nil
	}
	c.checkKind(b, &s.Config, s.Ordering)
	if s.Ordering == OrderNone && b.Kind.Stateful != nil && b.Kind.Stateful(s.Config) {
		c.errorf(b.Attributes["ordering"].Expr.Range(), "Stateful stage without a lease",
			fmt.Sprintf("The %s stage %q keeps state per input partition, which one process at a time must own: "+
				"use ordering = \"key\" (the default) or \"partition\", not \"none\".", s.Kind, s.Name))
	}
	return s
}

// finishStageOutputs gives each stage without an output the implicit topic its readers made, and
// reports stages whose results would go nowhere.
func (c *compiler) finishStageOutputs(blocks map[*Stage]*Block) {
	if c.unresolved {
		return // the missing reader may be the reference that failed
	}
	for _, s := range c.plan.Stages {
		b := blocks[s]
		if s.Output != nil || (b.Kind != nil && b.Kind.OwnOutputs != nil) || b.Kind == nil {
			continue
		}
		if t, ok := c.implicit[s.Name]; ok {
			s.Output = t
			continue
		}
		c.errorf(b.DeclRange, "Stage output goes nowhere",
			fmt.Sprintf("The stage %q has no output and nothing reads it. Set output = topic.NAME, or read it "+
				"from a stage or sink with input = stage.%s.", s.Name, s.Name))
	}
}
