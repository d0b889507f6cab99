package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/telemetry"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/web"
	"github.com/flowrun/flowrun/stages"
)

// The tests of how nodes count (runtime/outcomes.go): each message a node takes in ends in one
// outcome, counted once, so that in = out + filtered + dropped + absorbed + dead_lettered +
// in_flight, in the summary, /api/graph and the Prometheus metrics alike.

func init() {
	// counters.split passes every message on, as part 0, and a message whose n is divisible by 4
	// a second time, as part 1: a fan-out.
	stages.Register("counters.split", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		m.Value["part"] = 0
		out := []stages.Message{m}
		if n := number(m.Value["n"]); n%4 == 0 {
			second := maps.Clone(m.Value)
			second["part"] = 1
			out = append(out, stages.Message{Key: m.Key, Value: second})
		}
		return out, nil
	})
	// counters.flaky fails a message whose n is 7 modulo 10 for good, and the first attempt at one
	// whose n is 1 modulo 5 (once per run and part: the retry succeeds).
	stages.Register("counters.flaky", func(_ context.Context, m stages.Message) ([]stages.Message, error) {
		n := number(m.Value["n"])
		switch {
		case n%10 == 7:
			return nil, stages.Permanent(errors.New("seven"))
		case n%5 == 1 && firstAttempt("flaky", m.Value):
			return nil, errors.New("flaky")
		}
		return []stages.Message{m}, nil
	})
}

// attempted holds the messages that counters.flaky and the failing sink failed once.
var attempted sync.Map

func firstAttempt(at string, v map[string]any) bool {
	_, seen := attempted.LoadOrStore(fmt.Sprint(at, "/", v["run"], "/", v["n"], "/", v["part"]), true)
	return !seen
}

func number(v any) int {
	switch v := v.(type) {
	case json.Number:
		n, _ := strconv.Atoi(string(v))
		return n
	case float64:
		return int(v)
	case int:
		return v
	}
	return -1
}

// failingSink is the hook sink of countersPipeline: it fails for good a message whose n is 4
// modulo 6, and the first attempt at one whose n is 2 modulo 6.
type failingSink struct{ next stages.Sink }

func (s failingSink) Deliver(ctx context.Context, m *stages.Message, out []stages.Write) ([]stages.Write, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	switch n := number(m.Value["n"]); {
	case n%6 == 4:
		return out, stages.Permanent(errors.New("refused"))
	case n%6 == 2 && firstAttempt("hook", m.Value):
		return out, errors.New("try again")
	}
	return s.next.Deliver(ctx, m, out)
}

// countersPipeline reads a file with bad lines, filters, fans out, fails and retries (in the retry
// set), routes and delivers to a sink that fails and dead-letters: its four stages run fused.
const countersPipeline = `
pipeline "counters" {}
variable "input" { type = string }
retry "quick" {
  max_attempts = 3
  backoff      = "constant"
  initial      = "1ms"
}
topic "events" {
  partitions = 2
  key        = msg.k
}
topic "evens" {
  partitions = 2
  key        = msg.k
}
source "file" {
  kind   = "file"
  path   = var.input
  output = topic.events
}
stage "big" {
  kind  = "filter"
  input = topic.events
  where = msg.n % 3 != 0
}
stage "split" {
  kind  = "go"
  func  = "counters.split"
  input = stage.big
}
stage "flaky" {
  kind  = "go"
  func  = "counters.flaky"
  input = stage.split
  retry = retry.quick
}
stage "by_parity" {
  kind  = "route"
  input = stage.flaky
  case {
    when   = msg.n % 2 == 0
    output = topic.evens
  }
}
sink "hook" {
  kind  = "stdout"
  input = topic.evens
  retry = retry.quick
}
`

// statefulPipeline deduplicates orders (dropping the duplicates) and counts them per minute twice,
// routing the late ones to a topic in one aggregate and dropping them in the other.
const statefulPipeline = `
pipeline "counters_stateful" {}
variable "input" { type = string }
topic "orders" {
  partitions = 1 # the dedupe's repartition topic (by id) keeps the order
  key        = msg.customer
}
topic "unique" {
  partitions = 1
  key        = msg.customer
}
topic "late_orders" { partitions = 1 }
source "file" {
  kind   = "file"
  path   = var.input
  output = topic.orders
}
stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.id
  within     = "1h"
  event_time = msg.at
  output     = topic.unique
}
stage "per_minute" {
  kind       = "aggregate"
  input      = topic.unique
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  late      = topic.late_orders
  aggregate = { orders = count() }
}
stage "dropping" {
  kind       = "aggregate"
  input      = topic.unique
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  late      = "drop"
  aggregate = { orders = count() }
}
sink "totals" {
  kind  = "stdout"
  input = stage.per_minute
}
sink "totals_too" {
  kind  = "stdout"
  input = stage.dropping
}
sink "late" {
  kind  = "stdout"
  input = topic.late_orders
}
`

