// This file holds the mqtt source kind: it subscribes to MQTT topic filters on a persistent
// session (MQTT 5, github.com/eclipse/paho.golang) and sends each QoS 1 message's PUBACK only once
// Redis has its entry. The mqtt sink is sink_mqtt.go; what both share (the url, connecting, user
// properties and trace context) is at the end of this file.

package stages

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/flowrun/flowrun/flow"
)

// The mqtt source's attributes (url, client_id and id_property are the sink's too).
const (
	mqttFieldURL               = "url"
	mqttFieldQoS               = "qos"
	mqttFieldClientID          = "client_id"
	mqttFieldIDProperty        = "id_property"
	mqttSourceFieldTopics      = "topics"
	mqttSourceFieldExpiry      = "session_expiry"
	mqttSourceFieldReceiveMax  = "receive_maximum"
	mqttDefaultIDProperty      = "message_id"
	mqttSourceDefaultExpiry    = 24 * time.Hour
	mqttSourceDefaultInflights = 2000
)

// mqttAckEvery is how often the source reads, from Redis, how far its messages are written, and
// marks those acknowledged; paho sends their PUBACKs, in the order the messages came, every
// mqttSendAcksEvery.
const (
	mqttAckEvery      = 25 * time.Millisecond
	mqttSendAcksEvery = 10 * time.Millisecond
)

