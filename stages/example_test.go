package stages_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// A plugin package registers its functions and kinds in init. These examples register them in the
// example itself, so that each shows the whole of what it needs.

// A Go stage function, registered under the name that pipelines use as func = "example.normalize"
// in a stage of kind "go". It passes every message on with the key it got, and says so with
// KeepsKey, so that the stage after its stage may run fused with it, in one hop.
func ExampleRegister() {
	stages.Register("example.normalize", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		country, ok := m.Value["country"].(string)
		if !ok {
			// No retry would give the order a country: it goes to the dead letters at once.
			return nil, stages.Permanent(fmt.Errorf("order %v has no country", m.Value["id"]))
		}
		m.Value["country"] = strings.ToUpper(country)
		return []stages.Message{m}, nil
	}, stages.KeepsKey())

	// What a go stage does with each message it reads (decoded, since the function reads it).
	fn, _ := stages.Lookup("example.normalize")
	for _, payload := range []string{`{"id":1,"country":"de"}`, `{"id":2}`} {
		m := stages.NewMessage("customer-7", []byte(payload), nil)
		if err := m.Decode(); err != nil {
			panic(err)
		}
		out, err := fn(context.Background(), m)
		if err != nil {
			fmt.Printf("error: %v (permanent: %v)\n", err, stages.IsPermanent(err))
			continue
		}
		fmt.Println(out[0].Key, out[0].Value["country"])
	}
	fmt.Println("keeps the key:", stages.FuncKeepsKey("example.normalize"))
	// Output:
	// customer-7 DE
	// error: order 2 has no country (permanent: true)
	// keeps the key: true
}

// KeepsKey decides fusion: the filter after a function that keeps its messages' keys runs in the
// same hop as the function (one read, one commit), while the filter after a function that may set
// new keys reads them from a stream between the two.
func ExampleKeepsKey() {
	stages.Register("example.tag", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		m.Value["tagged"] = true
		return []stages.Message{m}, nil
	}, stages.KeepsKey())
	stages.Register("example.by_country", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		m.Key = fmt.Sprint(m.Value["country"]) // a new key: no KeepsKey
		return []stages.Message{m}, nil
	})

	cfg, diags := flow.LoadSource(map[string][]byte{"shop.hcl": []byte(`
pipeline "shop" {}
topic "orders" {
  partitions = 4
  key        = msg.customer
}
stage "tag" {
  kind  = "go"
  func  = "example.tag"
  input = topic.orders
}
stage "big" {
  kind  = "filter"
  input = stage.tag
  where = msg.amount > 100
}
stage "by_country" {
  kind  = "go"
  func  = "example.by_country"
  input = topic.orders
}
stage "german" {
  kind  = "filter"
  input = stage.by_country
  where = msg.country == "DE"
}
sink "big_orders" {
  kind  = "stdout"
  input = stage.big
}
sink "german_orders" {
  kind  = "stdout"
  input = stage.german
}
`)})
	if diags.HasErrors() {
		panic(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{GoFuncs: stages.Names()})
	if diags.HasErrors() {
		panic(diags)
	}
	for _, c := range plan.Chains {
		fmt.Println("one hop:", c.Name())
	}
	fmt.Println("german runs fused:", plan.Stage("german").FusedAfter())
	// Output:
	// one hop: tag+big
	// german runs fused: false
}

// memState is a stages.State in memory, enough to call a stateful function outside a pipeline (the
// runtime hands it the state of its input partition, in Redis). It embeds the interface for the
// methods this example does not call.
type memState struct {
	stages.State
	values map[string][]byte
	timers map[string]time.Time
}

func (s *memState) Get(_ context.Context, key string) ([]byte, bool, error) {
	v, ok := s.values[key]
	return v, ok, nil
}

func (s *memState) Put(_ context.Context, key string, value []byte) error {
	s.values[key] = value
	return nil
}

func (s *memState) Delete(_ context.Context, key string) error {
	delete(s.values, key)
	return nil
}

func (s *memState) SetTimer(_ context.Context, name string, at time.Time) error {
	s.timers[name] = at
	return nil
}