// nodeTally is a node's counters as one of the places that show them reads them.
type nodeTally struct {
	In, Out, Filtered, Dropped, Absorbed, DeadLettered, InFlight int64
	Written, FailedAttempts, Retries                             int64
}

// addsUp says what is wrong with a node's counters, or "".
func (c nodeTally) addsUp() string {
	if sum := c.Out + c.Filtered + c.Dropped + c.Absorbed + c.DeadLettered + c.InFlight; sum != c.In {
		return fmt.Sprintf("in %d, but out + filtered + dropped + absorbed + dead_lettered + in_flight = %d", c.In, sum)
	}
	return ""
}

func summaryTallies(s *runtime.Summary) map[string]nodeTally {
	out := map[string]nodeTally{}
	for _, n := range s.Nodes {
		out[n.Name] = nodeTally{n.In, n.Out, n.Filtered, n.Dropped, n.Absorbed, n.DeadLettered, n.InFlight,
			n.Written, n.FailedAttempts, n.Retries}
	}
	return out
}

// graphTallies reads the counters of /api/graph, as JSON.
func graphTallies(t *testing.T, body string) map[string]nodeTally {
	t.Helper()
	var doc struct {
		Nodes []struct {
			Name     string `json:"name"`
			Type     string `json:"type"`
			Counters *struct {
				In             int64 `json:"in"`
				Out            int64 `json:"out"`
				Filtered       int64 `json:"filtered"`
				Dropped        int64 `json:"dropped"`
				Absorbed       int64 `json:"absorbed"`
				DeadLettered   int64 `json:"dead_lettered"`
				InFlight       int64 `json:"in_flight"`
				Written        int64 `json:"written"`
				FailedAttempts int64 `json:"failed_attempts"`
				Retries        int64 `json:"retries"`
			} `json:"counters"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatalf("/api/graph: %v\n%s", err, body)
	}
	out := map[string]nodeTally{}
	for _, n := range doc.Nodes {
		if n.Type == "topic" {
			continue
		}
		c := n.Counters
		if c == nil {
			t.Fatalf("/api/graph: node %s has no counters", n.Name)
		}
		out[n.Name] = nodeTally{c.In, c.Out, c.Filtered, c.Dropped, c.Absorbed, c.DeadLettered, c.InFlight,
			c.Written, c.FailedAttempts, c.Retries}
	}
	return out
}

// prometheusSample is one line of the Prometheus text format: a name, labels and a value.
var prometheusSample = regexp.MustCompile(`(?m)^(flowrun_[a-z_]+)\{([^}]*)\} (\S+)$`)

// prometheusTallies reads the node counters of a scrape of /metrics.
func prometheusTallies(t *testing.T, body string) map[string]nodeTally {
	t.Helper()
	fields := map[string]func(*nodeTally) *int64{
		"flowrun_messages_in_total":            func(c *nodeTally) *int64 { return &c.In },
		"flowrun_messages_out_total":           func(c *nodeTally) *int64 { return &c.Out },
		"flowrun_messages_filtered_total":      func(c *nodeTally) *int64 { return &c.Filtered },
		"flowrun_messages_dropped_total":       func(c *nodeTally) *int64 { return &c.Dropped },
		"flowrun_messages_absorbed_total":      func(c *nodeTally) *int64 { return &c.Absorbed },
		"flowrun_messages_dead_lettered_total": func(c *nodeTally) *int64 { return &c.DeadLettered },
		"flowrun_messages_in_flight":           func(c *nodeTally) *int64 { return &c.InFlight },
		"flowrun_entries_written_total":        func(c *nodeTally) *int64 { return &c.Written },
		"flowrun_attempts_failed_total":        func(c *nodeTally) *int64 { return &c.FailedAttempts },
		"flowrun_retries_total":                func(c *nodeTally) *int64 { return &c.Retries },
	}
	node := regexp.MustCompile(`flowrun_node="([^"]*)"`)
	out := map[string]nodeTally{}
	seen := map[string]int{}
	for _, m := range prometheusSample.FindAllStringSubmatch(body, -1) {
		field, ok := fields[m[1]]
		name := node.FindStringSubmatch(m[2])
		if !ok || name == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("%s: %v", m[0], err)
		}
		c := out[name[1]]
		*field(&c) = int64(v)
		out[name[1]] = c
		seen[m[1]]++
	}
	for name := range fields {
		if seen[name] == 0 {
			t.Errorf("/metrics has no %s:\n%s", name, body)
		}
	}
	return out
}