// The mqtt source emits each message of its topic filters keyed by its MQTT topic, with its user
// properties as headers, and acknowledges a QoS 1 message (its PUBACK) only after Redis has it:
// each message's Origin.Position is a counter of the run's, which the runtime records in Redis with
// the message's entry, and a goroutine of the source reads it back (Emitter.Resume) and
// acknowledges every message up to it, in the order they came, as MQTT requires. The session is
// persistent (client_id, clean start off, session_expiry), so what was not acknowledged when the
// process died or the connection broke, the broker delivers again on the next connection.
//
// MQTT has no stable message identity (packet IDs are reused), so a message's Origin.ID is the
// user property id_property (message_id) where the publisher sets one, with its topic: a message
// delivered again is then written once with effectively-once delivery. Without it, the ID is the
// run's and the message's counter, which no redelivery repeats: at least once.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "mqtt",
			Doc: "Subscribes to MQTT topic filters (MQTT 5) on a persistent session: each message (a JSON object) is passed " +
				"on keyed by its MQTT topic, with its user properties as headers and its traceparent continuing the trace, and " +
				"a QoS 1 message is acknowledged (PUBACK) only once Redis has it, so a crash or an outage loses nothing. A message " +
				"delivered again is written once with delivery = \"effectively_once\" when its publisher gives it an ID (the " +
				"message_id user property); otherwise at least once. See docs/connectors.md.",
			Attributes: []flow.Attribute{
				{Name: mqttFieldURL, Type: flow.TypeString, Required: true, Doc: mqttURLDoc},
				{Name: mqttSourceFieldTopics, Type: flow.TypeStringList, Required: true,
					Doc: "The topic filters to subscribe to, wildcards + and # allowed, such as [\"sensors/+/temperature\"]; " +
						"a shared subscription ($share/group/filter) splits the messages between the processes that share it."},
				{Name: mqttFieldQoS, Type: flow.TypeInteger, Default: int64(1), Min: flow.Bound(0), Max: flow.Bound(1),
					Doc: "The subscriptions' quality of service: 1 (at least once: the broker keeps a message until flowrun " +
						"acknowledges it, once Redis has it) or 0 (at most once: a message in flight when the process dies or the " +
						"connection breaks is lost, as are those published meanwhile)."},
				{Name: mqttFieldClientID, Type: flow.TypeString, Required: true,
					Doc: "The MQTT client identifier, which names the persistent session the broker keeps (the subscriptions and " +
						"the messages not yet acknowledged) across restarts; unique to this source on the broker."},
				{Name: mqttSourceFieldExpiry, Type: flow.TypeDuration, Default: mqttSourceDefaultExpiry,
					Doc: "How long the broker keeps the session, with the messages it queues, while no process of the source is " +
						"connected (the session expiry interval): longer than the pipeline may be stopped. A longer stop loses what was queued."},
				{Name: mqttFieldIDProperty, Type: flow.TypeString, Default: mqttDefaultIDProperty,
					Doc: "The user property that carries a publisher's ID of the message, the same on every publication of it: with " +
						"its topic, the message's ID for effectively-once delivery. Messages without it are delivered at least once."},
				{Name: mqttSourceFieldReceiveMax, Type: flow.TypeInteger, Default: int64(mqttSourceDefaultInflights), Min: flow.Bound(1), Max: flow.Bound(65535),
					Doc: "The most QoS 1 messages the broker sends before their acknowledgement (MQTT's receive maximum): those in flight to Redis."},
			},
			Example: `source "readings" {
  kind      = "mqtt"
  url       = "tcp://127.0.0.1:1883"
  topics    = ["sensors/+/temperature"]
  client_id = "flowrun-readings"
  output    = topic.readings
}`,
			Detail: func(c flow.Attrs) string {
				return "mqtt: " + strings.Join(c.Strings(mqttSourceFieldTopics), " ")
			},
			Check: func(c *flow.KindCheck) {
				checkMQTTURL(c)
				for _, f := range c.Config.Strings(mqttSourceFieldTopics) {
					if err := mqttFilterError(f); err != "" {
						c.Errorf(mqttSourceFieldTopics, "Invalid topics", "%q is not an MQTT topic filter: %s.", f, err)
					}
				}
				if c.Config.Has(mqttSourceFieldTopics) && len(c.Config.Strings(mqttSourceFieldTopics)) == 0 {
					c.Errorf(mqttSourceFieldTopics, "Invalid topics", "Give at least one topic filter, such as [\"sensors/#\"].")
				}
				checkMQTTClientID(c)
				if d := c.Config.Duration(mqttSourceFieldExpiry); d < time.Second || d > time.Duration(0xFFFFFFFE)*time.Second {
					c.Errorf(mqttSourceFieldExpiry, "Invalid session_expiry", "Give a duration from 1s to about 136 years, such as \"24h\".")
				}
				if c.Config.String(mqttFieldIDProperty) == "" {
					c.Errorf(mqttFieldIDProperty, "Invalid id_property", "Give a user property's name, such as \"message_id\".")
				}
			},
		},
		// Resumes: the runtime records each batch's last position, which is how the source learns
		// what Redis has; where to start again is the broker's, in the session.
		Traits: SourceTraits{Resumes: true, Finite: func(flow.Attrs) (bool, int64) { return false, -1 }},
		New: func(s *flow.Source, env Env) (Source, error) {
			c := s.Config
			src := &mqttSource{
				conn: newMQTTConn(c.String(mqttFieldURL), env), topics: c.Strings(mqttSourceFieldTopics),
				qos: byte(c.Int(mqttFieldQoS)), clientID: c.String(mqttFieldClientID),
				expiry:     uint32(c.Duration(mqttSourceFieldExpiry) / time.Second),
				idProperty: c.String(mqttFieldIDProperty), receiveMax: uint16(c.Int(mqttSourceFieldReceiveMax)),
				log: env.Logger, clock: env.Clock,
			}
			if src.log == nil {
				src.log = slog.New(slog.DiscardHandler)
			}
			if src.clock == nil {
				src.clock = SystemClock{}
			}
			src.log = src.log.With("source", s.Name, "client_id", src.clientID)
			return src, nil
		},
	})
}

// mqttSource is an mqtt source.
type mqttSource struct {
	conn       mqttConn
	topics     []string
	qos        byte
	clientID   string
	expiry     uint32 // seconds
	idProperty string
	receiveMax uint16
	run        string // names this run's positions (and the IDs of messages without one)
	log        *slog.Logger
	clock      Clock
	connected  bool // a session was set up before, in this process

	mu      sync.Mutex
	pending []mqttInFlight // QoS 1 messages emitted, not yet acknowledged, in the order they came
	emitted uint64         // the counter of the last message emitted
}

