package stages

import (
	"github.com/flowrun/flowrun/flow"
)

// The redis_stream source reads a stream that other applications write, through a consumer group of
// its own, and passes each entry to its output topic. The runtime reads it like a stage's input (a
// StreamSource), with a single lease so that one process reads the stream in order; the group
// remembers where it stopped, so a restart resumes there. An entry with a payload field is that
// JSON; any other entry is an object of its fields.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "redis_stream",
			Doc: "Reads an existing Redis stream that other applications XADD into, through its own consumer " +
				"group, so that a restart resumes where it stopped. An entry with a payload field is that JSON; " +
				"any other entry becomes an object of its fields.",
			Attributes: []flow.Attribute{
				{Name: "stream", Type: flow.TypeString, Required: true, Doc: "The stream's key, used as it is (the pipeline's key_prefix does not apply)."},
				{Name: "group", Type: flow.TypeString, DefaultDoc: `"flowrun." followed by the pipeline and source names`, Doc: "The consumer group the source reads through."},
				{
					Name: "start", Type: flow.TypeString, Default: "earliest", Enum: []string{"earliest", "latest"},
					Doc: "Where a new consumer group starts: earliest reads what the stream already holds, latest only what is added afterwards.",
				},
			},
			Example: `source "orders_in" {
  kind   = "redis_stream"
  stream = "demo:events:orders"
  output = topic.orders
}`,
			Check: func(c *flow.KindCheck) {
				c.Config.SetDefault("group", "flowrun."+c.Pipeline+"."+c.Name)
			},
		},
		Stream: func(s *flow.Source) StreamSource {
			return StreamSource{
				Stream: s.Config.String("stream"), Group: s.Config.String("group"),
				StartLatest: s.Config.String("start") == "latest",
			}
		},
	})
}
