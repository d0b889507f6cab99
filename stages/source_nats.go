// This file holds the nats source kind: it reads a NATS JetStream stream through a durable pull
// consumer, and acknowledges each message to JetStream only once Redis has its entry. The nats sink
// is sink_nats.go; what both share (connecting, headers, secrets) is at the end of this file.

package stages

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flowrun/flow"
)

// The nats source's attributes.
const (
	natsFieldURL           = "url"
	natsSourceFieldStream  = "stream"
	natsSourceFieldSubject = "subject"
	natsSourceFieldDurable = "durable"
	natsSourceFieldAckWait = "ack_wait"
	natsSourceFieldPending = "max_ack_pending"
)

// natsAckEvery is how often the source reads, from Redis, how far its messages are written, and
// acknowledges those to JetStream: the least that ack_wait must exceed, with a batch's write.
const natsAckEvery = 100 * time.Millisecond

// natsLagEvery is how often the source asks JetStream for its consumer's pending counts, the
// upstream lag it reports: one request a second, whatever the rate of messages.
const natsLagEvery = time.Second

// The nats source emits each message of a JetStream stream (or of its subjects that match subject)
// keyed by its subject, and acknowledges it to JetStream only after Redis has it: each message's
// Origin.Position is a counter of the run's, which the runtime records in Redis with the message's
// entry, and a goroutine of the source reads it back (Emitter.Resume) and acknowledges every message
// up to it. What is not acknowledged, JetStream delivers again after ack_wait (a crash, an outage
// of Redis that outlasts it): each message's Origin.ID is its stream and stream sequence, the same
// on every delivery, which effectively-once delivery writes once.
func init() {
	RegisterSource(SourceKind{
		Spec: &flow.Kind{
			Name: "nats",
			Doc: "Reads a NATS JetStream stream through a durable pull consumer: each message (a JSON object) is " +
				"passed on keyed by its subject, with its NATS headers, and acknowledged to JetStream only once Redis " +
				"has it, so a crash or an outage loses nothing; a message delivered again is written once with " +
				"delivery = \"effectively_once\" (its ID is the stream sequence). See docs/connectors.md.",
			Attributes: []flow.Attribute{
				{Name: natsFieldURL, Type: flow.TypeString, Required: true,
					Doc: "The NATS server(s): nats://host:4222, several separated by commas; a user and password in the URL " +
						"never appear in output."},
				{Name: natsSourceFieldStream, Type: flow.TypeString, Required: true, Doc: "The JetStream stream to read; it must exist."},
				{Name: natsSourceFieldSubject, Type: flow.TypeString,
					Doc: "Reads only the stream's messages whose subject matches this one (wildcards * and > allowed): the consumer's filter subject; default: all of them."},
				{Name: natsSourceFieldDurable, Type: flow.TypeString, Required: true,
					Doc: "The durable consumer's name, created if absent (and updated to this configuration if present): it keeps " +
						"what was acknowledged across restarts. Delete it when the pipeline is retired (docs/connectors.md)."},
				{Name: natsSourceFieldAckWait, Type: flow.TypeDuration, Default: 30 * time.Second,
					Doc: "How long JetStream waits for a message's acknowledgement before delivering it again: longer than a batch " +
						"takes to reach Redis. The source asks for more time for messages Redis does not have yet (an outage, a full topic)."},
				{Name: natsSourceFieldPending, Type: flow.TypeInteger, Default: int64(4096), Min: flow.Bound(1),
					Doc: "The most messages delivered and not yet acknowledged (in flight to Redis)."},
			},
			Example: `source "orders" {
  kind    = "nats"
  url     = "nats://127.0.0.1:4222"
  stream  = "ORDERS"
  subject = "orders.>"
  durable = "flowrun_orders"
  output  = topic.orders
}`,
			Detail: func(c flow.Attrs) string {
				d := "nats: " + c.String(natsSourceFieldStream)
				if c.Has(natsSourceFieldSubject) {
					d += " " + c.String(natsSourceFieldSubject)
				}
				return d
			},
			Check: func(c *flow.KindCheck) {
				checkNATSURL(c)
				if c.Config.Duration(natsSourceFieldAckWait) < time.Second {
					c.Errorf(natsSourceFieldAckWait, "Invalid ack_wait", "Give a duration of 1s or more: longer than a batch takes to reach Redis.")
				}
				if c.Config.Has(natsSourceFieldDurable) && !natsName(c.Config.String(natsSourceFieldDurable)) {
					c.Errorf(natsSourceFieldDurable, "Invalid durable", "%q is not a consumer name JetStream takes: use letters, digits, - and _.",
						c.Config.String(natsSourceFieldDurable))
				}
			},
		},
		// Resumes: the runtime records each batch's last position, which is how the source learns
		// what Redis has; where to start again is JetStream's, in the durable consumer.
		Traits: SourceTraits{Resumes: true, Finite: func(flow.Attrs) (bool, int64) { return false, -1 }},
		New: func(s *flow.Source, env Env) (Source, error) {
			c := s.Config
			src := &natsSource{
				conn:   newNATSConn(c.String(natsFieldURL), "flowrun "+env.Pipeline+" "+s.Name, env),
				stream: c.String(natsSourceFieldStream), subject: c.String(natsSourceFieldSubject), durable: c.String(natsSourceFieldDurable),
				ackWait: c.Duration(natsSourceFieldAckWait), maxPending: int(c.Int(natsSourceFieldPending)), run: NewRunID(),
				log: env.Logger, clock: env.Clock,
			}
			if src.log == nil {
				src.log = slog.New(slog.DiscardHandler)
			}
			if src.clock == nil {
				src.clock = SystemClock{}
			}
			src.log = src.log.With("source", s.Name, "stream", src.stream, "durable", src.durable)
			return src, nil
		},
	})
}