// mqttInFlight is a QoS 1 message emitted and not yet acknowledged, with the client (the
// connection) it came on: only that one can acknowledge it.
type mqttInFlight struct {
	n      uint64
	client *paho.Client
	msg    *paho.Publish
}

// mqttPosition is the position the source gives each message: the run and the message's counter
// in it. Redis's copy says that every message up to it is written.
type mqttPosition struct {
	Run string `json:"run"`
	N   uint64 `json:"n"`
}

// The waits between attempts to connect.
const (
	mqttRetryFirst   = 500 * time.Millisecond
	mqttRetryLongest = 30 * time.Second
)

func (s *mqttSource) Produce(ctx context.Context, out Emitter) error {
	// A run of its own each time the runtime runs the source (again after a lost lease): a
	// position recorded by an earlier run acknowledges nothing of this one.
	s.mu.Lock()
	s.run, s.pending, s.connected = NewRunID(), nil, false
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.acknowledge(ctx, out) }()
	defer wg.Wait()
	defer cancel()
	wait := mqttRetryFirst
	for {
		progressed, err := s.session(ctx, out)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var emitErr mqttEmitError
		var refused mqttRefusal
		switch {
		case errors.As(err, &emitErr):
			return emitErr.err
		case errors.As(err, &refused):
			return errors.New(s.conn.redact(refused.Error()))
		}
		if progressed {
			wait = mqttRetryFirst
		}
		s.log.Warn("mqtt: the connection to the broker failed; trying again", "err", s.conn.redact(err.Error()), "in", wait)
		t := s.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
		wait = min(2*wait, mqttRetryLongest)
	}
}

// mqttEmitError is an error of the Emitter, which ends the source (the run stops, or its lease
// was lost).
type mqttEmitError struct{ err error }

func (e mqttEmitError) Error() string { return e.err.Error() }

// mqttRefusal is a refusal by the broker that waiting does not mend (bad user name or password,
// not authorized, a topic filter refused): it ends the run.
type mqttRefusal struct{ msg string }

func (e mqttRefusal) Error() string { return e.msg }

// mqttFinalConnack are CONNACK reason codes that say the configuration is wrong: the run ends.
// The others (server unavailable or busy, quota, connection rate) are waited out.
var mqttFinalConnack = map[byte]bool{
	0x84: true, // unsupported protocol version: not MQTT 5
	0x85: true, // client identifier not valid
	0x86: true, // bad user name or password
	0x87: true, // not authorized
	0x8C: true, // bad authentication method
}

