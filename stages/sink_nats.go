package stages

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The nats sink's attributes (url is the source's natsFieldURL).
const (
	natsSinkFieldSubject = "subject"
	natsSinkFieldTimeout = "timeout"
)

// The nats sink publishes each message to JetStream, on the subject its expression gives, and the
// runtime acknowledges the message's entry only once JetStream has confirmed it (its PubAck). Each
// publication carries a Nats-Msg-Id made of the entry's identity (the pipeline, the sink, the input
// partition and the entry's ID, the same on every delivery), so that JetStream stores a message
// that the sink delivers again (after a crash, a timeout) once, within the stream's duplicate
// window. A NATS that is away pauses the sink; JetStream's refusal of a message (no stream takes
// its subject, too large for the stream) dead-letters it with JetStream's reason.
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "nats",
			Doc: "Publishes each message to NATS JetStream on the subject its expression gives, with the message's " +
				"headers and trace context as NATS headers, and a Nats-Msg-Id by which JetStream stores a message " +
				"delivered again once. The entry is acknowledged only once JetStream has confirmed it. NATS away pauses " +
				"the sink; a message JetStream refuses (no stream for its subject, too large) is dead-lettered with the reason.",
			Attributes: []flow.Attribute{
				{Name: natsFieldURL, Type: flow.TypeString, Required: true,
					Doc: "The NATS server(s): nats://host:4222, several separated by commas; a user and password in the URL " +
						"never appear in output."},
				{Name: natsSinkFieldSubject, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg", "key"},
					Doc: "The subject to publish each message on, which a JetStream stream must take, such as " +
						"\"orders.${msg.region}\"; key is the message's key: \"${key}\" publishes a nats source's messages on their own subjects."},
				{Name: natsSinkFieldTimeout, Type: flow.TypeDuration, Default: 10 * time.Second,
					Doc: "How long JetStream may take to confirm a batch of publications."},
			},
			Example: `sink "shipped" {
  kind    = "nats"
  input   = stage.shipped
  url     = "nats://127.0.0.1:4222"
  subject = "shipped.${msg.region}"
}`,
			Check: func(c *flow.KindCheck) {
				checkNATSURL(c)
				if c.Config.Duration(natsSinkFieldTimeout) <= 0 {
					c.Errorf(natsSinkFieldTimeout, "Invalid timeout", "Give a duration above 0, such as \"10s\".")
				}
			},
		},
		Traits: SinkTraits{Inline: true}, // a batch at a time, in order: DeliverBatch publishes it at once
		New: func(s *flow.Sink, env Env) (Sink, error) {
			return &natsSink{
				conn:    newNATSConn(s.Config.String(natsFieldURL), "flowrun "+env.Pipeline+" "+s.Name, env),
				subject: s.Config.Expr(natsSinkFieldSubject), timeout: s.Config.Duration(natsSinkFieldTimeout),
				idPrefix: env.Pipeline + "/" + s.Name + "/",
			}, nil
		},
	})
}

// natsSink is a nats sink. It connects with its first delivery, so that a NATS that is away at
// the start pauses it like any outage.
type natsSink struct {
	conn     natsConn
	subject  *expr.Program
	timeout  time.Duration
	idPrefix string // of the Nats-Msg-Id

	mu sync.Mutex
	nc *nats.Conn
	js jetstream.JetStream
}

func (s *natsSink) Timeout() time.Duration { return s.timeout }

// Deliver is DeliverBatch's for one message (the runtime calls DeliverBatch only).
func (s *natsSink) Deliver(ctx context.Context, m *Message, out []Write) ([]Write, error) {
	parent, state := TraceFrom(ctx)
	d := []Delivery{{Message: m, Traceparent: parent, Tracestate: state}}
	s.DeliverBatch(ctx, d)
	return out, d[0].Err
}

