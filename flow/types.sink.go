package flow

var sinkSpec = &BlockSpec{
	Type:   "sink",
	Labels: []string{"name"},
	Doc:    "Delivers the messages of a topic out of the pipeline.",
	Attributes: []Attribute{
		{Name: "kind", Type: TypeString, Required: true, Doc: "Where the messages go; see the sink kinds."},
		{Name: "input", Type: TypeInputRef, Required: true, Doc: "What the sink reads: topic.NAME, or stage.NAME for a stage's output."},
		{Name: "where", Type: TypeMessageBool, Roots: []string{"msg"}, Doc: "Delivers only the messages for which this holds."},
		{Name: "retry", Type: TypeRetryRef, DefaultDoc: "the retry block defaults", Doc: "The retry policy for failed deliveries, as retry.NAME."},
		{
			Name: "dead_letter", Type: TypeTopicRef, DefaultDoc: "the sink's own dead-letter stream",
			Doc: "Where messages go that cannot be delivered, as topic.NAME.",
		},
		{
			Name: "delivery", Type: TypeString, Enum: []string{string(AtLeastOnce), string(EffectivelyOnce)},
			DefaultDoc: "the pipeline's delivery", Doc: "The delivery guarantee, for sinks that write to Redis.",
		},
		{
			Name: "retry_in_place", Type: TypeBool, Default: false,
			Doc: "Whether a failed delivery waits for its retry where it is, holding back the messages behind " +
				"it, or (false) waits in a retry set in Redis while later messages go on. Delays of a second " +
				"or less are always waited in place.",
		},
	},
}

// compileSink compiles a sink block.
func (c *compiler) compileSink(b *Block) *Sink {
	attrs := c.decodeAttributes(sinkSpec.Attributes, b.Attributes)
	s := &Sink{
		Name:       b.Name,
		Input:      attrs.Topic("input"),
		Where:      attrs.Expr("where"),
		Retry:      DefaultRetry,
		DeadLetter: attrs.Topic("dead_letter"),
		Delivery:   c.plan.Delivery,
		Range:      b.DeclRange,
	}
	if p, ok := attrs.retry("retry"); ok {
		s.Retry = p
	}
	if attrs.Has("delivery") {
		s.Delivery = Delivery(attrs.String("delivery"))
	}
	s.RetryInPlace = attrs.Bool("retry_in_place")
	if b.Kind != nil {
		s.Kind, s.Spec = b.Kind.Name, b.Kind
		s.Config = c.decodeAttributes(b.Kind.Attributes, b.Attributes)
		c.decodeNested(&s.Config, b)
		c.checkKind(b, &s.Config, "")
	}
	return s
}
