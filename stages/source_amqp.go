// This file holds the amqp source kind: it consumes an AMQP 0-9-1 queue (RabbitMQ) with manual
// acknowledgements, and acknowledges each message to the broker only once Redis has its entry. The
// amqp sink is sink_amqp.go; what both share (connecting, headers, secrets) is at the end of this
// file.

package stages

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/flowrun/flowrun/flow"
)

// The amqp source's attributes.
const (
	amqpFieldURL              = "url"
	amqpSourceFieldQueue      = "queue"
	amqpSourceFieldExchange   = "exchange"
	amqpSourceFieldBindingKey = "binding_key"
	amqpSourceFieldPrefetch   = "prefetch"
	amqpSourceFieldTag        = "consumer_tag"
)

// amqpAckEvery is how often the source reads, from Redis, how far its messages are written, and
// acknowledges those to the broker; amqpLagEvery, how often it asks the broker for the queue's
// depth.
const (
	amqpAckEvery = 100 * time.Millisecond
	amqpLagEvery = time.Second
)

// The amqp source consumes a queue, keyed by each message's routing key, and acknowledges a
// message to the broker only after Redis has it: each message's Origin.Position is the run, the
// channel and the message's delivery tag on it, which the runtime records in Redis with the batch
// the message is in; a goroutine of the source reads it back (Emitter.Resume) and acknowledges
// every delivery up to that tag at once (basic.ack with multiple). What is not acknowledged when
// the channel closes (a crash, an outage) the broker delivers again: a message's Origin.ID is its
// message_id property, the same on every delivery, which effectively-once delivery writes once. A
// message without a message_id gets an ID of its delivery's own, so that one delivered again after
// a crash may be written twice.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "amqp",
			Doc: "Consumes an AMQP 0-9-1 queue (RabbitMQ): each message (a JSON object) is passed on keyed by its routing key, " +
				"with its AMQP headers, and acknowledged to the broker only once Redis has it, so a crash or an outage loses " +
				"nothing; a message delivered again is written once with delivery = \"effectively_once\" when it has a " +
				"message_id. See docs/connectors.md.",
			Attributes: []flow.Attribute{
				{Name: amqpFieldURL, Type: flow.TypeString, Required: true,
					Doc: "The broker: amqp://user:password@host:5672/vhost (amqps:// for TLS); the password never appears in output."},
				{Name: amqpSourceFieldQueue, Type: flow.TypeString, Required: true,
					Doc: "The queue to consume; declared (durable) if it does not exist, used as it is if it does."},
				{Name: amqpSourceFieldExchange, Type: flow.TypeString,
					Doc: "An exchange to bind the queue to (with binding_key) before consuming; it must exist. Default: no binding is declared."},
				{Name: amqpSourceFieldBindingKey, Type: flow.TypeString,
					Doc: "The binding key of the binding to exchange, such as \"orders.#\" on a topic exchange; default \"\". Only with exchange."},
				{Name: amqpSourceFieldPrefetch, Type: flow.TypeInteger, Default: int64(2000), Min: flow.Bound(1), Max: flow.Bound(65535),
					Doc: "The most messages delivered and not yet acknowledged (basic.qos prefetch count, in flight to Redis): the " +
						"default is two of the source's batches, one being written while the next fills."},
				{Name: amqpSourceFieldTag, Type: flow.TypeString,
					Doc: "The consumer tag the broker shows for the source's consumer; default: one the broker makes up."},
			},
			Example: `source "orders" {
  kind        = "amqp"
  url         = "amqp://guest:guest@127.0.0.1:5672/"
  queue       = "flowrun_orders"
  exchange    = "orders"
  binding_key = "orders.#"
  output      = topic.orders
}`,
			Detail: func(c flow.Attrs) string {
				d := "amqp: " + c.String(amqpSourceFieldQueue)
				if c.Has(amqpSourceFieldExchange) {
					d += " <- " + c.String(amqpSourceFieldExchange)
				}
				return d
			},
			Check: func(c *flow.KindCheck) {
				checkAMQPURL(c)
				if c.Config.Has(amqpSourceFieldBindingKey) && !c.Config.Has(amqpSourceFieldExchange) {
					c.Errorf(amqpSourceFieldBindingKey, "binding_key without exchange", "Give the exchange to bind the queue to, or remove binding_key.")
				}
				for _, name := range []string{amqpSourceFieldQueue, amqpSourceFieldExchange, amqpSourceFieldBindingKey, amqpSourceFieldTag} {
					if c.Config.Has(name) && len(c.Config.String(name)) > 255 {
						c.Errorf(name, "Invalid "+name, "AMQP takes at most 255 bytes here.")
					}
				}
				if c.Config.Has(amqpSourceFieldQueue) && c.Config.String(amqpSourceFieldQueue) == "" {
					c.Errorf(amqpSourceFieldQueue, "Invalid queue", "Name the queue to consume.")
				}
			},
		},
		// Resumes: the runtime records each batch's last position, which is how the source learns
		// what Redis has; where to start again is the broker's, in the queue.
		Traits: SourceTraits{Resumes: true, Finite: func(flow.Attrs) (bool, int64) { return false, -1 }},
		New: func(s *flow.Source, env Env) (Source, error) {
			c := s.Config
			src := &amqpSource{
				conn:  newAMQPConn(c.String(amqpFieldURL), "flowrun "+env.Pipeline+" "+s.Name, env),
				queue: c.String(amqpSourceFieldQueue), exchange: c.String(amqpSourceFieldExchange),
				bindingKey: c.String(amqpSourceFieldBindingKey), bind: c.Has(amqpSourceFieldExchange),
				prefetch: int(c.Int(amqpSourceFieldPrefetch)), tag: c.String(amqpSourceFieldTag),
				run: NewRunID(), log: env.Logger, clock: env.Clock,
			}
			if src.log == nil {
				src.log = slog.New(slog.DiscardHandler)
			}
			if src.clock == nil {
				src.clock = SystemClock{}
			}
			src.log = src.log.With("source", s.Name, "queue", src.queue)
			return src, nil
		},
	})
}

