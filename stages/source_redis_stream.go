package stages

import (
	"github.com/flowrun/flowrun/flow"
)

// The redis_stream source's attributes, and the values of start.
const (
	streamSourceFieldStream   = "stream"
	streamSourceFieldGroup    = "group"
	streamSourceFieldStart    = "start"
	streamSourceStartEarliest = "earliest"
	streamSourceStartLatest   = "latest"
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
				{Name: streamSourceFieldStream, Type: flow.TypeString, Required: true, Doc: "The stream's key, used as it is (the pipeline's key_prefix does not apply)."},
				{Name: streamSourceFieldGroup, Type: flow.TypeString, DefaultDoc: `"flowrun." followed by the pipeline and source names`, Doc: "The consumer group the source reads through."},
				{
					Name: streamSourceFieldStart, Type: flow.TypeString, Default: streamSourceStartEarliest, Enum: []string{streamSourceStartEarliest, streamSourceStartLatest},
					Doc: "Where a new consumer group starts: earliest reads what the stream already holds, latest only what is added afterwards.",
				},
			},
			Example: `source "orders_in" {
  kind   = "redis_stream"
  stream = "demo:events:orders"
  output = topic.orders
}`,
			Check: func(c *flow.KindCheck) {
				c.Config.SetDefault(streamSourceFieldGroup, "flowrun."+c.Pipeline+"."+c.Name)
			},
		},
		Stream: func(s *flow.Source) StreamSource {
			return StreamSource{
				Stream: s.Config.String(streamSourceFieldStream), Group: s.Config.String(streamSourceFieldGroup),
				StartLatest: s.Config.String(streamSourceFieldStart) == streamSourceStartLatest,
			}
		},
	})
}