// session connects with the persistent session, subscribes, and passes the messages on until the
// connection ends.
func (s *mqttSource) session(ctx context.Context, out Emitter) (progressed bool, err error) {
	conn, err := s.conn.dial(ctx)
	if err != nil {
		return false, err
	}
	// The handler hands messages over (handOver). The broker sends no more QoS 1 messages than
	// receive_maximum before their PUBACKs.
	msgs := make(chan *paho.Publish, int(s.receiveMax)+64)
	var lastErr error
	var errMu sync.Mutex
	setErr := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if lastErr == nil {
			lastErr = err
		}
	}
	client := paho.NewClient(paho.ClientConfig{
		Conn: conn, EnableManualAcknowledgment: true, SendAcksInterval: mqttSendAcksEvery,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			handOver(msgs, conn.lost, r.Packet)
			return true, nil
		}},
		OnClientError: setErr,
		OnServerDisconnect: func(d *paho.Disconnect) {
			given := ""
			if d.Properties != nil {
				given = d.Properties.ReasonString
			}
			setErr(fmt.Errorf("the broker disconnected: %s (reason code 0x%02X)", mqttReason(d.ReasonCode, given), d.ReasonCode))
		},
	})
	expiry, receiveMax := s.expiry, s.receiveMax
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ack, err := client.Connect(cctx, s.conn.connectPacket(s.clientID, false, &paho.ConnectProperties{
		SessionExpiryInterval: &expiry, ReceiveMaximum: &receiveMax,
	}))
	cancel()
	if err != nil {
		_ = conn.Close()
		if ack != nil && mqttFinalConnack[ack.ReasonCode] {
			given := ""
			if ack.Properties != nil {
				given = ack.Properties.ReasonString
			}
			return false, mqttRefusal{fmt.Sprintf("mqtt: %s refused the connection of client %s: %s (reason code 0x%02X)",
				s.conn.shown, s.clientID, mqttReason(ack.ReasonCode, given), ack.ReasonCode)}
		}
		return false, err
	}
	defer func() {
		if ctx.Err() != nil {
			s.ackBeforeLeaving(out)
		}
		_ = client.Disconnect(&paho.Disconnect{ReasonCode: 0}) // the session stays, for its expiry
		<-client.Done()
		s.forget(client)
	}()
	if s.connected && !ack.SessionPresent {
		s.log.Warn("mqtt: the broker kept no session for the client (it expired, or the broker lost it): what was published meanwhile is lost")
	}
	s.connected = true
	// Subscribing while the messages come: with a session present, the broker sends again what
	// was not acknowledged as soon as it has connected, before the SUBACK, which waits behind them.
	subscribed := make(chan error, 1)
	go func() { subscribed <- s.subscribe(ctx, client) }()
	for {
		select {
		case <-ctx.Done():
			return progressed, ctx.Err()
		case err := <-subscribed:
			if err != nil {
				return progressed, err
			}
			subscribed = nil
		case <-client.Done():
			errMu.Lock()
			err := lastErr
			errMu.Unlock()
			if err == nil {
				err = errors.New("the connection to the broker ended")
			}
			return progressed, fmt.Errorf("mqtt: %w", err)
		case msg := <-msgs:
			if err := s.pass(ctx, client, msg, out); err != nil {
				return progressed, mqttEmitError{err}
			}
			progressed = true
		}
	}
}

// handOver passes a message from paho's handler to the session's loop, and none once the
// connection is lost. After a loss the broker delivers again, in order, every message that was not
// acknowledged, so what the loop passes on must be what came up to some message, without a gap:
// a message dropped while a later one went on would come back after it, out of order. paho may
// still call the handler after a loss (for packets it had read), so the check comes first; waiting
// gives up on a loss too, as the loop may have left (paho waits for the handler before it shuts
// down).
func handOver(msgs chan<- *paho.Publish, lost <-chan struct{}, p *paho.Publish) {
	select {
	case <-lost:
		return
	default:
	}
	select {
	case msgs <- p:
	case <-lost:
	}
}

