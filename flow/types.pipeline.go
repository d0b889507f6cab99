package flow

import (
	"github.com/hashicorp/hcl/v2"
)

var pipelineSpec = &BlockSpec{
	Type:   "pipeline",
	Labels: []string{"name"},
	Unique: true,
	Doc: "Names the pipeline and sets what applies to all of it. Every pipeline has exactly one " +
		"pipeline block, in any of its files.",
	Attributes: []Attribute{
		{
			Name: "key_prefix", Type: TypeString,
			DefaultDoc: `"flowrun:" followed by the pipeline's name`,
			Doc: "Every Redis key the pipeline uses starts with this prefix, so that pipelines sharing a " +
				"Redis do not collide. Changing it starts the pipeline afresh on new keys.",
		},
		{
			Name: "delivery", Type: TypeString, Default: string(AtLeastOnce),
			Enum: []string{string(AtLeastOnce), string(EffectivelyOnce)},
			Doc: "The default delivery guarantee of every stage and sink: at_least_once may deliver a " +
				"message twice after a crash; effectively_once writes each output so that downstream sees it " +
				"once (on a single server, a batch's outputs and acks in one script; on a cluster, with a " +
				"dedup marker per output).",
		},
		{
			Name: "max_message_size", Type: TypeSize, Default: DefaultMaxMessageSize,
			Min: Bound(1 << 10), Max: Bound(512 << 20),
			Doc: "The largest entry a node reads: its fields' names and values, payload, key, headers and " +
				"trace context, in bytes. A larger entry is dead-lettered as malformed, with its size and the " +
				"limit, without being decoded (its dead letter keeps the first KiB of each field); the " +
				"publish API refuses larger messages. At most 512MiB, the largest value Redis accepts by " +
				"default (proto-max-bulk-len).",
		},
		{
			Name: "offload_over", Type: TypeSize, Default: DefaultOffloadOver, Enum: []string{"off"},
			Max: Bound(512 << 20),
			Doc: "A payload larger than this is stored once under a Redis key of its own, in the slot of the " +
				"stream it is written to, and the entry carries a payload_ref naming that key instead; every " +
				"reader gets the payload back as if it were inline, and the key goes when the entry is trimmed " +
				"or its dead letter purged (docs/redis-keys.md). \"off\" (or \"0B\") keeps every payload in its " +
				"entry. A redis_stream sink, and everything on the embedded Redis, writes payloads inline.",
		},
		{Name: "description", Type: TypeString, Doc: "What the pipeline is for; shown by graph and inspect."},
	},
}

// DefaultMaxMessageSize is the default of the pipeline's max_message_size: large enough for any
// message that belongs in a stream, small enough that one entry cannot take a process's memory.
const DefaultMaxMessageSize Size = 64 << 20

// DefaultOffloadOver is the default of the pipeline's offload_over (transport/redis
// DefaultOffloadOver): above 64KiB a payload costs Redis more inside its entry than under a key
// of its own.
const DefaultOffloadOver Size = 64 << 10

// compilePipeline fills the plan's pipeline-wide settings.
func (c *compiler) compilePipeline() {
	b := c.cfg.Pipeline
	c.plan.MaxMessageSize = int64(DefaultMaxMessageSize)
	c.plan.OffloadOver = int64(DefaultOffloadOver)
	if b == nil {
		return // Load has reported it
	}
	attrs := c.decodeAttributes(pipelineSpec.Attributes, b.Attributes)
	c.plan.MaxMessageSize = int64(attrs.Size("max_message_size"))
	c.plan.OffloadOver = int64(attrs.Size("offload_over"))
	c.plan.Name = b.Name
	c.plan.Description = attrs.String("description")
	c.plan.KeyPrefix = "flowrun:" + b.Name
	if attrs.Has("key_prefix") {
		c.plan.KeyPrefix = attrs.String("key_prefix")
		if c.plan.KeyPrefix == "" {
			c.errorf(b.Attributes["key_prefix"].Expr.Range(), "Invalid key_prefix",
				"The key prefix must not be empty: it keeps this pipeline's keys apart from everything else in Redis.")
		}
	}
	c.plan.Delivery = Delivery(attrs.String("delivery"))
}

// errorf appends an error diagnostic at rng.
func (c *compiler) errorf(rng hcl.Range, summary, detail string) {
	c.diags = c.diags.Append(&hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: rng.Ptr()})
}

// warnf appends a warning diagnostic at rng.
func (c *compiler) warnf(rng hcl.Range, summary, detail string) {
	c.diags = c.diags.Append(&hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: summary, Detail: detail, Subject: rng.Ptr()})
}
