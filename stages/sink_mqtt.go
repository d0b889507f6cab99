package stages

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The mqtt sink's attributes (url, qos, client_id and id_property are the source's mqttField*).
const (
	mqttSinkFieldTopic   = "topic"
	mqttSinkFieldRetain  = "retain"
	mqttSinkFieldTimeout = "timeout"
)

// mqttSinkTopics is how many topics of a batch the sink publishes to at once (each topic's
// messages one after the other, in order).
const mqttSinkTopics = 64

// The mqtt sink publishes each message (MQTT 5) on the topic its expression gives, with its
// headers and trace context as user properties, and the runtime acknowledges the message's entry
// only once the broker has confirmed it (QoS 1: its PUBACK). MQTT brokers do not drop
// duplicates, so an entry delivered again (after a crash, a PUBACK lost in a cut) is published
// again: at least once. Each publication carries the entry's identity in the user property
// id_property, the same on every delivery, by which a consumer (an mqtt source of flowrun with
// effectively-once delivery) writes it once. A broker that is away pauses the sink; a PUBACK that
// refuses the message (reason code 0x80 or more) dead-letters it with the broker's reason.
func init() {
	RegisterSink(SinkKind{
		Spec: &flow.Kind{
			Name: "mqtt",
			Doc: "Publishes each message to an MQTT broker (MQTT 5) on the topic its expression gives, with the message's " +
				"headers and trace context as user properties, and the entry's ID in the message_id user property. At QoS 1 the " +
				"entry is acknowledged only once the broker has confirmed it (PUBACK); the broker away pauses the sink; a message " +
				"the broker refuses is dead-lettered with the reason. See docs/connectors.md.",
			Attributes: []flow.Attribute{
				{Name: mqttFieldURL, Type: flow.TypeString, Required: true, Doc: mqttURLDoc},
				{Name: mqttSinkFieldTopic, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg", "key"},
					Doc: "The topic to publish each message on, such as \"alerts/${msg.site}\" (no wildcards); key is the " +
						"message's key: \"${key}\" publishes an mqtt source's messages on their own topics."},
				{Name: mqttFieldQoS, Type: flow.TypeInteger, Default: int64(1), Min: flow.Bound(0), Max: flow.Bound(1),
					Doc: "The publications' quality of service: 1 (the entry is acknowledged once the broker's PUBACK says it " +
						"has the message) or 0 (acknowledged once written to the connection: a message the broker did not get is lost)."},
				{Name: mqttSinkFieldRetain, Type: flow.TypeBool, Default: false,
					Doc: "Publishes the messages retained: the broker keeps each topic's last one for subscribers to come."},
				{Name: mqttFieldClientID, Type: flow.TypeString,
					Doc: "The MQTT client identifier; default: one the broker assigns. The sink keeps no session (clean start)."},
				{Name: mqttFieldIDProperty, Type: flow.TypeString, Default: mqttDefaultIDProperty,
					Doc: "The user property that carries the entry's identity (<pipeline>/<sink>/<partition>/<entry ID>), the same " +
						"every time the entry is delivered, by which a consumer drops what the sink published again; \"\" for none."},
				{Name: mqttSinkFieldTimeout, Type: flow.TypeDuration, Default: 10 * time.Second,
					Doc: "How long the broker may take to confirm a publication (its PUBACK)."},
			},
			Example: `sink "alerts" {
  kind  = "mqtt"
  input = stage.alerts
  url   = "tcp://127.0.0.1:1883"
  topic = "alerts/${msg.site}"
}`,
			Check: func(c *flow.KindCheck) {
				checkMQTTURL(c)
				checkMQTTClientID(c)
				if c.Config.Duration(mqttSinkFieldTimeout) <= 0 {
					c.Errorf(mqttSinkFieldTimeout, "Invalid timeout", "Give a duration above 0, such as \"10s\".")
				}
			},
		},
		Traits: SinkTraits{Inline: true}, // a batch at a time, in order: DeliverBatch publishes it at once
		New: func(s *flow.Sink, env Env) (Sink, error) {
			c := s.Config
			return &mqttSink{
				conn: newMQTTConn(c.String(mqttFieldURL), env), topic: c.Expr(mqttSinkFieldTopic),
				qos: byte(c.Int(mqttFieldQoS)), retain: c.Bool(mqttSinkFieldRetain), clientID: c.String(mqttFieldClientID),
				idProperty: c.String(mqttFieldIDProperty), timeout: c.Duration(mqttSinkFieldTimeout),
				idPrefix: env.Pipeline + "/" + s.Name + "/",
			}, nil
		},
	})
}

// mqttSink is an mqtt sink. It connects with its first delivery, so that a broker that is away at
// the start pauses it like any outage.
type mqttSink struct {
	conn       mqttConn
	topic      *expr.Program
	qos        byte
	retain     bool
	clientID   string
	idProperty string
	timeout    time.Duration
	idPrefix   string // of the id property's value

	mu     sync.Mutex
	client *paho.Client
}

func (s *mqttSink) Timeout() time.Duration { return s.timeout }

// Deliver is DeliverBatch's for one message (the runtime calls DeliverBatch only).
func (s *mqttSink) Deliver(ctx context.Context, m *Message, out []Write) ([]Write, error) {
	parent, state := TraceFrom(ctx)
	d := []Delivery{{Message: m, Traceparent: parent, Tracestate: state}}
	s.DeliverBatch(ctx, d)
	return out, d[0].Err
}