// subscribe subscribes to the topic filters (again, with a session present: the configuration
// may have changed).
func (s *mqttSource) subscribe(ctx context.Context, client *paho.Client) error {
	sub := &paho.Subscribe{}
	for _, f := range s.topics {
		// Retain handling 1: a retained message comes with a new subscription, not again with
		// every reconnection's.
		sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: s.qos, RetainHandling: 1})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sa, err := client.Subscribe(ctx, sub)
	if sa != nil {
		for i, code := range sa.Reasons {
			switch {
			case i >= len(s.topics):
			case code >= 0x80:
				return mqttRefusal{fmt.Sprintf("mqtt: %s refused the subscription to %s: %s (reason code 0x%02X)",
					s.conn.shown, s.topics[i], mqttReason(code, ""), code)}
			case code < s.qos:
				s.log.Warn("mqtt: the broker granted a lower QoS than asked: messages may be lost", "topic_filter", s.topics[i], "qos", code)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("mqtt: subscribing: %w", err)
	}
	return nil
}

// forget drops the messages in flight on a connection that ended: the broker delivers them again
// on the next one.
func (s *mqttSource) forget(client *paho.Client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.pending[:0]
	for _, p := range s.pending {
		if p.client != client {
			kept = append(kept, p)
		}
	}
	clear(s.pending[len(kept):])
	s.pending = kept
}

// pass emits one message, keyed by its topic, with its user properties and trace context, and
// notes a QoS 1 one for acknowledgement once Redis has it.
func (s *mqttSource) pass(ctx context.Context, client *paho.Client, msg *paho.Publish, out Emitter) error {
	headers, parent, state := fromMQTTProperties(msg.Properties)
	s.mu.Lock()
	s.emitted++
	n := s.emitted
	if msg.QoS > 0 {
		s.pending = append(s.pending, mqttInFlight{n: n, client: client, msg: msg})
	}
	s.mu.Unlock()
	pos, _ := json.Marshal(mqttPosition{Run: s.run, N: n}) // strings and numbers only
	at := Origin{Position: string(pos)}
	if id, ok := headers[s.idProperty]; ok && id != "" {
		at.ID = msg.Topic + " " + id
	} else {
		at.ID = s.run + "-" + strconv.FormatUint(n, 10)
	}
	m := NewMessage(msg.Topic, msg.Payload, headers)
	if parent != "" {
		ctx = ContextWithTrace(ctx, parent, state)
	}
	if err := CheckPayload(msg.Payload); err != nil {
		// Dead-lettered, with its position: acknowledged like a message written.
		return out.Reject(ctx, Permanent(fmt.Errorf("the message on %s is not a JSON object: %w", msg.Topic, err)), m, at)
	}
	return out.Emit(ctx, m, at)
}

// acknowledge marks acknowledged, every mqttAckEvery, the messages whose entries Redis has.
func (s *mqttSource) acknowledge(ctx context.Context, out Emitter) {
	tick := s.clock.NewTicker(mqttAckEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		s.ackWritten(ctx, out)
	}
}

// ackWritten marks acknowledged the messages up to the position the runtime recorded with the
// last batch written; their client sends the PUBACKs, in the order the messages came, within
// mqttSendAcksEvery.
func (s *mqttSource) ackWritten(ctx context.Context, out Emitter) {
	raw, found, err := out.Resume(ctx)
	if err != nil || !found {
		return
	}
	var pos mqttPosition
	if json.Unmarshal([]byte(raw), &pos) != nil || pos.Run != s.run {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := 0
	for ; i < len(s.pending) && s.pending[i].n <= pos.N; i++ {
		// An acknowledgement that fails (the connection gone) leaves the message to be
		// delivered again.
		_ = s.pending[i].client.Ack(s.pending[i].msg)
	}
	clear(s.pending[:i])
	s.pending = s.pending[i:]
}

// ackBeforeLeaving acknowledges, when the run stops, what Redis has, and gives the client the
// time to send the PUBACKs marked (now or by the last ackWritten) before it disconnects: else the
// broker delivers those messages again to the next run.
func (s *mqttSource) ackBeforeLeaving(out Emitter) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.ackWritten(ctx, out)
	t := s.clock.NewTimer(3 * mqttSendAcksEvery) // paho sends marked acknowledgements every mqttSendAcksEvery
	defer t.Stop()
	select {
	case <-t.C():
	case <-ctx.Done():
	}
}

// mqttURLDoc is the url attribute's documentation, the source's and the sink's.
const mqttURLDoc = "The MQTT broker: tcp://host:1883 (or mqtt://), ssl://host:8883 (or tls://, mqtts://) for TLS; a user " +
	"and password in the URL (tcp://user:password@host:1883) are the connection's, and never appear in output."

// mqttConn is how an mqtt source or sink connects: the broker's address, the user, and what hides
// the password.
type mqttConn struct {
	addr     string // host:port
	tls      *tls.Config
	user     *url.Userinfo
	shown    string // the URL without its password
	redact   func(string) string
	keepLive uint16
}

func newMQTTConn(raw string, env Env) mqttConn {
	c := mqttConn{shown: raw, redact: env.Redact, keepLive: 30}
	if c.redact == nil {
		c.redact = func(s string) string { return s }
	}
	u, err := url.Parse(raw)
	if err != nil {
		return c // validate refused it
	}
	c.user = u.User
	port := u.Port()
	switch u.Scheme {
	case "ssl", "tls", "mqtts":
		c.tls = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
		if port == "" {
			port = "8883"
		}
	default:
		if port == "" {
			port = "1883"
		}
	}
	c.addr = net.JoinHostPort(u.Hostname(), port)
	if p, ok := u.User.Password(); ok && p != "" {
		c.shown = strings.ReplaceAll(raw, p, "(password)")
		redact := c.redact
		c.redact = func(s string) string { return redact(strings.ReplaceAll(s, p, "(password)")) }
	}
	return c
}

// dial opens the network connection to the broker.
func (c mqttConn) dial(ctx context.Context) (*mqttNetConn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	var conn net.Conn
	var err error
	if c.tls != nil {
		td := tls.Dialer{NetDialer: &d, Config: c.tls}
		conn, err = td.DialContext(ctx, "tcp", c.addr)
	} else {
		conn, err = d.DialContext(ctx, "tcp", c.addr)
	}
	if err != nil {
		return nil, errors.New(c.redact("mqtt: " + err.Error()))
	}
	return &mqttNetConn{Conn: conn, lost: make(chan struct{})}, nil
}

// connectPacket is the CONNECT of a client: its identifier, its session, the URL's user.
func (c mqttConn) connectPacket(clientID string, cleanStart bool, props *paho.ConnectProperties) *paho.Connect {
	cp := &paho.Connect{ClientID: clientID, CleanStart: cleanStart, KeepAlive: c.keepLive, Properties: props}
	if c.user != nil {
		cp.Username, cp.UsernameFlag = c.user.Username(), true
		if p, ok := c.user.Password(); ok {
			cp.Password, cp.PasswordFlag = []byte(p), true
		}
	}
	return cp
}

// mqttNetConn is a connection to the broker that says when it is lost: closed, or a read failed.
// It is a sync.Locker, which paho takes to write a packet whole: it writes from several
// goroutines, a packet in several writes.
type mqttNetConn struct {
	net.Conn
	sync.Mutex
	once sync.Once
	lost chan struct{}
}

func (c *mqttNetConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(func() { close(c.lost) })
	}
	return n, err
}

