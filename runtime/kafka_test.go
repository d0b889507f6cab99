package runtime_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/admin"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The kafka source's and sink's proofs run against franz-go's kfake (github.com/twmb/franz-go/pkg/
// kfake), a Kafka broker in Go: there is no Kafka on the machines flowrun is tested on. kfake needs
// a newer Go than the main module declares, so it runs as a process of its own (tools/kfake, a
// module of its own), on a loopback port that stays the same across its restarts, keeping its
// state (topics, offsets, groups, producers) in a directory of the test's: stopping it is the
// outage, starting it again on the same directory is the broker restarted.

var kfakeBuild struct {
	once sync.Once
	path string
	err  error
}

// kfakeBinary builds tools/kfake once.
func kfakeBinary(t *testing.T) string {
	t.Helper()
	kfakeBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "flowrun-kfake")
		if err == nil {
			kfakeBuild.path = filepath.Join(dir, "kfake")
			var out []byte
			if out, err = exec.Command("go", "build", "-C", "../tools/kfake", "-o", kfakeBuild.path, ".").CombinedOutput(); err != nil {
				err = fmt.Errorf("go build -C tools/kfake: %v\n%s", err, out)
			}
		}
		kfakeBuild.err = err
	})
	if kfakeBuild.err != nil {
		t.Fatal(kfakeBuild.err)
	}
	return kfakeBuild.path
}

// kfakeBroker is a kfake process of a test's.
type kfakeBroker struct {
	t    *testing.T
	addr string
	args []string
	cmd  *exec.Cmd
	log  *syncBuffer
}

// startKfake starts kfake on a free loopback port with its state in a directory of the test's,
// with topics ("name:partitions") and broker configurations ("key=value").
func startKfake(t *testing.T, topics []string, configs ...string) *kfakeBroker {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	b := &kfakeBroker{t: t, addr: fmt.Sprintf("127.0.0.1:%d", port),
		args: []string{"-port", fmt.Sprint(port), "-data", t.TempDir()}}
	for _, tp := range topics {
		b.args = append(b.args, "-topic", tp)
	}
	for _, c := range configs {
		b.args = append(b.args, "-config", c)
	}
	b.start()
	t.Cleanup(func() { b.stop() })
	return b
}

// start starts the process and waits until it takes connections.
func (b *kfakeBroker) start() {
	b.t.Helper()
	b.log = &syncBuffer{}
	b.cmd = exec.Command(kfakeBinary(b.t), b.args...)
	b.cmd.Stderr = b.log
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		b.t.Fatal(err)
	}
	if err := b.cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "kfake listening on ") {
		b.t.Fatalf("kfake %s: %q, %v\n%s", strings.Join(b.args, " "), line, err, b.log.String())
	}
}

// stop stops the process cleanly (SIGTERM: it closes its files) and waits for it.
func (b *kfakeBroker) stop() {
	if b.cmd == nil || b.cmd.ProcessState != nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-done
	}
}

// restart stops kfake and starts it again on the same port and directory.
func (b *kfakeBroker) restart() {
	b.t.Helper()
	b.stop()
	b.start()
}

// kafkaClient is a client of the test's, for producing and reading.
func kafkaClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// kafkaTraceparent is the trace context that record i carries in.
func kafkaTraceparent(i int) string { return natsTraceparent(i) }

// kafkaProduce produces records [from, to) of the source tests to topic: i's key k<i%10>, payload
// {"i": i}, a header origin: test, and on every 10th a traceparent.
func kafkaProduce(t *testing.T, cl *kgo.Client, topic string, from, to int) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for i := from; i < to; i++ {
		r := &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%10), Value: fmt.Appendf(nil, `{"i":%d}`, i),
			Headers: []kgo.RecordHeader{{Key: "origin", Value: []byte("test")}}}
		if i%10 == 0 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "traceparent", Value: []byte(kafkaTraceparent(i))})
		}
		wg.Add(1)
		cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				failed = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed != nil {
		t.Fatalf("producing to %s: %v", topic, failed)
	}
}

