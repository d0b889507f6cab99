package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The kafka kinds (issue 25), beside Benthos v4.27's kafka_franz input and output, against kfake,
// franz-go's Kafka broker in Go (there is no Kafka on the machine), run as a process of its own
// (bin/kfake, built from tools/kfake by make bench-tools) on a free loopback port, started anew for
// each scenario. kfake is itself a Go program on the same 2 cores, so these rates say how the
// kinds compare with Benthos's on one broker, not what a Kafka cluster would take.
//
//   - KAFKA-IN: a topic of 4 partitions filled beforehand with warm + flat records, read by
//     flowrun's kafka source (consumer group, offsets committed once Redis has the records) into a
//     topic of 4 partitions, and by Benthos's kafka_franz input into a redis_streams output
//     (records/s, timed from the warm-up's last record in Redis to the flat part's).
//   - KAFKA-OUT: streams filled beforehand, produced by flowrun's kafka sink (idempotent, acks=all)
//     and by Benthos's kafka_franz output to a topic of 4 partitions (records/s, from the warm-up's
//     last record in Kafka to the flat part's).

// The kinds of these scenarios (scenario.kind).
const (
	kindKafkaIn kind = iota + 400
	kindKafkaOut
)

var kfakeBin = flag.String("kfake", "bin/kfake", "franz-go's kfake broker for the KAFKA scenarios (make bench-tools builds it); without it they are skipped")

const benthosKafkaIn = benthosStreamNS + ":{kafkain}"

var kafkaScenarios = []scenario{
	{name: "KAFKA-IN records", kind: kindKafkaIn, impl: implFlowrun, vs: "Benthos KAFKA-IN records", pipeline: "kafka-in"},
	{name: "Benthos KAFKA-IN records", kind: kindKafkaIn, impl: implBenthos},
	{name: "KAFKA-OUT records", kind: kindKafkaOut, impl: implFlowrun, vs: "Benthos KAFKA-OUT records", pipeline: "kafka-out"},
	{name: "Benthos KAFKA-OUT records", kind: kindKafkaOut, impl: implBenthos},
}

func init() {
	scenarios = append(scenarios, kafkaScenarios...)
	benchPipelines = append(benchPipelines,
		benchPipeline{name: "kafka-in", src: kafkaInHCL},
		benchPipeline{name: "kafka-out", src: kafkaOutHCL},
	)
}

const kafkaInHCL = `# Written by flowbench: a Kafka topic into a topic of 4 partitions.
pipeline "bench" {
  key_prefix = "fb"
}
variable "broker" { default = "127.0.0.1:9092" } # the harness sets kfake's
topic "in" { partitions = 4 }
source "kin" {
  kind    = "kafka"
  brokers = [var.broker]
  topics  = ["bench_in"]
  group   = "flowbench"
  output  = topic.in
}
`

const kafkaOutHCL = `# Written by flowbench: a topic of 4 partitions into a Kafka topic.
pipeline "bench" {
  key_prefix = "fb"
}
variable "broker" { default = "127.0.0.1:9092" } # the harness sets kfake's
topic "in" {
  partitions = 4
  key        = msg.key
}
sink "kout" {
  kind    = "kafka"
  input   = topic.in
  brokers = [var.broker]
  topic   = "bench_out"
}
`

// kafkaUnavailable says why a KAFKA scenario cannot run, or "".
func kafkaUnavailable(sc scenario) string {
	if sc.kind != kindKafkaIn && sc.kind != kindKafkaOut {
		return ""
	}
	if _, err := exec.LookPath(*kfakeBin); err != nil {
		return "skipped: " + *kfakeBin + " not built (make bench-tools)"
	}
	return ""
}

// startKfake starts kfake with the scenario's topics on a free port, and waits until it takes
// connections.
func (h *harness) startKfake(sc scenario) (*child, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c, err := startChild(sc.name+" kfake", h.logPath(sc)+".kfake", nil, *kfakeBin, "-port", strconv.Itoa(port),
		"-topic", "bench_in:4", "-topic", "bench_out:4")
	if err != nil {
		return nil, "", err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			_ = conn.Close()
			return c, addr, nil
		}
		if c.exited() || time.Now().After(deadline) {
			_ = c.stop(5 * time.Second)
			return nil, "", fmt.Errorf("kfake did not listen on %s: %s", addr, c.logTail())
		}
	}
}

// kafkaFill produces n of the harness's payloads to topic, keyed by their sequence number modulo
// 64, and waits until kfake has them all.
func kafkaFill(ctx context.Context, addr, topic string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for i := range n {
		p := make([]byte, payloadSize)
		putPayload(p, time.Now().UnixNano(), phaseConn, i+1)
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%64)), Value: p}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// kafkaCount is how many records topic holds.
func kafkaCount(ctx context.Context, adm *kadm.Client, topic string) (int, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
	return n, nil
}