func (c *mqttNetConn) Close() error {
	c.once.Do(func() { close(c.lost) })
	return c.Conn.Close()
}

// checkMQTTURL checks the url attribute, and declares its password a secret.
func checkMQTTURL(c *flow.KindCheck) {
	if !c.Config.Has(mqttFieldURL) {
		return
	}
	raw := c.Config.String(mqttFieldURL)
	u, err := url.Parse(raw)
	if err == nil {
		if p, ok := u.User.Password(); ok && p != "" {
			c.Secret(p)
		}
	}
	switch {
	case err != nil || u.Hostname() == "":
		c.Errorf(mqttFieldURL, "Invalid url", "%q is not an MQTT broker's URL: write tcp://host:1883.", raw)
	case !map[string]bool{"tcp": true, "mqtt": true, "ssl": true, "tls": true, "mqtts": true}[u.Scheme]:
		c.Errorf(mqttFieldURL, "Invalid url", "%q: the scheme must be tcp:// or mqtt:// (ssl://, tls:// or mqtts:// for TLS); websockets are not supported.", raw)
	case u.Path != "" && u.Path != "/":
		c.Errorf(mqttFieldURL, "Invalid url", "%q: an MQTT broker's URL has no path: write tcp://host:1883.", raw)
	}
}

// checkMQTTClientID checks the client_id attribute: MQTT 5 brokers must accept 1 to 23 letters
// and digits; most take more, so only what no broker takes is refused.
func checkMQTTClientID(c *flow.KindCheck) {
	if !c.Config.Has(mqttFieldClientID) {
		return
	}
	id := c.Config.String(mqttFieldClientID)
	if id == "" || len(id) > 65535 || strings.ContainsRune(id, 0) {
		c.Errorf(mqttFieldClientID, "Invalid client_id", "Give a client identifier of 1 to 65535 bytes, such as \"flowrun-orders\".")
	}
}

