package stages

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The amqp sink's attributes (url is the source's amqpFieldURL).
const (
	amqpSinkFieldExchange    = "exchange"
	amqpSinkFieldRoutingKey  = "routing_key"
	amqpSinkFieldMandatory   = "mandatory"
	amqpSinkFieldPersistent  = "persistent"
	amqpSinkFieldContentType = "content_type"
	amqpSinkFieldTimeout     = "timeout"
)

// The amqp sink publishes each message to an exchange with the routing key its expression gives,
// on a channel in confirm mode, and the runtime acknowledges the message's entry only once the
// broker has confirmed it (basic.ack). Each publication's message_id is made of the entry's
// identity (the pipeline, the sink, the input partition and the entry's ID, the same on every
// delivery): RabbitMQ does not drop repeats itself, but a consumer that does (an amqp source with
// effectively-once delivery) takes a message the sink published again (after a crash, an outage)
// once. A broker that is away pauses the sink; what the broker refuses (no such exchange, a
// mandatory message no queue takes, a basic.nack) is dead-lettered with the broker's reason.
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "amqp",
			Doc: "Publishes each message to an AMQP 0-9-1 exchange (RabbitMQ) with the routing key its expression gives, with " +
				"the message's headers and trace context as AMQP headers and a message_id by which a consumer can drop a message " +
				"published again. The entry is acknowledged only once the broker has confirmed it (publisher confirms). The " +
				"broker away pauses the sink; a message it refuses (no such exchange, unroutable with mandatory, nack) is " +
				"dead-lettered with the reason.",
			Attributes: []flow.Attribute{
				{Name: amqpFieldURL, Type: flow.TypeString, Required: true,
					Doc: "The broker: amqp://user:password@host:5672/vhost (amqps:// for TLS); the password never appears in output."},
				{Name: amqpSinkFieldExchange, Type: flow.TypeMessageExpr, Roots: []string{"msg", "key"}, DefaultDoc: "`\"\"`, the default exchange",
					Doc: "The exchange to publish to, which must exist: a name, or an expression such as \"orders.${msg.region}\"; " +
						"default \"\", the default exchange, which routes a message to the queue its routing key names."},
				{Name: amqpSinkFieldRoutingKey, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg", "key"},
					Doc: "The routing key of each message, such as \"orders.${msg.region}\"; key is the message's key: \"${key}\" " +
						"publishes an amqp source's messages with their own routing keys."},
				{Name: amqpSinkFieldMandatory, Type: flow.TypeBool, Default: true,
					Doc: "Publishes with the mandatory flag: a message that no queue takes is returned by the broker and dead-lettered " +
						"(false: the broker drops it, and the entry is acknowledged)."},
				{Name: amqpSinkFieldPersistent, Type: flow.TypeBool, Default: true,
					Doc: "Publishes with delivery mode 2 (persistent), which a durable queue keeps across a broker restart; false: delivery mode 1."},
				{Name: amqpSinkFieldContentType, Type: flow.TypeString, Default: "application/json",
					Doc: "The content_type property of each message."},
				{Name: amqpSinkFieldTimeout, Type: flow.TypeDuration, Default: 10 * time.Second,
					Doc: "How long the broker may take to confirm a batch of publications."},
			},
			Example: `sink "shipped" {
  kind        = "amqp"
  input       = stage.shipped
  url         = "amqp://guest:guest@127.0.0.1:5672/"
  exchange    = "shipped"
  routing_key = "shipped.${msg.region}"
}`,
			Check: func(c *flow.KindCheck) {
				checkAMQPURL(c)
				if c.Config.Duration(amqpSinkFieldTimeout) <= 0 {
					c.Errorf(amqpSinkFieldTimeout, "Invalid timeout", "Give a duration above 0, such as \"10s\".")
				}
			},
		},
		Traits: SinkTraits{Inline: true}, // a batch at a time, in order: DeliverBatch publishes it at once
		New: func(s *flow.Sink, env Env) (Sink, error) {
			c := s.Config
			var exchange *expr.Program // nil: the default exchange
			if c.Has(amqpSinkFieldExchange) {
				exchange = c.Expr(amqpSinkFieldExchange)
			}
			return &amqpSink{
				exchange:   exchange,
				conn:       newAMQPConn(c.String(amqpFieldURL), "flowrun "+env.Pipeline+" "+s.Name, env),
				routingKey: c.Expr(amqpSinkFieldRoutingKey),
				mandatory:  c.Bool(amqpSinkFieldMandatory), persistent: c.Bool(amqpSinkFieldPersistent),
				contentType: c.String(amqpSinkFieldContentType), timeout: c.Duration(amqpSinkFieldTimeout),
				idPrefix: env.Pipeline + "/" + s.Name + "/",
			}, nil
		},
	})
}

