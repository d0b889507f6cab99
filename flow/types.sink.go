package flow

import "time"

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
	Kinds: []*Kind{
		{
			Name: "stdout",
			Doc:  "Prints each message as a line of JSON on standard output.",
			Example: `sink "console" {
  kind  = "stdout"
  input = topic.alerts
}`,
		},
		{
			Name: "file",
			Doc: "Appends each message as a line of JSON to a file, and syncs the file before it acknowledges " +
				"a batch. The file and the directories above it are created when missing.",
			Attributes: []Attribute{
				{Name: "path", Type: TypeString, Required: true, Doc: "The file to write to; a relative path is relative to the working directory."},
				{
					Name: "mode", Type: TypeString, Default: "append", Enum: []string{"append", "truncate"},
					Doc: "append adds to what the file holds; truncate empties it once, when the run starts, for a " +
						"job whose output replaces the last run's. Every process that runs the sink empties it " +
						"when it starts, so a pipeline shared by processes on one machine appends.",
				},
			},
			Example: `sink "archive" {
  kind  = "file"
  input = topic.clean
  path  = var.output_path
  mode  = "truncate"
}`,
		},
		{
			Name: "redis_stream",
			Doc:  "Appends each message to a Redis stream that other applications read.",
			Attributes: []Attribute{
				{Name: "stream", Type: TypeString, Required: true, Doc: "The stream's key, used as it is (the pipeline's key_prefix does not apply)."},
				{Name: "max_len", Type: TypeInteger, Min: bound(1), Doc: "Caps the stream at about this many entries (XADD MAXLEN ~)."},
			},
			Example: `sink "to_billing" {
  kind   = "redis_stream"
  input  = topic.invoices
  stream = "billing:invoices"
}`,
		},
		{
			Name: "http",
			Doc: "Sends each message as a JSON request body. 2xx is success; 408, 429 and 5xx are retried; " +
				"other 4xx fail for good.",
			Attributes: []Attribute{
				{Name: "url", Type: TypeString, Required: true, Doc: "The URL to send to."},
				{
					Name: "method", Type: TypeString, Default: "POST",
					Enum: []string{"POST", "PUT", "PATCH"}, Doc: "The request method.",
				},
				{Name: "headers", Type: TypeStringMap, Doc: "Request headers, such as { Authorization = \"Bearer ${var.token}\" }."},
				{Name: "timeout", Type: TypeDuration, Default: 10 * time.Second, Doc: "How long one request may take."},
			},
			Example: `sink "webhook" {
  kind    = "http"
  input   = topic.alerts
  url     = var.webhook_url
  headers = { Authorization = "Bearer ${var.webhook_token}" }
}`,
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
		s.Kind = b.Kind.Name
		s.Config = c.decodeAttributes(b.Kind.Attributes, b.Attributes)
	}
	return s
}