// amqpSource is an amqp source.
type amqpSource struct {
	conn       amqpConn
	queue      string
	exchange   string
	bindingKey string
	bind       bool
	prefetch   int
	tag        string
	run        string // names this run's positions: a position of another run acknowledges nothing
	log        *slog.Logger
	clock      Clock

	mu    sync.Mutex
	ch    *amqp.Channel // the channel consumed, nil between sessions
	gen   uint64        // counts the channels: delivery tags are a channel's own
	acked uint64        // the last delivery tag acknowledged on ch
}

// amqpPosition is the position the source gives each message: the run, the channel and the
// message's delivery tag on it. Redis's copy says that every message up to it is written.
type amqpPosition struct {
	Run string `json:"run"`
	Gen uint64 `json:"gen"`
	Tag uint64 `json:"tag"`
}

// The waits between attempts to connect and consume.
const (
	amqpRetryFirst   = 500 * time.Millisecond
	amqpRetryLongest = 30 * time.Second
)

// amqpEnd is an error that ends the source: of the Emitter (the run stops, or its lease was
// lost), or a refusal of the broker's that waiting does not mend.
type amqpEnd struct{ err error }

func (e amqpEnd) Error() string { return e.err.Error() }

func (s *amqpSource) Produce(ctx context.Context, out Emitter) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.acknowledge(ctx, out) }()
	defer wg.Wait()
	defer cancel()

	wait := amqpRetryFirst
	for {
		progressed, err := s.session(ctx, out)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var end amqpEnd
		if errors.As(err, &end) {
			return end.err
		}
		if progressed {
			wait = amqpRetryFirst
		}
		s.log.Warn("amqp: consuming the queue failed; trying again", "err", s.conn.redact(err.Error()), "in", wait)
		if err := Sleep(ctx, s.clock, wait); err != nil {
			return err
		}
		wait = min(2*wait, amqpRetryLongest)
	}
}

// session connects, sets up the queue (and its binding), and passes its messages on until an
// error: the connection lost, the consumer cancelled (the queue deleted).
func (s *amqpSource) session(ctx context.Context, out Emitter) (progressed bool, err error) {
	conn, _, err := s.conn.dial()
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close() }()
	ch, err := s.declare(conn)
	if err != nil {
		return false, err
	}
	if err := ch.Qos(s.prefetch, 0, false); err != nil {
		return false, err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, s.queue, s.tag, false, false, false, false, nil)
	if err != nil {
		return false, s.refused(err, "consuming the queue "+strconv.Quote(s.queue))
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	s.mu.Lock()
	s.gen++
	gen := s.gen
	s.ch, s.acked = ch, 0
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.ch = nil
		s.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			s.lastAck(out)
			return progressed, ctx.Err()
		case d, ok := <-deliveries:
			if !ok && ctx.Err() != nil {
				s.lastAck(out)
				return progressed, ctx.Err()
			}
			if !ok {
				if e, ok := <-closed; ok && e != nil {
					return progressed, e
				}
				return progressed, fmt.Errorf("the broker cancelled the consumer of %q (the queue deleted?)", s.queue)
			}
			if err := s.pass(ctx, gen, d, out); err != nil {
				return progressed, amqpEnd{err}
			}
			progressed = true
		}
	}
}