// amqpSink is an amqp sink. It connects with its first delivery, so that a broker that is away at
// the start pauses it like any outage.
type amqpSink struct {
	conn        amqpConn
	exchange    *expr.Program
	routingKey  *expr.Program
	mandatory   bool
	persistent  bool
	contentType string
	timeout     time.Duration
	idPrefix    string // of the message_id

	mu      sync.Mutex // over the connection; DeliverBatch is called one batch at a time
	c       *amqp.Connection
	raw     atomic.Value     // of net.Conn: c's TCP connection, which the watchdog closes
	ch      *amqp.Channel    // in confirm mode
	returns chan amqp.Return // the channel's basic.returns
	closed  chan *amqp.Error // why the channel closed

	exchanges map[string]bool // the exchanges found on the broker
}

func (s *amqpSink) Timeout() time.Duration { return s.timeout }

// Deliver is DeliverBatch's for one message (the runtime calls DeliverBatch only).
func (s *amqpSink) Deliver(ctx context.Context, m *Message, out []Write) ([]Write, error) {
	parent, state := TraceFrom(ctx)
	d := []Delivery{{Message: m, Traceparent: parent, Tracestate: state}}
	s.DeliverBatch(ctx, d)
	return out, d[0].Err
}

// amqpPublication is a delivery's publication: where it went, and its confirmation.
type amqpPublication struct {
	exchange, key string
	confirm       *amqp.DeferredConfirmation
}

// DeliverBatch publishes the batch in order on one channel (so each key's order holds), and waits
// for the broker to confirm every publication.
func (s *amqpSink) DeliverBatch(ctx context.Context, batch []Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A call on the connection blocks while the broker does not read (one that blocks publishers,
	// a connection that hangs): past the timeout, the watchdog closes the TCP connection, which
	// fails what is blocked on it, and the batch is tried again on a new one.
	watchdog := time.AfterFunc(s.timeout+time.Second, func() {
		if raw, ok := s.raw.Load().(net.Conn); ok {
			_ = raw.Close()
		}
	})
	defer watchdog.Stop()
	if err := s.open(); err != nil {
		for i := range batch {
			batch[i].Err = err
		}
		return
	}
	pubs := make([]amqpPublication, len(batch))
	ids := make(map[string]int, len(batch))
	missing := map[string]string{} // the batch's exchanges that are not on the broker
	for i := range batch {
		p, msg, err := s.publication(batch[i])
		if err != nil {
			batch[i].Err = err
			continue
		}
		if why := s.missingExchange(p.exchange, missing); why != "" {
			// Not published: the broker would close the channel, and with it the batch's other
			// publications.
			batch[i].Err = Permanent(fmt.Errorf("amqp: no exchange %q on the broker: 404 %s", p.exchange, why))
			continue
		}
		ids[msg.MessageId] = i
		pubs[i] = p
		pubs[i].confirm, err = s.ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, p.key, s.mandatory, false, msg)
		if err != nil {
			batch[i].Err = Transient(errors.New(s.conn.redact("amqp: publishing: " + err.Error())))
		}
	}
	// The broker sends a message's basic.return before its basic.ack: once every confirmation is
	// in, so is every return.
	returned := map[int]amqp.Return{}
	note := func(r amqp.Return) {
		if i, ok := ids[r.MessageId]; ok {
			returned[i] = r
		}
	}
	deadline := time.NewTimer(s.timeout)
	defer deadline.Stop()
	returns := s.returns
wait:
	for i := range pubs {
		for pubs[i].confirm != nil {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				note(r)
				continue
			case <-pubs[i].confirm.Done():
			case <-ctx.Done():
				break wait
			case <-deadline.C:
				break wait
			}
			break
		}
	}
	for more := returns != nil; more; {
		select {
		case r, ok := <-returns:
			if more = ok; ok {
				note(r)
			}
		default:
			more = false
		}
	}
	var closeErr *amqp.Error
	if s.ch.IsClosed() {
		select {
		case closeErr = <-s.closed:
		default:
		}
	}
	for i, p := range pubs {
		switch {
		case p.confirm == nil:
		case !isDone(p.confirm.Done()):
			batch[i].Err = Transient(fmt.Errorf("amqp: no confirmation from the broker within %s", s.timeout))
		case p.confirm.Acked():
			if r, ok := returned[i]; ok {
				batch[i].Err = Permanent(fmt.Errorf("amqp: the broker returned the message published to exchange %q with routing key %q: %d %s",
					p.exchange, p.key, r.ReplyCode, r.ReplyText))
			}
		case closeErr != nil && closeErr.Code == amqp.NotFound && s.missingExchange(p.exchange, missing) != "":
			batch[i].Err = Permanent(fmt.Errorf("amqp: no exchange %q on the broker: %d %s", p.exchange, closeErr.Code, closeErr.Reason))
		case s.ch.IsClosed():
			why := "the channel closed"
			if closeErr != nil {
				why = closeErr.Error()
			}
			batch[i].Err = Transient(errors.New(s.conn.redact("amqp: publishing to exchange " + strconv.Quote(p.exchange) + ": " + why)))
		default:
			batch[i].Err = Permanent(fmt.Errorf("amqp: the broker refused (basic.nack) the message published to exchange %q with routing key %q "+
				"(a queue full with overflow reject-publish, or an error of the queue's)", p.exchange, p.key))
		}
	}
	if s.ch.IsClosed() {
		s.ch = nil // the next batch opens another
		if closeErr != nil && closeErr.Code == amqp.NotFound {
			s.exchanges = nil // one was deleted: ask again
		}
	}
}

