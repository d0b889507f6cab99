package runtime

import (
	"encoding/json"
	"time"
)

// Envelope is a dead letter's payload: what failed, where, how often and when, with the original
// message.
type Envelope struct {
	Node          string    `json:"node"`      // the source, stage or sink that gave up
	NodeType      string    `json:"node_type"` // "source", "stage" or "sink"
	Error         string    `json:"error"`
	Attempts      int       `json:"attempts"`
	FirstFailedAt time.Time `json:"first_failed_at"`
	LastFailedAt  time.Time `json:"last_failed_at"`
	Topic         string    `json:"topic,omitempty"` // where the message was read
	Stream        string    `json:"stream"`
	// File and Line say where a file or stdin source read a message it could not pass on.
	File      string `json:"file,omitempty"`
	Line      int64  `json:"line,omitempty"`
	Partition int    `json:"partition"`
	ID        string `json:"id,omitempty"`
	// Path tells apart the messages that the stages of a fused chain made of the entry ID (see
	// Retry.Path); empty for a message read from a stream.
	Path      string            `json:"path,omitempty"`
	Key       string            `json:"key,omitempty"`
	Payload   json.RawMessage   `json:"payload,omitempty"`    // the original JSON payload
	RawFields map[string]string `json:"raw_fields,omitempty"` // a malformed entry's fields
	Headers   map[string]string `json:"headers,omitempty"`
	// TraceParent and TraceState are the message's trace context, also kept in the entry's own
	// fields.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// DeadLetter is one dead letter as read back from its stream (package runtime/admin reads them).
type DeadLetter struct {
	// ID is the dead letter's entry ID in Stream.
	ID       string
	Stream   string
	Envelope Envelope
	// Malformed says why the entry is not a readable dead letter (someone else wrote it there).
	Malformed string
	// Replayed is when it was replayed; zero if it was not.
	Replayed time.Time
}