// A stateful function keeps a running total per customer (the message's key, which its input topic
// is keyed by, so that a customer's orders share a partition and its state), and forgets a
// customer an hour of event time after their latest order. In a pipeline, what it writes is
// committed with the acknowledgement of the batch, and the timer fires once the partition's
// watermark passes it.
func ExampleRegisterStateful() {
	stages.RegisterStateful("example.running_total", stages.StatefulFunc{
		Process: func(ctx context.Context, m stages.Message, state stages.State) ([]stages.Message, error) {
			n, _ := m.Value["amount"].(json.Number) // numbers decode as json.Number
			amount, err := n.Int64()
			if err != nil {
				return nil, stages.Permanent(fmt.Errorf("amount: %w", err)) // no retry would fix it
			}
			var total int64
			if v, found, err := state.Get(ctx, m.Key); err != nil {
				return nil, err
			} else if found {
				if err := json.Unmarshal(v, &total); err != nil {
					return nil, stages.Permanent(err)
				}
			}
			total += amount
			if err := state.Put(ctx, m.Key, []byte(fmt.Sprint(total))); err != nil {
				return nil, err
			}
			// Without event_time, a message's event time is when its entry was written.
			if err := state.SetTimer(ctx, m.Key, m.EntryTime.Add(time.Hour)); err != nil {
				return nil, err
			}
			m.Value["total"] = total
			return []stages.Message{m}, nil
		},
		OnTimer: func(ctx context.Context, customer string, _ time.Time, state stages.State) ([]stages.Message, error) {
			return nil, state.Delete(ctx, customer)
		},
	})

	fn, _ := stages.LookupStateful("example.running_total")
	ctx := context.Background()
	state := &memState{values: map[string][]byte{}, timers: map[string]time.Time{}}
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for i, amount := range []string{"10", "25", "5"} {
		m := stages.NewMessage("alice", []byte(`{"amount":`+amount+`}`), nil)
		if err := m.Decode(); err != nil {
			panic(err)
		}
		m.EntryTime = start.Add(time.Duration(i) * time.Minute)
		out, err := fn.Process(ctx, m, state)
		if err != nil {
			panic(err)
		}
		fmt.Println(out[0].Key, "total", out[0].Value["total"])
	}
	fmt.Println("forget alice at", state.timers["alice"].Format(time.Kitchen))
	if _, err := fn.OnTimer(ctx, "alice", state.timers["alice"], state); err != nil {
		panic(err)
	}
	_, found, _ := state.Get(ctx, "alice")
	fmt.Println("alice remembered:", found)
	// Output:
	// alice total 10
	// alice total 35
	// alice total 40
	// forget alice at 1:02PM
	// alice remembered: false
}

// stamp is the processor of the example_stamp stage kind: it sets one field of every message.
type stamp struct {
	out          *flow.Topic
	field, value string
}

func (s stamp) Process(_ context.Context, m *stages.Message, out []stages.Output) ([]stages.Output, error) {
	if err := m.Decode(); err != nil {
		return out, err // a payload that is not a JSON object: Permanent
	}
	m.Value[s.field] = s.value
	m.Changed() // the payload it arrived with no longer describes it
	return append(out, stages.Output{Topic: s.out, Message: *m}), nil
}

// A stage kind of one's own, registered as flowrun's own are: its spec (attributes and docs, which
// validation, flowrun schema and the reference docs take from it), its traits and its constructor.
func ExampleRegisterStage() {
	stages.RegisterStage(stages.StageKind{
		Spec: &flow.Kind{
			Name: "example_stamp",
			Doc:  "Sets a field of every message to a constant.",
			Attributes: []flow.Attribute{
				{Name: "field", Type: flow.TypeString, Required: true, Doc: "The field to set."},
				{Name: "value", Type: flow.TypeString, Default: "", Doc: "Its value."},
			},
			Example: `stage "stamped" {
  kind  = "example_stamp"
  input = topic.orders
  field = "source"
  value = "web"
}`,
		},
		// It only computes, and passes each message on with its key: the stage after it may fuse.
		Traits: stages.StageTraits{Inline: true, KeepsKey: true},
		New: func(s *flow.Stage, _ stages.Env) (stages.Processor, error) {
			return stamp{out: s.Output, field: s.Config.String("field"), value: s.Config.String("value")}, nil
		},
	})

	compile := func(stage string) (*flow.Plan, error) {
		cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(`
pipeline "p" {}
topic "orders" {}
` + stage + `
sink "out" {
  kind  = "stdout"
  input = stage.stamped
}
`)})
		if !diags.HasErrors() {
			var plan *flow.Plan
			if plan, diags = flow.Compile(cfg, flow.Options{}); !diags.HasErrors() {
				return plan, nil
			}
		}
		return nil, fmt.Errorf("%s: %s", diags[0].Summary, diags[0].Detail)
	}

	// Validation knows the kind's attributes.
	_, err := compile(`stage "stamped" {
  kind  = "example_stamp"
  input = topic.orders
  feild = "source"
}`)
	fmt.Println(err)

	plan, err := compile(`stage "stamped" {
  kind  = "example_stamp"
  input = topic.orders
  field = "source"
  value = "web"
}`)
	if err != nil {
		panic(err)
	}
	proc, err := stages.Compile(plan.Stage("stamped"), stages.Env{})
	if err != nil {
		panic(err)
	}
	m := stages.NewMessage("k", []byte(`{"id":1}`), nil)
	out, err := proc.Process(context.Background(), &m, nil)
	if err != nil {
		panic(err)
	}
	payload, _ := out[0].Message.Payload()
	fmt.Println(string(payload))
	// Output:
	// Unsupported argument: An argument named "feild" is not expected here. Did you mean "field"?
	// {"id":1,"source":"web"}
}

// prefixed is the sink of the example_prefixed sink kind: it prints each message after a prefix.
type prefixed struct {
	prefix string
	w      *stages.LineWriter
}