// isDone reports whether c is closed.
func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// publication makes the AMQP message of a delivery: its exchange and routing key, its payload,
// properties, headers and trace context.
func (s *amqpSink) publication(d Delivery) (amqpPublication, amqp.Publishing, error) {
	m := d.Message
	if err := m.Decode(); err != nil {
		return amqpPublication{}, amqp.Publishing{}, err
	}
	env := &expr.Env{Msg: m.Value, Vars: map[string]any{"key": m.Key}}
	exchange := ""
	if s.exchange != nil {
		var err error
		if exchange, err = s.exchange.EvalString(env); err != nil {
			return amqpPublication{}, amqp.Publishing{}, evalError(err)
		}
	}
	key, err := s.routingKey.EvalString(env)
	if err != nil {
		return amqpPublication{}, amqp.Publishing{}, evalError(err)
	}
	if len(exchange) > 255 || len(key) > 255 {
		return amqpPublication{}, amqp.Publishing{}, Permanent(fmt.Errorf("amqp: exchange %.40q... or routing key %.40q... is longer than AMQP's 255 bytes", exchange, key))
	}
	payload, err := m.Payload()
	if err != nil {
		return amqpPublication{}, amqp.Publishing{}, err
	}
	msg := amqp.Publishing{
		ContentType: s.contentType, DeliveryMode: amqp.Transient, Body: payload,
		MessageId: s.idPrefix + strconv.Itoa(d.Partition) + "/" + d.ID,
	}
	if s.persistent {
		msg.DeliveryMode = amqp.Persistent
	}
	if len(m.Headers) > 0 || d.Traceparent != "" {
		msg.Headers = amqp.Table{}
		for k, v := range m.Headers {
			msg.Headers[k] = v
		}
		if d.Traceparent != "" {
			msg.Headers[amqpTraceparent] = d.Traceparent
			if d.Tracestate != "" {
				msg.Headers[amqpTracestate] = d.Tracestate
			}
		}
	}
	return amqpPublication{exchange: exchange, key: key}, msg, nil
}

// open connects, and opens a channel in confirm mode, where there is none.
func (s *amqpSink) open() error {
	if s.ch != nil && !s.ch.IsClosed() {
		return nil
	}
	if s.c == nil || s.c.IsClosed() {
		c, raw, err := s.conn.dial()
		if err != nil {
			return Transient(err)
		}
		s.c = c
		s.raw.Store(raw)
	}
	ch, err := s.c.Channel()
	if err == nil {
		if err = ch.Confirm(false); err != nil {
			_ = ch.Close()
		}
	}
	if err != nil {
		_ = s.c.CloseDeadline(time.Now().Add(s.timeout))
		s.c = nil
		return Transient(errors.New(s.conn.redact("amqp: opening a channel on " + s.conn.shown + ": " + err.Error())))
	}
	s.ch = ch
	s.returns = ch.NotifyReturn(make(chan amqp.Return, 256))
	s.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}

// missingExchange says why the exchange is not on the broker ("" when it is): the sink asks the broker
// (a passive declaration, on a channel of its own, which the broker closes when the answer is no)
// once for an exchange that is there, and once a batch for one that is not, whose answers known
// holds.
func (s *amqpSink) missingExchange(exchange string, known map[string]string) string {
	if exchange == "" || s.exchanges[exchange] {
		return "" // the default exchange is always there
	}
	if why, ok := known[exchange]; ok {
		return why
	}
	if s.c == nil || s.c.IsClosed() {
		return ""
	}
	ch, err := s.c.Channel()
	if err != nil {
		return ""
	}
	err = ch.ExchangeDeclarePassive(exchange, amqp.ExchangeDirect, true, false, false, false, nil)
	switch {
	case err == nil:
		_ = ch.Close()
		if s.exchanges == nil {
			s.exchanges = map[string]bool{}
		}
		s.exchanges[exchange] = true
	case amqpCode(err, amqp.NotFound):
		known[exchange] = err.(*amqp.Error).Reason
	}
	return known[exchange] // "" when not known: the publication tells
}

// Close closes the connection, once the runtime is done with the sink.
func (s *amqpSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		_ = s.c.CloseDeadline(time.Now().Add(s.timeout))
		s.c, s.ch = nil, nil
	}
	return nil
}