// natsSource is a nats source.
type natsSource struct {
	conn       natsConn
	stream     string
	subject    string
	durable    string
	ackWait    time.Duration
	maxPending int
	run        string // names this run's positions: a position of another run acknowledges nothing
	log        *slog.Logger
	clock      Clock

	mu      sync.Mutex
	pending []natsInFlight     // emitted, not yet acknowledged, in the order emitted
	held    []natsHeld         // received and held back by a session's gate (natsGate)
	emitted uint64             // the counter of the last message emitted
	cons    jetstream.Consumer // the session's consumer, whose pending counts are the lag; nil before
	// infoMu serializes the consumer's Info calls (the session's gate and the lag's reports):
	// jetstream keeps the last info in the consumer without a lock of its own.
	infoMu sync.Mutex
}

// consumerInfo asks JetStream for the consumer's state.
func (s *natsSource) consumerInfo(ctx context.Context, cons jetstream.Consumer) (*jetstream.ConsumerInfo, error) {
	s.infoMu.Lock()
	defer s.infoMu.Unlock()
	return cons.Info(ctx)
}

// natsInFlight is a message emitted and not yet acknowledged to JetStream.
type natsInFlight struct {
	n     uint64 // its position's counter
	seq   uint64 // its stream sequence
	msg   jetstream.Msg
	since time.Time // when it was delivered, or when the source last asked JetStream for more time
}

// natsPosition is the position the source gives each message: the run and the message's counter
// in it. Redis's copy says that every message up to it is written.
type natsPosition struct {
	Run string `json:"run"`
	N   uint64 `json:"n"`
}

// The waits between attempts to set up the consumer or read from it.
const (
	natsRetryFirst   = 500 * time.Millisecond
	natsRetryLongest = 30 * time.Second
)