// kafkaRead reads every record of topic there is now, in each partition's order.
func kafkaRead(t *testing.T, addr, topic string) []*kgo.Record {
	t.Helper()
	adm := kadm.NewClient(kafkaClient(t, addr))
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	if total == 0 {
		return nil
	}
	cl := kafkaClient(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for int64(len(recs)) < total {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(recs), total, topic)
		}
		recs = append(recs, f.Records()...)
	}
	return recs
}

// kafkaCommitted is how far the group has committed on topic, over its partitions.
func kafkaCommitted(t *testing.T, addr, group, topic string) int64 {
	t.Helper()
	adm := kadm.NewClient(kafkaClient(t, addr))
	offs, err := adm.FetchOffsets(context.Background(), group)
	if err != nil {
		return -1
	}
	var n int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			n += o.At
		}
	})
	return n
}

// kafkaSourcePipeline reads topic into the pipeline's topic "in" (4 partitions, keyed by the record
// key).
func kafkaSourcePipeline(prefix, delivery, addr, topic string) string {
	return fmt.Sprintf(`
pipeline "kafkasource" {
  key_prefix = %q
  delivery   = %q
}
topic "in" {
  partitions = 4
}
source "kin" {
  kind    = "kafka"
  brokers = [%q]
  topics  = [%q]
  group   = "flowrun"
  output  = topic.in
}
`, prefix, delivery, addr, topic)
}

// kafkaTopic reads topic "in": how many times each record i is there, and checks each entry's
// key (the record key), its headers, for every 10th its trace context, and each key's order.
func kafkaTopic(t *testing.T, c *redis.Client, prefix string) map[int]int {
	t.Helper()
	seen := map[int]int{}
	for _, s := range (redis.Keys{Prefix: prefix}).Streams("in", 4) {
		last := map[string]int{}
		for after := "0"; ; {
			recs, err := c.Read(context.Background(), s, after, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				break
			}
			for _, r := range recs {
				after = r.ID
				var m struct{ I int }
				if err := json.Unmarshal(r.Payload, &m); err != nil {
					t.Fatalf("entry %s: %v", r.ID, err)
				}
				if want := fmt.Sprintf("k%d", m.I%10); r.Key != want {
					t.Fatalf("record %d has key %q, want its record key %q", m.I, r.Key, want)
				}
				if r.Headers["origin"] != "test" {
					t.Fatalf("record %d has headers %v, want the record header origin: test", m.I, r.Headers)
				}
				if m.I%10 == 0 && r.TraceParent != kafkaTraceparent(m.I) {
					t.Fatalf("record %d has traceparent %q, want %q", m.I, r.TraceParent, kafkaTraceparent(m.I))
				}
				if prev, ok := last[r.Key]; ok && m.I < prev {
					t.Fatalf("key %s: record %d after %d", r.Key, m.I, prev)
				}
				last[r.Key] = m.I
				seen[m.I]++
			}
		}
	}
	return seen
}

// kafkaEntries counts the entries of topic "in" (kafkaTopic checks them).
func kafkaEntries(t *testing.T, c *redis.Client, prefix string) int {
	t.Helper()
	total := 0
	for _, k := range kafkaTopic(t, c, prefix) {
		total += k
	}
	return total
}