// declare opens the channel to consume on: the queue declared if it does not exist (durable), and
// bound to the exchange when the source names one.
func (s *amqpSource) declare(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if _, err := ch.QueueDeclarePassive(s.queue, true, false, false, false, nil); err != nil {
		// A queue that is not there closed the channel: declare it on another.
		if !amqpCode(err, amqp.NotFound) {
			return nil, s.refused(err, "looking up the queue "+strconv.Quote(s.queue))
		}
		if ch, err = conn.Channel(); err != nil {
			return nil, err
		}
		if _, err := ch.QueueDeclare(s.queue, true, false, false, false, nil); err != nil {
			return nil, s.refused(err, "declaring the queue "+strconv.Quote(s.queue))
		}
	}
	if s.bind {
		if err := ch.QueueBind(s.queue, s.bindingKey, s.exchange, false, nil); err != nil {
			return nil, s.refused(err, fmt.Sprintf("binding the queue %q to the exchange %q", s.queue, s.exchange))
		}
	}
	return ch, nil
}

// refused says what a refusal of the broker's is: one that ends the run (no such exchange, access
// refused, a queue declared otherwise), or one to try again.
func (s *amqpSource) refused(err error, doing string) error {
	var e *amqp.Error
	if errors.As(err, &e) && (e.Code == amqp.NotFound || e.Code == amqp.AccessRefused || e.Code == amqp.PreconditionFailed) {
		return amqpEnd{fmt.Errorf("amqp: %s on %s: %s", doing, s.conn.shown, e.Reason)}
	}
	return err
}

// pass emits one message, keyed by its routing key, with its headers and trace context.
func (s *amqpSource) pass(ctx context.Context, gen uint64, d amqp.Delivery, out Emitter) error {
	pos, _ := json.Marshal(amqpPosition{Run: s.run, Gen: gen, Tag: d.DeliveryTag}) // strings and numbers only
	at := Origin{ID: d.MessageId, Position: string(pos)}
	if at.ID == "" {
		at.ID = s.run + ":" + strconv.FormatUint(gen, 10) + ":" + strconv.FormatUint(d.DeliveryTag, 10)
	}
	headers, parent, state := fromAMQPHeaders(d.Headers)
	m := NewMessage(d.RoutingKey, d.Body, headers)
	if parent != "" {
		ctx = ContextWithTrace(ctx, parent, state)
	}
	if err := CheckPayload(d.Body); err != nil {
		// Dead-lettered, with its position: acknowledged like a message written.
		return out.Reject(ctx, Permanent(fmt.Errorf("the message from %q with routing key %q is not a JSON object: %w", s.queue, d.RoutingKey, err)), m, at)
	}
	return out.Emit(ctx, m, at)
}

// acknowledge acknowledges to the broker, every amqpAckEvery, the deliveries whose entries Redis
// has: every one up to the position the runtime recorded with the last batch written, at once. It
// reports the queue's depth every amqpLagEvery.
func (s *amqpSource) acknowledge(ctx context.Context, out Emitter) {
	tick := s.clock.NewTicker(amqpAckEvery)
	defer tick.Stop()
	lagged := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		if now := s.clock.Now(); now.Sub(lagged) >= amqpLagEvery {
			lagged = now
			s.reportLag(out)
		}
		raw, found, err := out.Resume(ctx)
		if err == nil && found {
			s.ackUpTo(raw)
		}
	}
}

// lastAck acknowledges, as the source stops, what Redis has, so that a stop that is not a crash
// leaves nothing to deliver again.
func (s *amqpSource) lastAck(out Emitter) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if raw, found, err := out.Resume(ctx); err == nil && found {
		s.ackUpTo(raw)
	}
}