func (s *natsSource) Produce(ctx context.Context, out Emitter) error {
	nc, err := s.conn.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.every(ctx, natsAckEvery, func() { s.acknowledge(ctx, out) }) }()
	go func() { defer wg.Done(); s.every(ctx, natsLagEvery, func() { s.reportLag(ctx, out) }) }()
	defer wg.Wait()
	defer cancel()

	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	wait := natsRetryFirst
	for {
		progressed, err := s.session(ctx, nc, js, out)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var emitErr natsEmitError
		switch {
		case errors.As(err, &emitErr):
			return emitErr.err
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return fmt.Errorf("nats: no JetStream stream %q on %s", s.stream, s.conn.shown)
		}
		if progressed {
			wait = natsRetryFirst
		}
		s.log.Warn("nats: reading the stream failed; trying again", "err", s.conn.redact(err.Error()), "in", wait)
		t := s.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
		wait = min(2*wait, natsRetryLongest)
	}
}

// natsEmitError is an error of the Emitter, which ends the source (the run stops, or its lease
// was lost).
type natsEmitError struct{ err error }

func (e natsEmitError) Error() string { return e.err.Error() }

// session sets up the durable consumer and passes its messages on until an error, or until the
// connection is lost (NATS restarting, a network cut): then the next session, on the connection
// back, starts with a consumer whose state says what to wait for.
//
// Each subject's order is kept across a crash and an outage: JetStream delivers again what a
// consumer left unacknowledged only after ack_wait, by when it has delivered later messages. So
// a session that finds messages delivered before it and not acknowledged (a killed process's, or
// those lost in flight when the connection went) holds every message it receives until JetStream
// has delivered those again, then passes them all on in stream order (see natsGate).
func (s *natsSource) session(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, out Emitter) (progressed bool, err error) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cons, err := js.CreateOrUpdateConsumer(sctx, s.stream, jetstream.ConsumerConfig{
		Durable: s.durable, FilterSubject: s.subject, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: s.ackWait, MaxAckPending: s.maxPending, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	cancel()
	if err != nil {
		return false, err
	}
	status := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	if !nc.IsConnected() {
		return false, errors.New("nats: disconnected")
	}
	info := cons.CachedInfo()
	s.mu.Lock()
	s.cons = cons
	ours := len(s.pending) // after the info: acknowledgements only make it fewer
	s.mu.Unlock()
	out.ReportLag(natsLag(info)) // as it was when the session began, until the first tick
	var gate *natsGate
	if info.NumAckPending > ours {
		gate = &natsGate{until: s.clock.Now().Add(natsGateLongest * s.ackWait)}
		s.log.Info("nats: holding the messages back until JetStream delivers again those left unacknowledged, to keep each subject's order",
			"unacknowledged", info.NumAckPending-ours, "ack_wait", s.ackWait)
	}

	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	msgs, ended := make(chan jetstream.Msg), make(chan error, 1)
	go func() { ended <- s.pull(rctx, cons, msgs) }()
	tick := s.clock.NewTicker(natsLagEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return progressed, ctx.Err()
		case err := <-ended:
			return progressed, err
		case st := <-status:
			return progressed, fmt.Errorf("nats: the connection is %s", strings.ToLower(st.String()))
		case msg := <-msgs:
			if gate != nil {
				s.hold(msg)
				continue
			}
			if err := s.pass(ctx, msg, s.clock.Now(), out); err != nil {
				return progressed, natsEmitError{err}
			}
			progressed = true
		case <-tick.C():
			if gate == nil || !s.gateOpens(ctx, cons, gate) {
				continue
			}
			gate = nil
			if err := s.release(ctx, out); err != nil {
				return progressed, natsEmitError{err}
			}
			progressed = true
		}
	}
}

// The source's pull requests (natsSource.pull): how long each waits at most for messages, and how
// often JetStream says, while it has none, that it still holds the request.
const (
	natsFetchWait      = 30 * time.Second
	natsFetchHeartbeat = 5 * time.Second
)