// checkCounters checks that every node's counters add up, with nothing in flight once a job is
// done, that the summary, /api/graph and the metrics agree, and that the summary says what want
// says, node by node.
func checkCounters(t *testing.T, summary *runtime.Summary, graph, metrics string, want map[string]nodeTally) {
	t.Helper()
	fromSummary := summaryTallies(summary)
	places := map[string]map[string]nodeTally{
		"the summary": fromSummary, "/api/graph": graphTallies(t, graph), "/metrics": prometheusTallies(t, metrics),
	}
	for where, nodes := range places {
		for _, name := range slices.Sorted(maps.Keys(fromSummary)) {
			c, ok := nodes[name]
			switch {
			case !ok:
				t.Errorf("%s has no counters of %s", where, name)
			case c.addsUp() != "":
				t.Errorf("%s: %s: %s (%+v)", where, name, c.addsUp(), c)
			case c.InFlight != 0:
				t.Errorf("%s: %s: %d in flight once the job is done", where, name, c.InFlight)
			case c != fromSummary[name]:
				t.Errorf("%s: %s: %+v, the summary says %+v", where, name, c, fromSummary[name])
			}
		}
	}
	for name, w := range want {
		if got := fromSummary[name]; got != w {
			t.Errorf("%s: %+v\n  want %+v", name, got, w)
		}
	}
}