// TestKafkaSourceWritesEachRecordOnce: 3000 records produced on ten keys to a topic of 3
// partitions, half before the run and half during it, are each in the pipeline's topic once,
// keyed by their record keys and in each key's order, with their headers and trace context; and
// once Redis has them, the group has committed every offset.
func TestKafkaSourceWritesEachRecordOnce(t *testing.T) {
	const n = 3000
	k := startKfake(t, []string{"orders:3"})
	cl := kafkaClient(t, k.addr)
	kafkaProduce(t, cl, "orders", 0, n/2)
	c := server.open(t)
	plan := buildSource(t, kafkaSourcePipeline("ignored", "at_least_once", k.addr, "orders"))
	run := runInBackground(t, plan, runtime.Options{Redis: c})
	kafkaProduce(t, cl, "orders", n/2, n)
	entries := func() int { return kafkaEntries(t, c, plan.KeyPrefix) }
	waitFor(t, "every record in the topic", func() bool { return entries() >= n })
	waitFor(t, "the group to have committed every offset", func() bool { return kafkaCommitted(t, k.addr, "flowrun", "orders") == n })
	// The lag it reports, once it has read everything: 0, in the snapshot and in inspect.
	waitFor(t, "inspect to show an upstream lag of 0", func() bool {
		report, err := admin.Inspect(context.Background(), c, plan, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return len(report.Sources) == 1 && report.Sources[0].Upstream != nil && report.Sources[0].Upstream.Lag == 0
	})
	if src := run.rt.Snapshot().Sources; len(src) != 1 || src[0].UpstreamLag != 0 {
		t.Errorf("the snapshot's sources: %+v, want an upstream lag of 0", src)
	}
	if err := run.stop(); err != nil {
		t.Fatalf("%v\n%s", err, run.log.String())
	}
	checkEachOnce(t, kafkaTopic(t, c, plan.KeyPrefix), n)
	t.Logf("%d records, each once in the topic in their keys' order; the group committed offsets summing to %d; upstream lag 0 in inspect", n, kafkaCommitted(t, k.addr, "flowrun", "orders"))
}

// TestKafkaSourceWaitsOutAnOutage: once a first part is in the topic, kfake is stopped, and started
// again (on its state) with the rest produced to it: nothing arrives while it is away, and then
// every record is in the topic once (effectively-once: what was read and not committed before the
// stop is delivered again).
func TestKafkaSourceWaitsOutAnOutage(t *testing.T) {
	t.Parallel()
	const first, n = 1000, 3000
	k := startKfake(t, []string{"orders:3"})
	kafkaProduce(t, kafkaClient(t, k.addr), "orders", 0, first)
	c := server.open(t)
	plan := buildSource(t, kafkaSourcePipeline("ignored", "effectively_once", k.addr, "orders"))
	run := runInBackground(t, plan, runtime.Options{Redis: c})
	entries := func() int { return kafkaEntries(t, c, plan.KeyPrefix) }
	waitFor(t, "the first part in the topic", func() bool { return entries() == first })
	k.stop()
	time.Sleep(time.Second) // the source polls a broker that is away
	if got := entries(); got != first {
		t.Fatalf("%d entries while Kafka was away, want %d", got, first)
	}
	k.start()
	kafkaProduce(t, kafkaClient(t, k.addr), "orders", first, n)
	waitFor(t, "every record in the topic", func() bool { return entries() >= n })
	waitFor(t, "the group to have committed every offset", func() bool { return kafkaCommitted(t, k.addr, "flowrun", "orders") == n })
	if err := run.stop(); err != nil {
		t.Fatalf("%v\n%s", err, run.log.String())
	}
	checkEachOnce(t, kafkaTopic(t, c, plan.KeyPrefix), n)
	t.Logf("%d records before kfake stopped, each of %d once at the end", first, n)
}

// lagEmitter is an Emitter that takes every message at once and keeps the lags reported: the
// kafka source run on its own, without a runtime.
type lagEmitter struct {
	mu      sync.Mutex
	emitted int
	lags    []int64
}

func (e *lagEmitter) Emit(context.Context, stages.Message, stages.Origin) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.emitted++
	return nil
}

func (e *lagEmitter) EmitAll(context.Context, []stages.Message, []stages.Origin) ([]string, error) {
	return nil, nil
}

func (e *lagEmitter) Reject(context.Context, error, stages.Message, stages.Origin) error { return nil }

func (e *lagEmitter) Resume(context.Context) (string, bool, error) { return "", false, nil }

func (e *lagEmitter) Record(context.Context, string) error { return nil }

func (e *lagEmitter) ReportLag(n int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lags = append(e.lags, n)
}