// pull passes the consumer's messages on to msgs, in the order JetStream delivers them, until an
// error (which it returns) or until ctx ends: a pull request of a batch (what the writer can take
// at once; no more than may be in flight) at a time, each sent once the one before has ended.
//
// One request at a time, rather than the jetstream client's Messages iterator, which keeps one
// ahead: the iterator asks for more only when a message arrives, and not while its last request is
// still being sent; so when all of a batch arrives before that send is done (its goroutine
// descheduled on a busy machine), it waits without a request at the server, until it misses
// JetStream's heartbeats: messages neither delivered nor lost, for twice its heartbeat interval
// (30s by default). A request that ends without an error (its batch delivered, or it expired with
// none) is followed by the next; one that fails (heartbeats missed, the consumer gone) ends the
// session, whose successor accounts for any message delivered and not received.
func (s *natsSource) pull(ctx context.Context, cons jetstream.Consumer, msgs chan<- jetstream.Msg) error {
	batch := min(s.maxPending, 500)
	for {
		// The context's deadline is the request's expiry (less a little: the client waits a
		// moment longer than the server), and ending the context ends the request.
		fctx, cancel := context.WithTimeout(ctx, natsFetchWait+time.Second)
		b, err := cons.Fetch(batch, jetstream.FetchContext(fctx), jetstream.FetchHeartbeat(natsFetchHeartbeat))
		if err != nil {
			cancel()
			return err
		}
		for msg := range b.Messages() {
			select {
			case msgs <- msg:
			case <-ctx.Done():
				cancel()
				return ctx.Err()
			}
		}
		cancel()
		if err := b.Error(); err != nil {
			return fmt.Errorf("nats: a pull request failed: %w", err)
		}
	}
}

// natsGateLongest is how many times ack_wait a session holds its messages back at most, waiting
// for JetStream to deliver again what was left unacknowledged (natsGate).
const natsGateLongest = 3

// natsGate is a session's holding back of the messages it receives (natsSource.held), until
// JetStream has delivered again every message that was delivered before the session and not
// acknowledged: those of a process killed, or lost in flight in an outage. Every second it asks
// for the consumer's info, and opens once nothing delivered is unaccounted for (gateOpens).
type natsGate struct {
	until   time.Time // when it opens regardless, with a warning
	highest uint64    // the highest stream sequence the session has received
}

// natsHeld is a message held back by the gate.
type natsHeld struct {
	msg   jetstream.Msg
	seq   uint64    // its stream sequence
	since time.Time // when delivered, or last given more time (in progress)
}

