package flow

var sourceSpec = &BlockSpec{
	Type:   "source",
	Labels: []string{"name"},
	Doc:    "Brings messages into the pipeline from outside and writes them to a topic.",
	Attributes: []Attribute{
		{Name: "kind", Type: TypeString, Required: true, Doc: "What the source reads; see the source kinds."},
		{Name: "output", Type: TypeTopicRef, Required: true, Doc: "The topic the messages go to, as topic.NAME."},
	},
}

// compileSource compiles a source block.
func (c *compiler) compileSource(b *Block) *Source {
	attrs := c.decodeAttributes(sourceSpec.Attributes, b.Attributes)
	s := &Source{Name: b.Name, Output: attrs.Topic("output"), Range: b.DeclRange}
	if b.Kind != nil {
		s.Kind, s.Spec = b.Kind.Name, b.Kind
		s.Config = c.decodeAttributes(b.Kind.Attributes, b.Attributes)
		c.checkKind(b, &s.Config, "")
	}
	return s
}
