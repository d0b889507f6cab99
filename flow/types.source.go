package flow

var sourceSpec = &BlockSpec{
	Type:   "source",
	Labels: []string{"name"},
	Doc:    "Brings messages into the pipeline from outside and writes them to a topic.",
	Attributes: []Attribute{
		{Name: "kind", Type: TypeString, Required: true, Doc: "What the source reads; see the source kinds."},
		{Name: "output", Type: TypeTopicRef, Required: true, Doc: "The topic the messages go to, as topic.NAME."},
	},
	Kinds: []*Kind{
		{
			Name: "generate",
			Doc:  "Generates messages from a template: for demos, load tests and synthetic data.",
			Attributes: []Attribute{
				{Name: "count", Type: TypeInteger, Min: bound(0), Doc: "How many messages to generate; without it the source never ends."},
				{Name: "rate", Type: TypeNumber, Min: bound(0), Doc: "Messages per second; without it, as fast as the pipeline takes them."},
				{
					Name: "template", Type: TypeMessageFields, Required: true, Roots: []string{"index"},
					Doc: "The fields of each message, as expressions where index is the message number, from 0.",
				},
			},
			Example: `source "clicks" {
  kind   = "generate"
  count  = 1000
  rate   = 200
  output = topic.clicks
  template = {
    user = "user-${index % 10}"
    page = index % 3 == 0 ? "/pricing" : "/docs"
  }
}`,
		},
		{
			Name: "file",
			Doc:  "Reads a file of JSON lines, one message per line, and ends at the end of the file.",
			Attributes: []Attribute{
				{Name: "path", Type: TypeString, Required: true, Doc: "The file to read; a relative path is relative to the working directory (use path.pipeline for files next to the pipeline)."},
			},
			Example: `source "orders_file" {
  kind   = "file"
  path   = "${path.pipeline}/data/orders.jsonl"
  output = topic.orders
}`,
		},
		{
			Name: "stdin",
			Doc:  "Reads JSON lines from standard input, one message per line, and ends at the end of the input.",
			Example: `source "lines" {
  kind   = "stdin"
  output = topic.events
}`,
		},
		{
			Name: "redis_stream",
			Doc: "Reads an existing Redis stream that other applications XADD into, through its own consumer " +
				"group, so that a restart resumes where it stopped. An entry with a payload field is that JSON; " +
				"any other entry becomes an object of its fields.",
			Attributes: []Attribute{
				{Name: "stream", Type: TypeString, Required: true, Doc: "The stream's key, used as it is (the pipeline's key_prefix does not apply)."},
				{Name: "group", Type: TypeString, DefaultDoc: `"flowrun." followed by the pipeline and source names`, Doc: "The consumer group the source reads through."},
				{
					Name: "start", Type: TypeString, Default: "earliest", Enum: []string{"earliest", "latest"},
					Doc: "Where a new consumer group starts: earliest reads what the stream already holds, latest only what is added afterwards.",
				},
			},
			Example: `source "orders_in" {
  kind   = "redis_stream"
  stream = "demo:events:orders"
  output = topic.orders
}`,
		},
	},
}

// compileSource compiles a source block.
func (c *compiler) compileSource(b *Block) *Source {
	attrs := c.decodeAttributes(sourceSpec.Attributes, b.Attributes)
	s := &Source{Name: b.Name, Output: attrs.Topic("output"), Range: b.DeclRange}
	if b.Kind != nil {
		s.Kind = b.Kind.Name
		s.Config = c.decodeAttributes(b.Kind.Attributes, b.Attributes)
		if s.Kind == "redis_stream" && !s.Config.Has("group") {
			s.Config.set("group", "flowrun."+c.plan.Name+"."+b.Name)
		}
	}
	return s
}