// hold keeps a message back, in the gate, until it opens; the acknowledging goroutine asks
// JetStream for more time for it meanwhile, as for a message waiting for Redis.
func (s *natsSource) hold(msg jetstream.Msg) {
	var seq uint64
	if meta, err := msg.Metadata(); err == nil {
		seq = meta.Sequence.Stream
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = append(s.held, natsHeld{msg: msg, seq: seq, since: s.clock.Now()})
}

// gateOpens reports whether JetStream has delivered again everything that the gate waits for:
// nothing new is on its way (the consumer's last delivered stream sequence is one the session
// has), and every message delivered and not acknowledged is one the source has, emitted and
// waiting for Redis or held. Both counts are the info's, against the source's after it
// (acknowledgements since only make the source's fewer), so the gate never opens early.
func (s *natsSource) gateOpens(ctx context.Context, cons jetstream.Consumer, g *natsGate) bool {
	if s.clock.Now().After(g.until) {
		s.log.Warn("nats: messages left unacknowledged were not delivered again in time; passing on the messages held back, whose subjects' order may not hold",
			"waited", natsGateLongest*s.ackWait)
		return true
	}
	ictx, cancel := context.WithTimeout(ctx, natsLagEvery)
	info, err := s.consumerInfo(ictx, cons)
	cancel()
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	have := make(map[uint64]bool, len(s.pending)+len(s.held)) // a message redelivered is in both
	for _, p := range s.pending {
		have[p.seq] = true
	}
	for _, h := range s.held {
		have[h.seq] = true
		g.highest = max(g.highest, h.seq)
	}
	return info.Delivered.Stream <= g.highest && info.NumAckPending <= len(have)
}

// release passes on the messages the gate held, in stream order, each once.
func (s *natsSource) release(ctx context.Context, out Emitter) error {
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.mu.Unlock()
	slices.SortStableFunc(held, func(a, b natsHeld) int { return cmp.Compare(a.seq, b.seq) })
	s.log.Info("nats: passing on the messages held back, in stream order", "messages", len(held))
	for i, h := range held {
		if i > 0 && h.seq == held[i-1].seq {
			continue // delivered twice while held: JetStream takes one acknowledgement for both
		}
		if err := s.pass(ctx, h.msg, h.since, out); err != nil {
			return err
		}
	}
	return nil
}

// pass emits one message, keyed by its subject, with its headers and trace context, and notes it
// for acknowledgement once Redis has it.
func (s *natsSource) pass(ctx context.Context, msg jetstream.Msg, since time.Time, out Emitter) error {
	meta, err := msg.Metadata()
	if err != nil {
		return err // a message of a consumer is always a JetStream one
	}
	s.mu.Lock()
	s.emitted++
	n := s.emitted
	s.pending = append(s.pending, natsInFlight{n: n, seq: meta.Sequence.Stream, msg: msg, since: since})
	s.mu.Unlock()
	pos, _ := json.Marshal(natsPosition{Run: s.run, N: n}) // strings and numbers only
	at := Origin{ID: meta.Stream + ":" + strconv.FormatUint(meta.Sequence.Stream, 10), Position: string(pos)}
	headers, parent, state := fromNATSHeaders(msg.Headers())
	m := NewMessage(msg.Subject(), msg.Data(), headers)
	if parent != "" {
		ctx = ContextWithTrace(ctx, parent, state)
	}
	if err := CheckPayload(msg.Data()); err != nil {
		// Dead-lettered, with its position: acknowledged like a message written.
		return out.Reject(ctx, Permanent(fmt.Errorf("the message on %s (stream sequence %d) is not a JSON object: %w", msg.Subject(), meta.Sequence.Stream, err)), m, at)
	}
	return out.Emit(ctx, m, at)
}

// acknowledge acknowledges to JetStream (every natsAckEvery) the messages whose entries Redis has:
// those up to the position the runtime recorded with the last batch written. The messages still
// waiting for Redis, and those a session's gate holds, get more time (in progress) once half of
// ack_wait has passed, also while Redis does not answer, so that JetStream does not deliver them
// again while the source is held back.
func (s *natsSource) acknowledge(ctx context.Context, out Emitter) {
	raw, found, err := out.Resume(ctx)
	var pos natsPosition
	if err != nil || !found || json.Unmarshal([]byte(raw), &pos) != nil || pos.Run != s.run {
		pos = natsPosition{} // nothing of this run's written yet, or Redis away: none to acknowledge
	}
	now := s.clock.Now()
	s.mu.Lock()
	i := 0
	for ; i < len(s.pending) && s.pending[i].n <= pos.N; i++ {
		// An acknowledgement that fails (the connection away) leaves the message to be
		// delivered again, which effectively-once delivery writes once.
		_ = s.pending[i].msg.Ack()
	}
	s.pending = s.pending[i:]
	for j := range s.pending {
		s.extend(s.pending[j].msg, &s.pending[j].since, now)
	}
	for j := range s.held {
		s.extend(s.held[j].msg, &s.held[j].since, now)
	}
	s.mu.Unlock()
}

// extend asks JetStream for more time for a message not acknowledged yet, once half of ack_wait
// has passed since it was delivered or last extended.
func (s *natsSource) extend(msg jetstream.Msg, since *time.Time, now time.Time) {
	if now.Sub(*since) > s.ackWait/2 {
		_ = msg.InProgress()
		*since = now
	}
}

// reportLag reports (every natsLagEvery) the consumer's upstream lag (natsLag), as JetStream
// says it; nothing while JetStream does not answer (the last number stands).
func (s *natsSource) reportLag(ctx context.Context, out Emitter) {
	s.mu.Lock()
	cons := s.cons
	s.mu.Unlock()
	if cons == nil {
		return
	}
	ictx, cancel := context.WithTimeout(ctx, natsLagEvery)
	info, err := s.consumerInfo(ictx, cons)
	cancel()
	if err == nil {
		out.ReportLag(natsLag(info))
	}
}

// every calls f every d until ctx ends.
func (s *natsSource) every(ctx context.Context, d time.Duration, f func()) {
	tick := s.clock.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		f()
	}
}