// mqttFilterError says what is wrong with a topic filter, "" when nothing is.
func mqttFilterError(f string) string {
	if strings.HasPrefix(f, "$share/") {
		parts := strings.SplitN(f, "/", 3)
		if len(parts) < 3 || parts[1] == "" || strings.ContainsAny(parts[1], "+#") {
			return "a shared subscription is $share/<group>/<filter>"
		}
		f = parts[2]
	}
	switch {
	case f == "":
		return "it is empty"
	case len(f) > 65535:
		return "it is longer than 65535 bytes"
	case strings.ContainsRune(f, 0):
		return "it holds a NUL character"
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		switch {
		case strings.Contains(l, "#") && (l != "#" || i != len(levels)-1):
			return "# must be a whole level, the last"
		case strings.Contains(l, "+") && l != "+":
			return "+ must be a whole level"
		}
	}
	return ""
}

// mqttTopicError says what is wrong with a topic to publish on, "" when nothing is.
func mqttTopicError(t string) string {
	switch {
	case t == "":
		return "it is empty"
	case len(t) > 65535:
		return "it is longer than 65535 bytes"
	case strings.ContainsAny(t, "+#\x00"):
		return "wildcards + and # (and NUL) cannot be published on"
	}
	return ""
}

// mqttReason is a reason code's meaning: the broker's reason string when it gave one, else MQTT
// 5's name for the code.
func mqttReason(code byte, given string) string {
	if given != "" {
		return given
	}
	if r, ok := mqttReasons[code]; ok {
		return r
	}
	return "unspecified reason"
}

// mqttReasons are MQTT 5's names of the failure reason codes of CONNACK, SUBACK, PUBACK and
// DISCONNECT.
var mqttReasons = map[byte]string{
	0x04: "disconnect with will message",
	0x80: "unspecified error", 0x81: "malformed packet", 0x82: "protocol error", 0x83: "implementation specific error",
	0x84: "unsupported protocol version", 0x85: "client identifier not valid", 0x86: "bad user name or password",
	0x87: "not authorized", 0x88: "server unavailable", 0x89: "server busy", 0x8A: "banned", 0x8B: "server shutting down",
	0x8C: "bad authentication method", 0x8D: "keep alive timeout", 0x8E: "session taken over", 0x8F: "topic filter invalid",
	0x90: "topic name invalid", 0x93: "receive maximum exceeded", 0x94: "topic alias invalid", 0x95: "packet too large",
	0x96: "message rate too high", 0x97: "quota exceeded", 0x98: "administrative action", 0x99: "payload format invalid",
	0x9A: "retain not supported", 0x9B: "QoS not supported", 0x9C: "use another server", 0x9D: "server moved",
	0x9E: "shared subscriptions not supported", 0x9F: "connection rate exceeded", 0xA0: "maximum connect time",
	0xA1: "subscription identifiers not supported", 0xA2: "wildcard subscriptions not supported",
}

// The W3C trace context's names, which travel as MQTT 5 user properties.
const (
	mqttTraceparent = "traceparent"
	mqttTracestate  = "tracestate"
)

// fromMQTTProperties splits a message's user properties into the message's headers (the first
// value of each name), and its trace context.
func fromMQTTProperties(p *paho.PublishProperties) (headers map[string]string, parent, state string) {
	if p == nil {
		return nil, "", ""
	}
	for _, u := range p.User {
		switch {
		case strings.EqualFold(u.Key, mqttTraceparent):
			if parent == "" {
				parent = u.Value
			}
		case strings.EqualFold(u.Key, mqttTracestate):
			if state == "" {
				state = u.Value
			}
		default:
			if headers == nil {
				headers = map[string]string{}
			}
			if _, ok := headers[u.Key]; !ok {
				headers[u.Key] = u.Value
			}
		}
	}
	return headers, parent, state
}