// runKafka runs a KAFKA scenario: kfake, the topic or streams filled, the system started, and the
// flat part timed.
func (h *harness) runKafka(ctx context.Context, sc scenario) (res result) {
	kf, addr, err := h.startKfake(sc)
	if err != nil {
		return result{failed: err.Error()}
	}
	defer func() { _ = kf.stop(30 * time.Second) }()
	warm, flat := h.cfg.warm, h.cfg.flat/4
	logPath := h.logPath(sc)
	var count func() (int, error)
	var c *child
	if sc.kind == kindKafkaIn {
		if err := kafkaFill(ctx, addr, "bench_in", warm+flat); err != nil {
			return result{failed: "filling the topic: " + err.Error()}
		}
		streams := strings.Split(partitionStreams("in", 4), partSep)
		if sc.impl == implBenthos {
			streams = []string{benthosKafkaIn}
			c, err = h.startBenthosConfig(sc, logPath, benthosKafkaInConfig(h.srv.addr(), addr, logPath), false)
		} else {
			c, err = startChild(sc.name, logPath, h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(), "--var", "broker="+addr)
		}
		count = func() (int, error) {
			n := 0
			for _, s := range streams {
				l, err := h.rdb.XLen(ctx, s).Result()
				if err != nil {
					return 0, err
				}
				n += int(l)
			}
			return n, nil
		}
	} else {
		stream := partitionStreams("in", 4)
		if sc.impl == implBenthos {
			stream = benthosKafkaIn
		}
		if err := publishParallel(ctx, h.rdb, stream, formatPlain, phaseConn, warm+flat, 4); err != nil {
			return result{failed: err.Error()}
		}
		adm, aerr := kgo.NewClient(kgo.SeedBrokers(addr))
		if aerr != nil {
			return result{failed: aerr.Error()}
		}
		defer adm.Close()
		count = func() (int, error) { return kafkaCount(ctx, kadm.NewClient(adm), "bench_out") }
		if sc.impl == implBenthos {
			c, err = h.startBenthosConfig(sc, logPath, benthosKafkaOutConfig(h.srv.addr(), addr, logPath), false)
		} else {
			c, err = startChild(sc.name, logPath, h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(), "--var", "broker="+addr)
		}
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	until := func(want int, deadline time.Duration) error { return untilCount(c, count, "records", want, deadline) }
	if err := until(warm, time.Minute); err != nil {
		return result{failed: "warm-up: " + err.Error()}
	}
	cpu0 := h.cpus(c)
	t0 := time.Now()
	if err := until(warm+flat, 5*time.Minute); err != nil {
		return result{failed: err.Error()}
	}
	res = h.measured(c, flat, t0, time.Now(), cpu0)
	if n, err := count(); err != nil || n != warm+flat {
		return result{failed: fmt.Sprintf("%d records (%v), want %d", n, err, warm+flat)}
	}
	res.note("records/s, on kfake (franz-go's broker in Go, one process on the same cores)")
	return res
}

// benthosKafkaInConfig is Benthos's kafka_franz input, every setting at its default but the
// consumer group and reading from the oldest offset, into a redis_streams output.
func benthosKafkaInConfig(redisAddr, broker, logPath string) string {
	var b strings.Builder
	port, _ := freePort()
	fmt.Fprintf(&b, "http:\n  address: 127.0.0.1:%d\n", port)
	fmt.Fprintf(&b, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	fmt.Fprintf(&b, "input:\n  kafka_franz:\n    seed_brokers: [ %q ]\n    topics: [ bench_in ]\n    consumer_group: benthos\n    start_from_oldest: true\n", broker)
	fmt.Fprintf(&b, "output:\n  redis_streams:\n    url: redis://%s\n    stream: %q\n    body_key: payload\n", redisAddr, benthosKafkaIn)
	return b.String()
}

// benthosKafkaOutConfig is a redis_streams input into Benthos's kafka_franz output, every setting
// at its default (which, like flowrun's sink, is idempotent with acks=all), keyed as flowrun's.
func benthosKafkaOutConfig(redisAddr, broker, logPath string) string {
	var b strings.Builder
	port, _ := freePort()
	fmt.Fprintf(&b, "http:\n  address: 127.0.0.1:%d\n", port)
	fmt.Fprintf(&b, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	fmt.Fprintf(&b, "input:\n  redis_streams:\n    url: redis://%s\n    streams: [ %q ]\n    consumer_group: bb1\n    body_key: payload\n", redisAddr, benthosKafkaIn)
	fmt.Fprintf(&b, "output:\n  kafka_franz:\n    seed_brokers: [ %q ]\n    topic: bench_out\n    key: '${! json(\"key\") }'\n", broker)
	return b.String()
}