// natsLag is a consumer's upstream lag: the stream's messages (of its filter subject) that it has
// not acknowledged, those not delivered yet (NumPending) and those delivered and not yet in Redis
// (NumAckPending, which the source acknowledges once Redis has them): what a crash at that moment
// would leave JetStream to deliver, like a Kafka group's lag from its committed offsets.
func natsLag(info *jetstream.ConsumerInfo) int64 {
	return int64(info.NumPending) + int64(info.NumAckPending)
}

// natsConn is how a nats source or sink connects: the URL, and what hides its password.
type natsConn struct {
	url    string
	name   string // the connection's name, which the server shows (nats server report connections)
	shown  string // the URL without its password
	redact func(string) string
	log    *slog.Logger // says when the connection is lost and when it is back
}

func newNATSConn(raw, name string, env Env) natsConn {
	c := natsConn{url: raw, name: name, shown: raw, redact: env.Redact, log: env.Logger}
	if c.redact == nil {
		c.redact = func(s string) string { return s }
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			c.shown = strings.ReplaceAll(raw, p, "(password)")
			redact := c.redact
			c.redact = func(s string) string { return redact(strings.ReplaceAll(s, p, "(password)")) }
		}
	}
	return c
}

// connect connects to the server, or keeps trying in the background when it is away (the first
// calls then fail as they would during any outage): a connection reconnects without end.
// Publications are not buffered while it reconnects, so that a sink learns at once that NATS is
// away, and pauses. The log says when the connection is lost, and when it is back.
func (c natsConn) connect() (*nats.Conn, error) {
	nc, err := nats.Connect(c.url, nats.Name(c.name), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(500*time.Millisecond), nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // closed by flowrun: not lost
			}
			why := "the server closed it"
			if err != nil {
				why = c.redact(err.Error())
			}
			c.log.Warn("nats: disconnected; reconnecting", "connection", c.name, "url", c.shown, "err", why)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.log.Info("nats: reconnected", "connection", c.name, "server", c.redact(nc.ConnectedUrlRedacted()))
		}))
	if err != nil {
		return nil, errors.New(c.redact("nats: " + err.Error()))
	}
	return nc, nil
}

// checkNATSURL checks the url attribute, and declares its password a secret.
func checkNATSURL(c *flow.KindCheck) {
	if !c.Config.Has(natsFieldURL) {
		return
	}
	for _, one := range strings.Split(c.Config.String(natsFieldURL), ",") {
		u, err := url.Parse(strings.TrimSpace(one))
		if err != nil || u.Host == "" {
			c.Errorf(natsFieldURL, "Invalid url", "%q is not a NATS URL: write nats://host:4222.", one)
			continue
		}
		if p, ok := u.User.Password(); ok {
			c.Secret(p)
		}
	}
}

// natsName is what a durable consumer's name may be.
func natsName(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// The W3C trace context's headers, which travel in NATS headers, and the prefix of the headers
// that are NATS's own (Nats-Msg-Id, Nats-Expected-Stream...), which do not become the message's.
const (
	natsTraceparent = "traceparent"
	natsTracestate  = "tracestate"
	natsOwnPrefix   = "Nats-"
)

// fromNATSHeaders splits a NATS message's headers into the message's (the first value of each),
// and its trace context.
func fromNATSHeaders(h nats.Header) (headers map[string]string, parent, state string) {
	for k, vs := range h {
		switch {
		case len(vs) == 0, strings.HasPrefix(k, natsOwnPrefix):
		case strings.EqualFold(k, natsTraceparent):
			parent = vs[0]
		case strings.EqualFold(k, natsTracestate):
			state = vs[0]
		default:
			if headers == nil {
				headers = map[string]string{}
			}
			headers[k] = vs[0]
		}
	}
	return headers, parent, state
}