// ackUpTo acknowledges every delivery of the channel up to the position raw, when it is this
// run's and this channel's.
func (s *amqpSource) ackUpTo(raw string) {
	var pos amqpPosition
	if json.Unmarshal([]byte(raw), &pos) != nil || pos.Run != s.run {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil && pos.Gen == s.gen && pos.Tag > s.acked {
		// An acknowledgement that fails (the connection away) leaves the messages to be
		// delivered again, which effectively-once delivery writes once.
		if s.ch.Ack(pos.Tag, true) == nil {
			s.acked = pos.Tag
		}
	}
}

// reportLag asks the broker how many messages the queue holds ready (not delivered to the
// source), and reports it.
func (s *amqpSource) reportLag(out Emitter) {
	s.mu.Lock()
	ch := s.ch
	s.mu.Unlock()
	if ch == nil {
		return
	}
	if q, err := ch.QueueDeclarePassive(s.queue, true, false, false, false, nil); err == nil {
		out.ReportLag(int64(q.Messages))
	}
}

// amqpConn is how an amqp source or sink connects: the URL, and what hides its password.
type amqpConn struct {
	url    string
	name   string // the connection's name, which the broker shows (rabbitmqctl list_connections client_properties)
	shown  string // the URL without its password
	redact func(string) string
}

func newAMQPConn(raw, name string, env Env) amqpConn {
	c := amqpConn{url: raw, name: name, shown: raw, redact: env.Redact}
	if c.redact == nil {
		c.redact = func(s string) string { return s }
	}
	if u, err := amqp.ParseURI(raw); err == nil && u.Password != "" && strings.Contains(raw, u.Password) {
		p := u.Password
		c.shown = strings.Replace(raw, ":"+p+"@", ":(password)@", 1)
		redact := c.redact
		c.redact = func(s string) string { return redact(strings.ReplaceAll(s, p, "(password)")) }
	}
	return c
}

// dial connects to the broker, with heartbeats so that a broker gone silent is noticed. It returns
// the TCP connection under it too: closing that ends every call on the connection at once, also
// one blocked writing to a broker that no longer reads.
func (c amqpConn) dial() (*amqp.Connection, net.Conn, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.name)
	var raw net.Conn
	dial := amqp.DefaultDial(10 * time.Second)
	conn, err := amqp.DialConfig(c.url, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US", Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			var err error
			raw, err = dial(network, addr)
			return raw, err
		}})
	if err != nil {
		return nil, nil, errors.New(c.redact("amqp: connecting to " + c.shown + ": " + err.Error()))
	}
	return conn, raw, nil
}

// checkAMQPURL checks the url attribute, and declares its password a secret.
func checkAMQPURL(c *flow.KindCheck) {
	if !c.Config.Has(amqpFieldURL) {
		return
	}
	u, err := amqp.ParseURI(c.Config.String(amqpFieldURL))
	if err != nil {
		c.Errorf(amqpFieldURL, "Invalid url", "%s: write amqp://user:password@host:5672/vhost.", err)
		return
	}
	if u.Password != "" {
		c.Secret(u.Password)
	}
}

// amqpCode reports whether err is the broker's error of that code.
func amqpCode(err error, code int) bool {
	var e *amqp.Error
	return errors.As(err, &e) && e.Code == code
}

// The W3C trace context's headers, which travel in AMQP headers.
const (
	amqpTraceparent = "traceparent"
	amqpTracestate  = "tracestate"
)

// fromAMQPHeaders splits an AMQP message's headers (a table) into the message's, as strings, and
// its trace context. A nested table or array becomes its JSON.
func fromAMQPHeaders(t amqp.Table) (headers map[string]string, parent, state string) {
	for k, v := range t {
		var s string
		switch v := v.(type) {
		case nil:
			continue
		case string:
			s = v
		case []byte:
			s = string(v)
		case time.Time:
			s = v.UTC().Format(time.RFC3339)
		case amqp.Table, []any:
			b, err := json.Marshal(v)
			if err != nil {
				continue
			}
			s = string(b)
		default:
			s = fmt.Sprint(v)
		}
		switch {
		case strings.EqualFold(k, amqpTraceparent):
			parent = s
		case strings.EqualFold(k, amqpTracestate):
			state = s
		default:
			if headers == nil {
				headers = map[string]string{}
			}
			headers[k] = s
		}
	}
	return headers, parent, state
}