func (s *prefixed) Deliver(_ context.Context, m *stages.Message, out []stages.Write) ([]stages.Write, error) {
	payload, err := m.Payload()
	if err != nil {
		return out, err
	}
	return out, s.w.WriteLine(append([]byte(s.prefix), payload...))
}

// Flush makes what Deliver wrote durable before the runtime acknowledges the batch.
func (s *prefixed) Flush(context.Context) error { return s.w.Flush() }

// A sink kind prints each message on standard output after a prefix of its configuration. A test of
// a kind can build its sink as the runtime does and deliver to it.
func ExampleRegisterSink() {
	stages.RegisterSink(stages.SinkKind{
		Spec: &flow.Kind{
			Name: "example_prefixed",
			Doc:  "Prints each message as a line of JSON on standard output, after a prefix.",
			Attributes: []flow.Attribute{
				{Name: "prefix", Type: flow.TypeString, Default: "> ", Doc: "What each line starts with."},
			},
			Example: `sink "console" {
  kind   = "example_prefixed"
  input  = topic.alerts
  prefix = "alert: "
}`,
		},
		Traits: stages.SinkTraits{Inline: true},
		New: func(s *flow.Sink, env stages.Env) (stages.Sink, error) {
			return &prefixed{prefix: s.Config.String("prefix"), w: env.Stdout}, nil
		},
	})

	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(`
pipeline "p" {}
topic "alerts" {}
sink "console" {
  kind   = "example_prefixed"
  input  = topic.alerts
  prefix = "alert: "
}
`)})
	if diags.HasErrors() {
		panic(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{})
	if diags.HasErrors() {
		panic(diags)
	}
	sink := plan.Sinks[0]
	kind, err := stages.SinkKindOf(sink)
	if err != nil {
		panic(err)
	}
	s, err := kind.New(sink, stages.Env{Stdout: stages.NewLineWriter(os.Stdout, 4096)})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, payload := range []string{`{"disk":"full"}`, `{"cpu":99}`} {
		m := stages.NewMessage("", []byte(payload), nil)
		if _, err := s.Deliver(ctx, &m, nil); err != nil {
			panic(err)
		}
	}
	if err := s.(stages.Flusher).Flush(ctx); err != nil {
		panic(err)
	}
	// Output:
	// alert: {"disk":"full"}
	// alert: {"cpu":99}
}

// countdown is the source of the example_countdown source kind.
type countdown struct{ from int64 }

func (s countdown) Produce(ctx context.Context, out stages.Emitter) error {
	for i := s.from; i > 0; i-- {
		m := stages.NewMessage("", []byte(fmt.Sprintf(`{"n":%d}`, i)), nil)
		// The ID names the message for effectively-once delivery: the same on every attempt.
		if err := out.Emit(ctx, m, stages.Origin{ID: fmt.Sprint(i)}); err != nil {
			return err
		}
	}
	return nil // a finite source is done
}

// printer is an Emitter that prints what a source emits, in place of the runtime's, which writes it
// to the source's output topic.
type printer struct{ stages.Emitter }

func (printer) Emit(_ context.Context, m stages.Message, at stages.Origin) error {
	payload, err := m.Payload()
	fmt.Printf("%s %s\n", at.ID, payload)
	return err
}

// A producing source kind counts down from a number of its configuration, and says how many
// messages it will produce, for a job's progress.
func ExampleRegisterSource() {
	stages.RegisterSource(stages.SourceKind{
		Spec: &flow.Kind{
			Name: "example_countdown",
			Doc:  "Produces from, from - 1, ..., 1 and ends.",
			Attributes: []flow.Attribute{
				{Name: "from", Type: flow.TypeInteger, Default: int64(3), Min: flow.Bound(1), Doc: "Where to start."},
			},
			Example: `source "ticks" {
  kind   = "example_countdown"
  from   = 10
  output = topic.ticks
}`,
		},
		Traits: stages.SourceTraits{
			Finite: func(config flow.Attrs) (bool, int64) { return true, config.Int("from") },
		},
		New: func(s *flow.Source, _ stages.Env) (stages.Source, error) {
			return countdown{from: s.Config.Int("from")}, nil
		},
	})

	cfg, diags := flow.LoadSource(map[string][]byte{"p.hcl": []byte(`
pipeline "p" {}
topic "ticks" {}
source "ticks" {
  kind   = "example_countdown"
  output = topic.ticks
}
sink "out" {
  kind  = "stdout"
  input = topic.ticks
}
`)})
	if diags.HasErrors() {
		panic(diags)
	}
	plan, diags := flow.Compile(cfg, flow.Options{})
	if diags.HasErrors() {
		panic(diags)
	}
	source := plan.Sources[0]
	kind, err := stages.SourceKindOf(source)
	if err != nil {
		panic(err)
	}
	src, err := kind.New(source, stages.Env{})
	if err != nil {
		panic(err)
	}
	if err := src.Produce(context.Background(), printer{}); err != nil {
		panic(err)
	}
	// Output:
	// 3 {"n":3}
	// 2 {"n":2}
	// 1 {"n":1}
}