// TestKafkaSourceReportsLag runs the kafka source on its own over 3000 records, 100 a poll: the lag
// it reports after its first poll is what the partitions still hold for it (above zero), and once
// it has read everything, zero.
func TestKafkaSourceReportsLag(t *testing.T) {
	const n = 3000
	k := startKfake(t, []string{"orders:3"})
	kafkaProduce(t, kafkaClient(t, k.addr), "orders", 0, n)
	plan := buildSource(t, strings.Replace(kafkaSourcePipeline("ignored", "at_least_once", k.addr, "orders"),
		`group   = "flowrun"`, `group   = "flowrun"
  max_poll_records = 100`, 1))
	kind, _ := stages.SourceKindOf(plan.Sources[0])
	src, err := kind.New(plan.Sources[0], stages.Env{Pipeline: "kafkasource"})
	if err != nil {
		t.Fatal(err)
	}
	e := &lagEmitter{}
	ctx, stop := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- src.Produce(ctx, e) }()
	read := func() (int, []int64) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.emitted, append([]int64(nil), e.lags...)
	}
	waitFor(t, "every record read, and a lag of 0 reported", func() bool {
		got, lags := read()
		return got == n && len(lags) > 0 && lags[len(lags)-1] == 0
	})
	stop()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the source ended with %v, want the context's end", err)
	}
	_, lags := read()
	if lags[0] <= 0 || lags[0] >= n {
		t.Errorf("the lag after the first poll is %d, want between 0 and %d", lags[0], n)
	}
	t.Logf("lags reported over %d polls: first %d, last %d", len(lags), lags[0], lags[len(lags)-1])
}

// kafkaKillCycles is how many processes the kill tests kill, and how many records they send.
func kafkaKillCycles() (kills, n int) {
	if *soakFlag {
		return 8, 100000
	}
	return 3, 12000
}

// TestKafkaSourceThroughKills produces records to a topic while flowrun processes read it into the
// pipeline's topic with effectively-once delivery, and SIGKILLs each after random progress; a last
// process runs until everything is there and committed: each record once, keyed by its record key,
// each key in order.
func TestKafkaSourceThroughKills(t *testing.T) {
	t.Parallel()
	kills, n := kafkaKillCycles()
	k := startKfake(t, []string{"orders:4"})
	cl := kafkaClient(t, k.addr)
	srv := redistest.Shared(t)
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("kafkakill-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "kafka.hcl")
	writeFile(t, path, kafkaSourcePipeline(prefix, "effectively_once", k.addr, "orders"))
	entries := func() int64 {
		var total int64
		for _, s := range (redis.Keys{Prefix: prefix}).Streams("in", 4) {
			l, err := c.Universal().XLen(context.Background(), s).Result()
			if err != nil {
				t.Fatal(err)
			}
			total += l
		}
		return total
	}
	// The producer goes on through the kills, a slice at a time.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for from := 0; from < n; from += 500 {
			kafkaProduce(t, cl, "orders", from, min(from+500, n))
			time.Sleep(20 * time.Millisecond)
		}
	}()
	bin := flowrunBinary(t)
	// Leases of a second: on a shared machine a stalled process must not lose its partitions over
	// and over (until its entries count as poison), which is not what the kills test.
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "1s"}
	var logs []string
	for cycle := 0; cycle < kills; cycle++ {
		before := entries()
		p := startBinary(t, bin, args...)
		progress := int64(300 + rand.IntN(2000))
		waitFor(t, fmt.Sprintf("cycle %d: %d entries more", cycle, progress), func() bool {
			return entries()-before >= progress || entries() >= int64(n)
		})
		p.kill(t)
		logs = append(logs, p.log.String())
	}
	<-done
	last := startBinary(t, bin, args...)
	waitFor(t, "every record in the topic", func() bool { return entries() >= int64(n) })
	// What the group delivers again after the last kill must find its entries there and be
	// dropped: wait for the group to have committed everything.
	waitFor(t, "the group to have committed every offset", func() bool { return kafkaCommitted(t, k.addr, "flowrun", "orders") == int64(n) })
	last.kill(t)
	logs = append(logs, last.log.String())
	checkEachOnce(t, kafkaTopic(t, c, prefix), n)
	if t.Failed() {
		for i, l := range logs {
			t.Logf("process %d:\n%s", i, l)
		}
	}
	t.Logf("%d records produced while %d processes were SIGKILLed: each once in the topic, each key in order; %d leases lost", n, kills, leaseLosses(logs...))
}
