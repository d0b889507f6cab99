package flow

import (
	"fmt"
	"time"
)

var caseSpec = &BlockSpec{
	Type: "case",
	Doc:  "One branch of a route stage: a message goes to the output of the first case whose condition holds.",
	Attributes: []Attribute{
		{Name: "when", Type: TypeMessageBool, Required: true, Roots: []string{"msg"}, Doc: "The condition, such as msg.region == \"eu\"."},
		{Name: "output", Type: TypeTopicRef, Required: true, Doc: "The topic for messages of this case, as topic.NAME."},
	},
}

var stageSpec = &BlockSpec{
	Type:   "stage",
	Labels: []string{"name"},
	Doc: "Reads a topic, processes each message, and writes the results to its output. Each stage is a " +
		"consumer group on each partition of its input.",
	Attributes: []Attribute{
		{Name: "kind", Type: TypeString, Required: true, Doc: "What the stage does; see the stage kinds."},
		{
			Name: "input", Type: TypeInputRef, Required: true,
			Doc: "What the stage reads: topic.NAME, or stage.NAME for another stage's output.",
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
				"Delays of a second or less are always waited in place.",
		},
		{
			Name: "concurrency", Type: TypeInteger, Default: int64(4), Min: bound(1), Max: bound(1024),
			Doc: "How many messages of one partition are processed at once (lanes). Raise it for stages that wait on I/O.",
		},
		{Name: "timeout", Type: TypeDuration, Default: 30 * time.Second, Doc: "How long one message may take before the attempt fails."},
		{
			Name: "delivery", Type: TypeString, Enum: []string{string(AtLeastOnce), string(EffectivelyOnce)},
			DefaultDoc: "the pipeline's delivery", Doc: "The delivery guarantee of this stage's outputs.",
		},
	},
	Kinds: []*Kind{
		{
			Name: "map",
			Doc:  "Changes each message: set adds or replaces fields, then drop removes fields.",
			Attributes: []Attribute{
				{Name: "set", Type: TypeMessageFields, Roots: []string{"msg"}, Doc: "Fields to add or replace, as an object of expressions over msg."},
				{Name: "drop", Type: TypeStringList, Doc: "Names of fields to remove."},
			},
			Example: `stage "enrich" {
  kind   = "map"
  input  = topic.orders
  output = topic.enriched
  set = {
    total   = msg.amount * (1 + var.vat_rate)
    country = upper(msg.country)
  }
  drop = ["internal_note"]
}`,
		},
		{
			Name: "filter",
			Doc:  "Passes on the messages for which where holds and drops the others.",
			Attributes: []Attribute{
				{Name: "where", Type: TypeMessageBool, Required: true, Roots: []string{"msg"}, Doc: "The condition a message must meet to pass."},
			},
			Example: `stage "big_orders" {
  kind   = "filter"
  input  = topic.orders
  output = topic.big_orders
  where  = msg.amount > 100 && msg.country == "DE"
}`,
		},
		{
			Name:       "route",
			Doc:        "Sends each message to the output of the first case whose condition holds, or to default.",
			OwnOutputs: true,
			Attributes: []Attribute{
				{Name: "default", Type: TypeTopicRef, Doc: "The topic for messages that match no case; without it they are dropped and counted."},
			},
			Blocks: []NestedBlock{{Spec: caseSpec, Min: 1}},
			Example: `stage "by_region" {
  kind  = "route"
  input = topic.orders
  case {
    when   = msg.region == "eu"
    output = topic.orders_eu
  }
  case {
    when   = msg.region == "us"
    output = topic.orders_us
  }
  default = topic.orders_other
}`,
		},
		{
			Name: "go",
			Doc: "Runs a Go function compiled into the flowrun binary with stages.Register; it may emit " +
				"zero, one or several messages per input.",
			Attributes: []Attribute{
				{Name: "func", Type: TypeString, Required: true, Doc: "The registered name of the function, such as \"acme.score\"."},
			},
			Example: `stage "score" {
  kind   = "go"
  func   = "acme.score"
  input  = stage.enrich
  output = topic.scored
}`,
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
	s.Kind = b.Kind.Name
	s.Config = c.decodeAttributes(b.Kind.Attributes, b.Attributes)
	c.decodeNested(&s.Config, b)
	if b.Kind.OwnOutputs && s.Output != nil {
		c.errorf(b.Attributes["output"].NameRange, "Unsupported argument",
			fmt.Sprintf("A %s stage writes to the outputs of its case blocks and its default; it has no output.", s.Kind))
		s.Output = nil
	}
	switch s.Kind {
	case "map":
		_, set := b.Attributes["set"]
		_, drop := b.Attributes["drop"]
		if !set && !drop {
			c.warnf(b.DeclRange, "Map stage changes nothing", "Give it set, drop or both; as it is, it passes messages on unchanged.")
		}
	case "go":
		c.checkGoFunc(b, s.Config.String("func"))
	}
	return s
}

// checkGoFunc reports a go stage whose function is not registered in this binary.
func (c *compiler) checkGoFunc(b *Block, name string) {
	a, ok := b.Attributes["func"]
	if !ok || name == "" || contains(c.opts.GoFuncs, name) {
		return
	}
	detail := fmt.Sprintf("No Go stage function %q is registered in this flowrun binary.%s", name, didYouMean(name, c.opts.GoFuncs))
	if len(c.opts.GoFuncs) > 0 {
		detail += fmt.Sprintf(" Registered: %s.", quotedList(c.opts.GoFuncs))
	}
	detail += " Functions are registered with stages.Register and compiled into a custom binary (see examples/plugins)."
	c.errorf(a.Expr.Range(), "Unknown Go stage function", detail)
}

// finishStageOutputs gives each stage without an output the implicit topic its readers made, and
// reports stages whose results would go nowhere.
func (c *compiler) finishStageOutputs(blocks map[*Stage]*Block) {
	if c.unresolved {
		return // the missing reader may be the reference that failed
	}
	for _, s := range c.plan.Stages {
		b := blocks[s]
		if s.Output != nil || (b.Kind != nil && b.Kind.OwnOutputs) || b.Kind == nil {
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