// runCounted runs a plan as a job with a Prometheus exporter, then reads /api/graph and /metrics.
func runCounted(t *testing.T, plan *flow.Plan, opts runtime.Options) (summary *runtime.Summary, graph, metrics, log string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tel, err := telemetry.Setup(ctx, telemetry.Config{Trace: "none", Metrics: true, Pipeline: plan.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	var logs, stdout syncBuffer
	opts.Redis, opts.UntilDrained, opts.MeterProvider = server.open(t), true, tel.MeterProvider
	opts.Logger, opts.Stdout = newLogger(&logs), &stdout
	rt, err := runtime.New(plan, opts)
	if err != nil {
		t.Fatal(err)
	}
	if summary, err = rt.Run(ctx); err != nil || ctx.Err() != nil {
		t.Fatalf("run: %v\n%s", err, logs.String())
	}
	checkEndsCleanly(t, logs.String())
	h := web.NewHandler(rt, tel.MetricsHandler)
	_, graph = get(t, h, "/api/graph")
	_, metrics = get(t, h, "/metrics")
	return summary, graph, metrics, logs.String()
}

// TestCountersAddUp runs a pipeline that filters, fans out, retries through the retry set, routes
// and dead-letters at a sink, from a file with bad lines, fused and not, and a stateful one that
// drops duplicates and routes or drops late events: every node's counters add up, in the summary,
// in /api/graph and in the metrics, each message counted once.
func TestCountersAddUp(t *testing.T) {
	const n = 300
	for _, noFusion := range []bool{false, true} {
		t.Run(fmt.Sprintf("stateless/no_fusion=%v", noFusion), func(t *testing.T) {
			run := fmt.Sprintf("%s-%d", t.Name(), prefixes.Add(1))
			var lines []string
			bad := 0
			for i := 0; i < n; i++ {
				lines = append(lines, fmt.Sprintf(`{"k":"k%d","n":%d,"run":%q}`, i%7, i, run))
				if i%37 == 0 { // more than the dead letters logged one by one
					lines = append(lines, fmt.Sprintf("not json %d", i))
					bad++
				}
			}
			input := filepath.Join(t.TempDir(), "events.jsonl")
			writeFile(t, input, strings.Join(lines, "\n")+"\n")
			plan := buildSource(t, countersPipeline, "input="+input)
			summary, graph, metrics, _ := runCounted(t, plan, runtime.Options{
				NoFusion: noFusion, RetryInPlaceUpTo: time.Nanosecond, RetryPoll: 5 * time.Millisecond,
				WrapSink: func(name string, made stages.Sink) stages.Sink { return failingSink{made} },
			})

			// What each node does to each message, by its n.
			want := map[string]nodeTally{"file": {In: int64(n + bad), Out: n, DeadLettered: int64(bad), Written: n}}
			add := func(name string, f func(*nodeTally)) {
				c := want[name]
				f(&c)
				want[name] = c
			}
			for i := 0; i < n; i++ {
				add("big", func(c *nodeTally) { c.In++ })
				if i%3 == 0 {
					add("big", func(c *nodeTally) { c.Filtered++ })
					continue
				}
				parts := int64(1)
				if i%4 == 0 {
					parts = 2
				}
				add("big", func(c *nodeTally) { c.Out++; c.Written++ })
				add("split", func(c *nodeTally) { c.In++; c.Out++; c.Written += parts })
				for range parts {
					add("flaky", func(c *nodeTally) { c.In++ })
					if i%5 == 1 {
						add("flaky", func(c *nodeTally) { c.FailedAttempts++; c.Retries++ })
					}
					if i%10 == 7 {
						add("flaky", func(c *nodeTally) { c.FailedAttempts++; c.DeadLettered++ })
						continue
					}
					add("flaky", func(c *nodeTally) { c.Out++; c.Written++ })
					add("by_parity", func(c *nodeTally) { c.In++ })
					if i%2 == 1 {
						add("by_parity", func(c *nodeTally) { c.Filtered++ })
						continue
					}
					add("by_parity", func(c *nodeTally) { c.Out++; c.Written++ })
					add("hook", func(c *nodeTally) { c.In++ })
					switch i % 6 {
					case 2:
						add("hook", func(c *nodeTally) { c.FailedAttempts++; c.Retries++; c.Out++; c.Written++ })
					case 4:
						add("hook", func(c *nodeTally) { c.FailedAttempts++; c.DeadLettered++ })
					default:
						add("hook", func(c *nodeTally) { c.Out++; c.Written++ })
					}
				}
			}
			checkCounters(t, summary, graph, metrics, want)
		})
	}

	t.Run("stateful", func(t *testing.T) {
		// Per customer, in order: two orders, a duplicate, an order of the next minute, one three
		// minutes later (the watermark closes the first two minutes), a late order, a duplicate,
		// and a bad line. The second customer's times are ten minutes later: none of its orders is
		// late but the one meant to be.
		var lines []string
		for c, customer := range []string{"a", "b"} {
			at := func(mins, sec int) string {
				return time.Date(2026, 1, 1, 0, 10*c+mins, sec, 0, time.UTC).Format(time.RFC3339)
			}
			for _, o := range []struct {
				id       string
				min, sec int
			}{{"1", 0, 10}, {"2", 0, 40}, {"1", 0, 50}, {"3", 1, 30}, {"4", 3, 0}, {"5", 0, 20}, {"2", 3, 10}} {
				lines = append(lines, fmt.Sprintf(`{"customer":%q,"id":"%s%s","at":%q}`, customer, customer, o.id, at(o.min, o.sec)))
			}
			lines = append(lines, "{not json")
		}
		input := filepath.Join(t.TempDir(), "orders.jsonl")
		writeFile(t, input, strings.Join(lines, "\n")+"\n")
		plan := buildSource(t, statefulPipeline, "input="+input)
		summary, graph, metrics, _ := runCounted(t, plan, runtime.Options{})
		// Each customer has 7 orders, 2 of them duplicates, 1 of the 5 others late; its windows
		// are the minutes 0, 1 and 3: 3 results.
		checkCounters(t, summary, graph, metrics, map[string]nodeTally{
			"file":       {In: 16, Out: 14, DeadLettered: 2, Written: 14},
			"once":       {In: 14, Out: 10, Dropped: 4, Written: 10},
			"per_minute": {In: 10, Out: 2, Absorbed: 8, Written: 6 + 2},
			"dropping":   {In: 10, Dropped: 2, Absorbed: 8, Written: 6},
			"totals":     {In: 6, Out: 6, Written: 6},
			"totals_too": {In: 6, Out: 6, Written: 6},
			"late":       {In: 2, Out: 2, Written: 2},
		})
		for _, s := range summary.Nodes {
			if late := map[string]int64{"per_minute": 2, "dropping": 2}[s.Name]; s.Late != late {
				t.Errorf("%s found %d late, want %d", s.Name, s.Late, late)
			}
			if dups := map[string]int64{"once": 4}[s.Name]; s.Duplicates != dups {
				t.Errorf("%s found %d duplicates, want %d", s.Name, s.Duplicates, dups)
			}
		}
	})
}