// DeliverBatch publishes the batch: each topic's messages one after the other, in order, each
// once the one before was confirmed, and several topics at once.
func (s *mqttSink) DeliverBatch(ctx context.Context, batch []Delivery) {
	client, err := s.connect(ctx)
	if err != nil {
		for i := range batch {
			batch[i].Err = err
		}
		return
	}
	// A connection lost fails what waits for a PUBACK at once (paho would wait for the timeout,
	// the messages being in its session).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-client.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	pubs := make([]*paho.Publish, len(batch))
	var topics []string
	byTopic := map[string][]int{}
	for i := range batch {
		pubs[i], batch[i].Err = s.publication(batch[i])
		if batch[i].Err != nil {
			continue
		}
		t := pubs[i].Topic
		if _, ok := byTopic[t]; !ok {
			topics = append(topics, t)
		}
		byTopic[t] = append(byTopic[t], i)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, mqttSinkTopics)
	for _, t := range topics {
		sem <- struct{}{}
		wg.Add(1)
		go func(list []int) {
			defer func() { <-sem; wg.Done() }()
			for k, i := range list {
				batch[i].Err = s.publish(ctx, client, pubs[i])
				if batch[i].Err != nil && !IsPermanent(batch[i].Err) {
					// Later messages of the topic wait for this one: they would overtake it.
					for _, j := range list[k+1:] {
						batch[j].Err = batch[i].Err
					}
					return
				}
			}
		}(byTopic[t])
	}
	wg.Wait()
}

// publication makes the PUBLISH of a delivery: its topic, its payload, its headers, trace context
// and identity as user properties.
func (s *mqttSink) publication(d Delivery) (*paho.Publish, error) {
	m := d.Message
	if err := m.Decode(); err != nil {
		return nil, err
	}
	topic, err := s.topic.EvalString(&expr.Env{Msg: m.Value, Vars: map[string]any{"key": m.Key}})
	if err != nil {
		return nil, evalError(err)
	}
	if why := mqttTopicError(topic); why != "" {
		return nil, Permanent(fmt.Errorf("mqtt: %q is not a topic a message can be published on: %s", topic, why))
	}
	payload, err := m.Payload()
	if err != nil {
		return nil, err
	}
	var user paho.UserProperties
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		if k != s.idProperty || s.idProperty == "" {
			user = append(user, paho.UserProperty{Key: k, Value: m.Headers[k]})
		}
	}
	if s.idProperty != "" {
		user = append(user, paho.UserProperty{Key: s.idProperty, Value: s.idPrefix + strconv.Itoa(d.Partition) + "/" + d.ID})
	}
	if d.Traceparent != "" {
		user = append(user, paho.UserProperty{Key: mqttTraceparent, Value: d.Traceparent})
		if d.Tracestate != "" {
			user = append(user, paho.UserProperty{Key: mqttTracestate, Value: d.Tracestate})
		}
	}
	return &paho.Publish{QoS: s.qos, Retain: s.retain, Topic: topic, Payload: payload, Properties: &paho.PublishProperties{User: user}}, nil
}

// publish publishes one message and waits for its PUBACK: a refusal (reason code 0x80 or more)
// is permanent; anything else that fails, transient.
func (s *mqttSink) publish(ctx context.Context, client *paho.Client, p *paho.Publish) error {
	resp, err := client.Publish(ctx, p)
	switch {
	case resp != nil && resp.ReasonCode >= 0x80:
		given := ""
		if resp.Properties != nil {
			given = resp.Properties.ReasonString
		}
		return Permanent(fmt.Errorf("mqtt: the broker refused the message on %s: %s (reason code 0x%02X)", p.Topic, mqttReason(resp.ReasonCode, given), resp.ReasonCode))
	case errors.Is(err, paho.ErrInvalidArguments):
		return Permanent(fmt.Errorf("mqtt: publishing on %s: %w", p.Topic, err))
	case err != nil:
		select {
		case <-client.Done():
			err = errors.New("the connection was lost before the broker's PUBACK")
		default:
		}
		s.drop(client)
		return Transient(errors.New(s.conn.redact(fmt.Sprintf("mqtt: publishing on %s to %s: %v", p.Topic, s.conn.shown, err))))
	}
	return nil
}

// connect returns the sink's client, connecting first when it has none or its connection ended.
func (s *mqttSink) connect(ctx context.Context) (*paho.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		select {
		case <-s.client.Done():
			s.client = nil
		default:
			return s.client, nil
		}
	}
	conn, err := s.conn.dial(ctx)
	if err != nil {
		return nil, Transient(err)
	}
	client := paho.NewClient(paho.ClientConfig{Conn: conn, PacketTimeout: s.timeout,
		OnClientError: func(error) {}, OnServerDisconnect: func(*paho.Disconnect) {}})
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ack, err := client.Connect(cctx, s.conn.connectPacket(s.clientID, true, nil))
	if err != nil {
		_ = conn.Close()
		reason := err.Error()
		if ack != nil {
			given := ""
			if ack.Properties != nil {
				given = ack.Properties.ReasonString
			}
			reason = fmt.Sprintf("%s (reason code 0x%02X)", mqttReason(ack.ReasonCode, given), ack.ReasonCode)
		}
		// A refused connection (bad password, not authorized) is the sink's, not a message's:
		// it pauses the sink, which says why, until the broker takes it.
		return nil, Transient(errors.New(s.conn.redact(fmt.Sprintf("mqtt: connecting to %s: %s", s.conn.shown, reason))))
	}
	s.client = client
	return client, nil
}

// drop forgets a client whose publication failed, so that the next delivery connects again.
func (s *mqttSink) drop(client *paho.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == client {
		_ = client.Disconnect(&paho.Disconnect{ReasonCode: 0})
		s.client = nil
	}
}

// Close disconnects, once the runtime is done with the sink.
func (s *mqttSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		_ = s.client.Disconnect(&paho.Disconnect{ReasonCode: 0})
		s.client = nil
	}
	return nil
}
