package flow

import (
	"fmt"
	"time"
)

var retentionSpec = &BlockSpec{
	Type: "retention",
	Doc: "Bounds the topic's streams. Trimming runs on a timer and never removes an entry that some " +
		"consumer group has not yet read or acknowledged.",
	Attributes: []Attribute{
		{Name: "max_len", Type: TypeInteger, Min: Bound(1), Doc: "Keep at most this many entries per partition."},
		{Name: "max_age", Type: TypeDuration, Doc: `Drop entries older than this, such as "24h" or "7d".`},
	},
}

var topicSpec = &BlockSpec{
	Type:   "topic",
	Labels: []string{"name"},
	Doc: "A partitioned stream of messages, stored as one Redis stream per partition. Stages and sinks " +
		"read it with input = topic.NAME; sources and stages write it with output = topic.NAME.",
	Attributes: []Attribute{
		{
			Name: "partitions", Type: TypeInteger, Default: int64(1), Min: Bound(1),
			Doc: "How many streams the topic spreads over: the unit of parallelism across processes. " +
				"A message goes to partition hash(key) mod partitions.",
		},
		{
			Name: "key", Type: TypeMessageExpr, Roots: []string{"msg"},
			Doc: "Computes each message's key, such as msg.customer_id: it picks the partition and keeps " +
				"per-key order. Without it, a message keeps the key it arrived with.",
		},
		{
			Name: "max_lag", Type: TypeInteger, Min: Bound(1),
			Doc: "Caps each partition's backlog: the messages its slowest reader (a stage or sink of the " +
				"pipeline) has not yet processed, read or not. While a partition is at the cap, whatever " +
				"writes into it (sources, upstream stages, flowrun produce, the Publisher API) waits, so " +
				"that a slow consumer holds its producers back instead of filling Redis's memory. Dead " +
				"letters are never held back. Without it the backlog is unbounded.",
		},
		{
			Name: "schema", Type: TypeString,
			Doc: "A JSON Schema (draft 2020-12) that every message written to the topic must satisfy, usually " +
				`file("${path.pipeline}/order.schema.json"). Every writer validates: a message that does not satisfy ` +
				"it is dead-lettered by the node that wrote it, with the schema path and the message location of the " +
				"failure, and is not retried. validate checks the expressions that read the topic against it: a " +
				"field the schema does not declare (when it declares properties and no additionalProperties) and " +
				"a comparison its types cannot make are errors. flowrun schema infer proposes one from sample JSON lines; " +
				"see Schemas in docs/language.md.",
		},
	},
	Blocks: []NestedBlock{{Spec: retentionSpec, Max: 1}},
}

// compileTopics compiles every declared topic; they must exist before anything refers to them.
func (c *compiler) compileTopics() {
	for _, b := range c.cfg.Topics {
		attrs := c.decodeAttributes(topicSpec.Attributes, b.Attributes)
		t := &Topic{
			Name:       b.Name,
			Partitions: int(attrs.Int("partitions")),
			Key:        attrs.Expr("key"),
			MaxLag:     attrs.Int("max_lag"),
			Range:      b.DeclRange,
		}
		if attrs.Has("schema") {
			c.compileTopicSchema(t, b.Attributes["schema"], attrs.String("schema"))
		}
		if t.Partitions < 1 {
			t.Partitions = 1 // the error is reported; keep compiling with a sane value
		}
		for _, nb := range b.Blocks {
			r := c.decodeAttributes(retentionSpec.Attributes, nb.Attributes)
			t.Retention = Retention{MaxLen: r.Int("max_len"), MaxAge: r.Duration("max_age")}
			if !r.Has("max_len") && !r.Has("max_age") {
				c.warnf(nb.DeclRange, "Empty retention block",
					"Set max_len, max_age or both; without them the topic grows without bound.")
			}
			if r.Has("max_age") && t.Retention.MaxAge < time.Second {
				c.errorf(nb.Attributes["max_age"].Expr.Range(), "Invalid value for max_age",
					fmt.Sprintf("A max_age of %s would trim entries before consumers can read them; use at least 1s.",
						FormatDuration(t.Retention.MaxAge)))
			}
		}
		c.topics[t.Name] = t
	}
}