// DeliverBatch publishes the batch asynchronously, in order on one connection (so each key's
// order holds), and waits for every PubAck.
func (s *natsSink) DeliverBatch(ctx context.Context, batch []Delivery) {
	js, err := s.jetStream()
	if err == nil && !s.connected() {
		// Said plainly: publications would fail with errors that name other things ("headers
		// not supported" before the server's first INFO).
		err = Transient(fmt.Errorf("nats: not connected to %s; reconnecting", s.conn.shown))
	}
	if err != nil {
		for i := range batch {
			batch[i].Err = err
		}
		return
	}
	futures := make([]jetstream.PubAckFuture, len(batch))
	for i := range batch {
		msg, err := s.natsMsg(batch[i])
		if err != nil {
			batch[i].Err = err
			continue
		}
		id := s.idPrefix + strconv.Itoa(batch[i].Partition) + "/" + batch[i].ID
		futures[i], err = js.PublishMsgAsync(msg, jetstream.WithMsgID(id))
		if err != nil {
			batch[i].Err = s.classify(ctx, js, msg.Subject, err)
		}
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			batch[i].Err = s.classify(ctx, js, f.Msg().Subject, err)
		case <-ctx.Done():
			batch[i].Err = Transient(fmt.Errorf("nats: no PubAck from JetStream in time: %w", ctx.Err()))
		}
	}
}

// natsMsg makes the NATS message of a delivery: its payload, its subject, its headers and trace
// context.
func (s *natsSink) natsMsg(d Delivery) (*nats.Msg, error) {
	m := d.Message
	if err := m.Decode(); err != nil {
		return nil, err
	}
	subject, err := s.subject.EvalString(&expr.Env{Msg: m.Value, Vars: map[string]any{"key": m.Key}})
	if err != nil {
		return nil, evalError(err)
	}
	if subject == "" || strings.ContainsAny(subject, " \t\r\n*>") || strings.HasPrefix(subject, ".") || strings.HasSuffix(subject, ".") ||
		strings.Contains(subject, "..") {
		return nil, Permanent(fmt.Errorf("nats: %q is not a subject a message can be published on", subject))
	}
	payload, err := m.Payload()
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = payload
	for k, v := range m.Headers {
		msg.Header.Set(k, v)
	}
	if d.Traceparent != "" {
		msg.Header.Set(natsTraceparent, d.Traceparent)
		if d.Tracestate != "" {
			msg.Header.Set(natsTracestate, d.Tracestate)
		}
	}
	return msg, nil
}

// jetStream returns the sink's JetStream context, connecting first.
func (s *natsSink) jetStream() (jetstream.JetStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.js != nil {
		return s.js, nil
	}
	nc, err := s.conn.connect()
	if err != nil {
		return nil, Transient(err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(s.timeout))
	if err != nil {
		nc.Close()
		return nil, Transient(err)
	}
	s.nc, s.js = nc, js
	return js, nil
}

// connected reports whether the sink's connection is up.
func (s *natsSink) connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nc != nil && s.nc.IsConnected()
}

// natsTransientCodes are JetStream's refusals that waiting mends: the cluster or its storage is
// away or full for now. Its other refusals are about the message, and final.
var natsTransientCodes = map[jetstream.ErrorCode]bool{
	10008: true, // JSClusterNotAvailErr
	10023: true, // JSInsufficientResourcesErr
	10047: true, // JSStorageResourcesExceededErr
	10077: true, // JSStreamStoreFailedF
}

// classify says what a failed publication is: permanent when JetStream refused the message (no
// stream takes its subject, too large), transient otherwise (NATS away, no answer in time).
func (s *natsSink) classify(ctx context.Context, js jetstream.JetStream, subject string, err error) error {
	var api *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadSubject):
		return Permanent(fmt.Errorf("nats: publishing on %s: %w", subject, err))
	case errors.As(err, &api):
		if natsTransientCodes[api.ErrorCode] {
			return Transient(fmt.Errorf("nats: JetStream refused the message on %s for now: %w", subject, err))
		}
		return Permanent(fmt.Errorf("nats: JetStream refused the message on %s: %w", subject, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		// No stream answered: none takes the subject, or JetStream is away (a server restarting).
		// Asking which stream takes it tells the two apart.
		lctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		if _, lerr := js.StreamNameBySubject(lctx, subject); errors.Is(lerr, jetstream.ErrStreamNotFound) {
			return Permanent(fmt.Errorf("nats: no JetStream stream takes the subject %s", subject))
		}
	}
	return Transient(errors.New(s.conn.redact("nats: publishing on " + subject + ": " + err.Error())))
}

// Close closes the connection, once the runtime is done with the sink.
func (s *natsSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nc != nil {
		s.nc.Close()
		s.nc, s.js = nil, nil
	}
	return nil
}
