package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The AMQP scenarios: the machine's RabbitMQ (FLOWBENCH_AMQP, default 127.0.0.1:5672, guest), in a
// queue of the harness's own per run (flowbench_<pid>_<n>, deleted after).
//
//   - AMQP in: a queue filled beforehand, read into Redis by flowrun's amqp source (acknowledged
//     once in Redis) and by Benthos's amqp_0_9 input into a redis_streams output (messages/s).
//   - AMQP out: a stream filled beforehand, published to the queue (through the default exchange)
//     by flowrun's amqp sink (publisher confirms) and by Benthos's amqp_0_9 output (messages/s).

// The kinds of these scenarios (scenario.kind).
const (
	kindAMQPIn kind = iota + 220
	kindAMQPOut
)

var amqpURL = "amqp://guest:guest@" + envOr("FLOWBENCH_AMQP", "127.0.0.1:5672") + "/"

var amqpScenarios = []scenario{
	{name: "AMQP-IN", kind: kindAMQPIn, impl: implFlowrun, vs: "Benthos AMQP-IN", pipeline: "amqp-in"},
	{name: "Benthos AMQP-IN", kind: kindAMQPIn, impl: implBenthos},
	{name: "AMQP-OUT", kind: kindAMQPOut, impl: implFlowrun, vs: "Benthos AMQP-OUT", pipeline: "amqp-out"},
	{name: "Benthos AMQP-OUT", kind: kindAMQPOut, impl: implBenthos},
}

func init() {
	scenarios = append(scenarios, amqpScenarios...)
	benchPipelines = append(benchPipelines,
		benchPipeline{name: "amqp-in", src: amqpInHCL},
		benchPipeline{name: "amqp-out", src: amqpOutHCL},
	)
}

const amqpInHCL = `# Written by flowbench: a RabbitMQ queue into a topic of 4 partitions.
pipeline "bench" {
  key_prefix = "fb"
}
variable "url" { default = "amqp://guest:guest@127.0.0.1:5672/" }
variable "queue" { default = "flowbench" } # the harness sets its queue
source "in" {
  kind   = "amqp"
  url    = var.url
  queue  = var.queue
  output = topic.in
}
topic "in" { partitions = 4 }
`

const amqpOutHCL = `# Written by flowbench: a topic of 4 partitions into a RabbitMQ queue.
pipeline "bench" {
  key_prefix = "fb"
}
variable "url" { default = "amqp://guest:guest@127.0.0.1:5672/" }
variable "queue" { default = "flowbench" } # the harness sets its queue
topic "in" {
  partitions = 4
  key        = msg.key
}
sink "out" {
  kind        = "amqp"
  input       = topic.in
  url         = var.url
  routing_key = var.queue
}
`

// amqpQueue declares a queue of the run's own, deleted when the run ends.
func (h *harness) amqpQueue() (*amqp.Connection, *amqp.Channel, string, func(), error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, nil, "", nil, fmt.Errorf("the machine's RabbitMQ at %s: %w", strings.Split(amqpURL, "@")[1], err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	name := fmt.Sprintf("flowbench_%d_%d", os.Getpid(), time.Now().UnixNano())
	if err == nil {
		_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, "", nil, err
	}
	return conn, ch, name, func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = conn.Close()
	}, nil
}

// amqpFill publishes n messages of the connectors' phase to the queue, with confirms.
func amqpFill(ch *amqp.Channel, queue string, n int) error {
	const window = 1000
	p := make([]byte, payloadSize)
	var pending []*amqp.DeferredConfirmation
	for i := range n {
		putPayload(p, time.Now().UnixNano(), phaseConn, i)
		d, err := ch.PublishWithDeferredConfirm("", queue, false, false, amqp.Publishing{Body: append([]byte(nil), p...), DeliveryMode: amqp.Persistent,
			MessageId: fmt.Sprint(i)})
		if err != nil {
			return err
		}
		if pending = append(pending, d); len(pending) == window || i == n-1 {
			for _, d := range pending {
				if !d.Wait() {
					return fmt.Errorf("RabbitMQ did not confirm a publication")
				}
			}
			pending = pending[:0]
		}
	}
	return nil
}

// runAMQP fills the queue (in) or the stream (out) with cfg.warm + cfg.flat/2 messages, starts the
// system, and times the flat part: from the warm-up's messages through until the last one is.
func (h *harness) runAMQP(ctx context.Context, sc scenario) (res result) {
	_, ch, queue, done, err := h.amqpQueue()
	if err != nil {
		return result{failed: err.Error()}
	}
	defer done()
	warm, flat := h.cfg.warm, h.cfg.flat/2
	in := sc.kind == kindAMQPIn
	stream := partitionStreams("in", 4)
	if sc.impl == implBenthos {
		stream = benthosStreamNS + ":{in}"
	}
	if in {
		err = amqpFill(ch, queue, warm+flat)
	} else {
		err = publishParallel(ctx, h.rdb, stream, formatPlain, phaseConn, warm+flat, 4)
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	var c *child
	if sc.impl == implBenthos {
		logPath := h.logPath(sc)
		c, err = h.startBenthosConfig(sc, logPath, benthosAMQPConfig(h.srv.addr(), queue, stream, in, logPath), false)
	} else {
		c, err = startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(),
			"--var", "url="+amqpURL, "--var", "queue="+queue)
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	through := func() (int, error) {
		if !in {
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			return q.Messages, err
		}
		var total int64
		for _, s := range strings.Split(stream, partSep) {
			n, err := h.rdb.XLen(ctx, s).Result()
			if err != nil {
				return 0, err
			}
			total += n
		}
		return int(total), nil
	}
	if err := untilCount(c, through, "messages", warm, time.Minute); err != nil {
		return result{failed: "warm-up: " + err.Error()}
	}
	cpu0 := h.cpus(c)
	t0 := time.Now()
	if err := untilCount(c, through, "messages", warm+flat, 5*time.Minute); err != nil {
		return result{failed: err.Error()}
	}
	res = h.measured(c, flat, t0, time.Now(), cpu0)
	if n, err := through(); err != nil || n != warm+flat {
		return result{failed: fmt.Sprintf("%d messages through (%v), want %d", n, err, warm+flat)}
	}
	return res
}

// benthosAMQPConfig is Benthos's amqp_0_9 input into a redis_streams output (in), or a
// redis_streams input into its amqp_0_9 output to the queue through the default exchange (out),
// every setting at its default.
func benthosAMQPConfig(redisAddr, queue, stream string, in bool, logPath string) string {
	var b strings.Builder
	port, _ := freePort()
	fmt.Fprintf(&b, "http:\n  address: 127.0.0.1:%d\n", port)
	fmt.Fprintf(&b, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	if in {
		fmt.Fprintf(&b, "input:\n  amqp_0_9:\n    urls: [ %q ]\n    queue: %q\n", amqpURL, queue)
		fmt.Fprintf(&b, "output:\n  redis_streams:\n    url: redis://%s\n    stream: %q\n    body_key: payload\n", redisAddr, stream)
		return b.String()
	}
	fmt.Fprintf(&b, "input:\n  redis_streams:\n    url: redis://%s\n    streams: [ %q ]\n    consumer_group: bb1\n    body_key: payload\n", redisAddr, stream)
	fmt.Fprintf(&b, "output:\n  amqp_0_9:\n    urls: [ %q ]\n    exchange: \"\"\n    key: %q\n", amqpURL, queue)
	return b.String()
}
