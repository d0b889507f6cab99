package runtime

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The runner's assembly of the plan's nodes that this process runs: a node per source, stage and
// sink, with the environment its kind is made with, and a unit per partition of a consuming node.
// Sources and sinks are made in source_produce.go, source_stream.go and sinks.go.

// addUnits adds a unit per partition of the node's input.
func (r *runner) addUnits(n *node) {
	for p := 0; p < n.input.Partitions; p++ {
		u := &unit{node: n, partition: p, stream: r.keys.Stream(n.input.Name, p), retryKey: r.keys.Retry(n.input.Name, p, n.name)}
		if n.ordering != flow.OrderNone {
			u.leaseKey = r.keys.Lease(n.input.Name, p, n.name)
		}
		r.units = append(r.units, u)
	}
}

func (r *runner) addStage(s *flow.Stage) error {
	kind, err := stages.StageKindOf(s)
	if err != nil {
		return &ConfigError{err.Error()}
	}
	traits := kind.TraitsFor(s.Config)
	n := &node{
		name: s.Name, typ: "stage", kind: s.Kind, stage: s,
		group: redis.Group(s.Name), input: s.Input,
		ordering: s.Ordering, lanes: s.Concurrency, inline: traits.Inline, stateful: traits.Stateful,
		retry: s.Retry, retryInPlace: s.RetryInPlace, timeout: s.Timeout, deadLetter: s.DeadLetter, delivery: s.Delivery,
		maxRead: int64(traits.MaxRead),
	}
	// A stateful stage's retries wait in place, and so do those of a stage that feeds one: a
	// message parked in the retry set while the messages behind it went on would let them move the
	// watermark past its windows, and it would come back late. Its partition waits for it instead.
	n.retryInPlace = n.retryInPlace || s.Watermark != nil
	if n.stateful && n.ordering == flow.OrderNone {
		return &ConfigError{"stage " + s.Name + ": a " + s.Kind + " stage keeps state per partition, which needs ordering = \"key\" or \"partition\", not \"none\""}
	}
	n.log = r.log.With(n.typ, n.name)
	n.catchUp = newTableCatchUp(s, n)
	env := r.env(n)
	h := &stageHandler{r: &r.processing, node: n, keepsKey: keyClaimOf(s, traits)}
	var impl any
	if n.stateful {
		compiled, err := stages.CompileStateful(s, env)
		if err != nil {
			return &ConfigError{err.Error()}
		}
		h.stateful, impl = compiled.Processor, compiled.Processor
		n.timers, n.fireAtEnd, n.absorbs = compiled.TimerHandler, compiled.FireAtEnd, compiled.Absorbs
		n.prefetch, n.outputWatermark = compiled.StatePrefetcher, compiled.OutputWatermarker
		n.packsKeys = compiled.PacksKeys
		if compiled.TableTime != "" {
			if n.tableTime = r.tableClock(compiled.TableTime); n.tableTime == nil {
				return &ConfigError{"stage " + s.Name + ": no table " + compiled.TableTime + " to follow the watermark of"}
			}
		}
	} else {
		if h.proc, err = stages.Compile(s, env); err != nil {
			return &ConfigError{err.Error()}
		}
		impl = h.proc
		h.batchReader, _ = h.proc.(stages.BatchReader)
	}
	h.lifecycle = lifecycle{impl}
	n.handler = h
	r.nodes = append(r.nodes, n)
	if !s.FusedAfter() || r.opts.NoFusion {
		r.addUnits(n) // a stage fused after another gets units only if its link runs as a stream (fuseChains)
	}
	return nil
}

// kindMeter is the meter of the kinds' own metrics.
func (r *runner) kindMeter() metric.Meter {
	if r.opts.MeterProvider == nil {
		return noop.NewMeterProvider().Meter("")
	}
	return r.opts.MeterProvider.Meter("github.com/flowrun/flowrun/stages")
}

// stdout returns the runner's standard output, shared by its stdout sinks.
func (r *runner) stdout() *stages.LineWriter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		r.out = stages.NewLineWriter(r.opts.Stdout, 4<<10)
	}
	return r.out
}

// env is what the kinds' constructors get for node n.
func (r *runner) env(n *node) stages.Env {
	env := stages.Env{
		Pipeline: r.plan.Name, Node: n.name, Logger: n.log, Clock: r.clock,
		Meter: r.kindMeter(), HTTPClient: r.opts.HTTPClient, Stdin: r.opts.Stdin, Stdout: r.stdout(),
		MaxMessageSize: r.maxMessageSize(), Redact: r.plan.Redact, Functions: stages.Lookup, Tables: r.tables,
		RateLimiter: rateLimiter{rdb: r.rdb, keys: r.keys, node: n.name, clock: r.clock},
	}
	if r.opts.NodeEnv != nil {
		r.opts.NodeEnv(n.typ, n.name, &env)
	}
	return env
}

func (r *runner) addSource(s *flow.Source) error {
	kind, err := stages.SourceKindOf(s)
	if err != nil {
		return &ConfigError{err.Error()}
	}
	n := &node{name: s.Name, typ: "source", kind: s.Kind, retry: flow.DefaultRetry, timeout: stages.DefaultSinkTimeout,
		delivery: r.plan.Delivery}
	n.log = r.log.With(n.typ, n.name)
	r.nodes = append(r.nodes, n)
	if kind.Stream != nil {
		r.addStreamSource(n, s, kind.Stream(s))
		return nil
	}
	p, err := r.src.newProducingSource(n, s, kind, r.env(n))
	if err != nil {
		return err
	}
	r.producers = append(r.producers, p)
	return nil
}

func (r *runner) addStreamSource(n *node, s *flow.Source, in stages.StreamSource) {
	n.group, n.source = in.Group, s
	n.ordering, n.lanes, n.inline = flow.OrderByPartition, 1, true
	n.handler = &streamSourceHandler{r: &r.processing, node: n, out: s.Output}
	r.units = append(r.units, &unit{
		node: n, stream: in.Stream, leaseKey: r.keys.StreamLease(in.Stream, s.Name), startLatest: in.StartLatest,
	})
}

func (r *runner) addSink(s *flow.Sink) error {
	kind, err := stages.SinkKindOf(s)
	if err != nil {
		return &ConfigError{err.Error()}
	}
	n := &node{
		name: s.Name, typ: "sink", kind: s.Kind,
		group: redis.Group(s.Name), input: s.Input,
		ordering: flow.OrderByKey, lanes: kind.Traits.Lanes, inline: kind.Traits.Inline,
		retry: s.Retry, retryInPlace: s.RetryInPlace, timeout: stages.DefaultSinkTimeout,
		deadLetter: s.DeadLetter, delivery: s.Delivery,
	}
	if n.lanes == 0 {
		n.lanes = stages.DefaultSinkLanes
	}
	n.log = r.log.With("node", n.name)
	impl, err := kind.New(s, r.env(n))
	if err != nil {
		return &ConfigError{"sink " + s.Name + ": " + err.Error()}
	}
	if t, ok := impl.(stages.Timeouter); ok && t.Timeout() > 0 {
		n.timeout = t.Timeout()
	}
	if r.opts.WrapSink != nil {
		impl = r.opts.WrapSink(s.Name, impl)
	}
	h := &sinkHandler{lifecycle: lifecycle{impl}, r: &r.processing, node: n, where: s.Where, sink: impl}
	h.batch, _ = impl.(stages.BatchSink)
	if kind.Streams != nil {
		h.streams = kind.Streams(s)
	}
	n.handler = h
	r.nodes = append(r.nodes, n)
	r.addUnits(n)
	return nil
}
