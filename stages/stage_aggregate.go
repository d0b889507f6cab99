package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The aggregate stage folds the messages of each group into windows of event time and emits one
// message per group and window when the window closes (or after every batch that changed it). A
// window's accumulators are state of the input partition; the result is written, and the state
// deleted, in the commit of the batch whose watermark closed the window: both or neither.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name:     "aggregate",
			StateKey: "group_by",
			Doc: "Folds the messages of each group (group_by) into windows of event time and emits, per group and " +
				"window, the aggregate fields with key (the group) and window = { start, end } (RFC 3339, UTC). Windows " +
				"are half-open [start, end) and aligned to the Unix epoch. A window closes when the partition's " +
				"watermark (the latest event time it has seen) passes its end plus grace; an event for a closed window " +
				"is late. A group's messages must share a partition: where the input topic is keyed otherwise, the stage reads a " +
				"repartition topic keyed by the group (<stage>.by_key), whose watermark is the least of its writers'.",
			Attributes: []flow.Attribute{
				{Name: "group_by", Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the message's key", Doc: "The group a message counts in, such as msg.customer_id."},
				{
					Name: "event_time", Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the time the message's entry was written",
					Doc: "The message's event time: an RFC 3339 string, or Unix milliseconds.",
				},
				{Name: "grace", Type: flow.TypeDuration, Default: time.Duration(0), Doc: "How late an event may be, past its window's end, in event time."},
				{
					Name: "late", Type: flow.TypeTopicOrChoice, Enum: []string{"drop", "dead_letter"}, Default: "dead_letter",
					Doc: `What happens to an event whose windows have all closed: "drop" (counted as filtered), "dead_letter", or topic.NAME.`,
				},
				{
					Name: "idle_timeout", Type: flow.TypeDuration, Default: time.Minute,
					Doc: "A partition that has had no message for this long, with nothing pending and no retry waiting, moves its watermark on " +
						"by the time that passes on the clock, so that its last windows close; \"0s\": only events move it.",
				},
				{
					Name: "emit", Type: flow.TypeString, Enum: []string{"on_close", "on_update"}, Default: "on_close",
					Doc: "on_close emits a window's result once, when it closes; on_update emits its current value after each batch that changed it, and again when it closes.",
				},
				{
					Name: "aggregate", Type: flow.TypeAggregates, Required: true, Roots: []string{"msg"}, Deterministic: true,
					Doc: "The fields of the result: count(), sum(x), min(x), max(x), avg(x), count_distinct(x), top_k(x, k) " +
						"(the k most frequent values, most frequent first), first(x) and last(x) (by event time).",
				},
			},
			Blocks: []flow.NestedBlock{{Spec: windowSpec, Min: 1, Max: 1}},
			Example: `stage "revenue_per_minute" {
  kind       = "aggregate"
  input      = topic.orders
  group_by   = msg.customer_id
  event_time = msg.created_at
  window {
    type = "tumbling"
    size = "1m"
  }
  grace = "10s"
  aggregate = {
    orders  = count()
    revenue = sum(msg.amount)
  }
}`,
			Check: checkWindow,
		},
		Traits: StageTraits{Stateful: true, FireAtEnd: true},
		New: func(s *flow.Stage, env Env) (Processor, error) {
			w := s.Config.Blocks("window")[0]
			a := &aggregateStage{
				out: s.Output, groupBy: s.Config.Expr("group_by"), eventTime: s.Config.Expr("event_time"),
				size: w.Duration("size"), advance: w.Duration("advance"), grace: s.Config.Duration("grace"),
				onUpdate: s.Config.String("emit") == "on_update", fields: s.Config.Aggregates("aggregate"), state: env.State,
				idleTimeout: s.Config.Duration("idle_timeout"),
			}
			if a.advance == 0 {
				a.advance = a.size // tumbling
			}
			a.lateTopic, a.late = s.Config.TopicOrChoice("late")
			return a, nil
		},
	})
}

var windowSpec = &flow.BlockSpec{
	Type: "window",
	Doc:  "The windows of an aggregate stage.",
	Attributes: []flow.Attribute{
		{Name: "type", Type: flow.TypeString, Required: true, Enum: []string{"tumbling", "hopping"}, Doc: "tumbling: windows of size, one after another; hopping: windows of size that start every advance, and overlap."},
		{Name: "size", Type: flow.TypeDuration, Required: true, Doc: "How long a window is."},
		{Name: "advance", Type: flow.TypeDuration, DefaultDoc: "size", Doc: "How far apart hopping windows start."},
	},
}

// checkWindow checks the window's durations fit its type.
func checkWindow(c *flow.KindCheck) {
	blocks := c.Config.Blocks("window")
	if len(blocks) != 1 {
		return
	}
	w := blocks[0]
	size, advance := w.Duration("size"), w.Duration("advance")
	switch {
	case size < time.Millisecond:
		c.Errorf("window", "Invalid window", "The window's size must be at least 1ms.")
	case w.String("type") == "hopping" && (advance <= 0 || advance > size):
		c.Errorf("window", "Invalid window", "A hopping window needs an advance greater than 0 and no greater than its size.")
	case w.String("type") == "hopping" && size%advance != 0:
		c.Errorf("window", "Invalid window", "A hopping window's size must be a whole number of advances.")
	case w.String("type") == "tumbling" && advance != 0 && advance != size:
		c.Errorf("window", "Invalid window", "A tumbling window has no advance: its windows follow one another.")
	}
}

type aggregateStage struct {
	out           *flow.Topic
	groupBy       *expr.Program // nil: the message's key
	eventTime     *expr.Program // nil: the entry's time
	size, advance time.Duration
	grace         time.Duration
	late          string      // "drop" or "dead_letter" when lateTopic is nil
	lateTopic     *flow.Topic // where late events go, if a topic
	onUpdate      bool
	idleTimeout   time.Duration
	fields        []flow.Aggregate
	state         State
}

// IdleTimeout makes an idle partition's watermark move with the clock (stages.IdleAdvancer).
func (s *aggregateStage) IdleTimeout() time.Duration { return s.idleTimeout }

// A window's state key and its timers: "w:" closes it, "u:" emits its value after a batch.
const windowPrefix, updatePrefix = "w:", "u:"

func windowKey(group string, start int64) string {
	return group + "\x00" + strconv.FormatInt(start, 10)
}

func (s *aggregateStage) Process(ctx context.Context, m *Message, out []Output) ([]Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	group := m.Key
	if s.groupBy != nil {
		var err error
		if group, err = s.groupBy.EvalString(&expr.Env{Msg: m.Value}); err != nil {
			return out, evalError(err)
		}
	}
	at, err := EventTime(s.eventTime, m)
	if err != nil {
		return out, err
	}
	if err := s.state.Observe(ctx, at); err != nil {
		return out, err
	}
	watermark, err := s.state.Watermark(ctx)
	if err != nil {
		return out, err
	}
	values := make([]any, len(s.fields))
	for i, f := range s.fields {
		if f.Arg == nil {
			continue
		}
		v, err := f.Arg.Eval(&expr.Env{Msg: m.Value})
		if err != nil {
			return out, evalError(err)
		}
		values[i] = v.Interface()
	}
	ms, size, advance := at.UnixMilli(), s.size.Milliseconds(), s.advance.Milliseconds()
	open := 0
	// The windows that hold at start at multiples of advance, from the latest at or before it back
	// to the one that ends just after it.
	for start := floorDiv(ms, advance) * advance; start > ms-size; start -= advance {
		end := start + size
		if end+s.grace.Milliseconds() <= watermark.UnixMilli() {
			continue // closed: late for this window
		}
		open++
		if err := s.add(ctx, group, start, end, ms, values); err != nil {
			return out, err
		}
	}
	if open > 0 {
		return out, nil
	}
	late := fmt.Errorf("late: its event time %s is more than grace (%s) past the end of its window at the watermark %s",
		at.UTC().Format(time.RFC3339Nano), s.grace, watermark.UTC().Format(time.RFC3339Nano))
	switch {
	case s.lateTopic != nil:
		Record(ctx, Late)
		return append(out, Output{Topic: s.lateTopic, Message: *m}), nil
	case s.late == "drop":
		Record(ctx, Late)
		return out, nil
	}
	return out, Permanent(late) // counted as dead-lettered, with the reason "late: ..."
}

// add folds one message into a window's accumulators, and sets the window's timers.
func (s *aggregateStage) add(ctx context.Context, group string, start, end, at int64, values []any) error {
	key := windowKey(group, start)
	w, err := s.load(ctx, key)
	if err != nil {
		return err
	}
	if w == nil {
		w = &windowState{Group: group, Start: start, End: end, Fields: make([]accumulator, len(s.fields))}
	}
	for i, f := range s.fields {
		w.Fields[i].add(f.Func, values[i], at)
	}
	b, err := json.Marshal(w)
	if err != nil {
		return err
	}
	if err := s.state.Put(ctx, windowPrefix+key, b); err != nil {
		return err
	}
	if err := s.state.SetTimer(ctx, windowPrefix+key, time.UnixMilli(end+s.grace.Milliseconds())); err != nil {
		return err
	}
	if s.onUpdate {
		// Due at once: timers fire after the batch's messages, so this emits once per batch.
		return s.state.SetTimer(ctx, updatePrefix+key, time.UnixMilli(at))
	}
	return nil
}

func (s *aggregateStage) load(ctx context.Context, key string) (*windowState, error) {
	b, found, err := s.state.Get(ctx, windowPrefix+key)
	if err != nil || !found {
		return nil, err
	}
	var w windowState
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, Permanent(fmt.Errorf("the state of window %q cannot be read: %w", key, err))
	}
	if len(w.Fields) != len(s.fields) {
		return nil, Permanent(fmt.Errorf("the state of window %q has %d fields, the stage %d: the aggregate changed under existing state", key, len(w.Fields), len(s.fields)))
	}
	return &w, nil
}

// OnTimer emits a window's result: when it closes, and then forgets it; or, with emit = "on_update",
// after a batch that changed it.
func (s *aggregateStage) OnTimer(ctx context.Context, name string, _ time.Time, out []Output) ([]Output, error) {
	closing := strings.HasPrefix(name, windowPrefix)
	key, ok := strings.CutPrefix(name, windowPrefix)
	if !closing {
		if key, ok = strings.CutPrefix(name, updatePrefix); !ok {
			return out, nil
		}
	}
	w, err := s.load(ctx, key)
	if err != nil || w == nil {
		return out, err
	}
	out = append(out, Output{Topic: s.out, Message: Message{Key: w.Group, Value: s.result(w)}})
	if closing {
		if err := s.state.Delete(ctx, windowPrefix+key); err != nil {
			return out, err
		}
		return out, s.state.CancelTimer(ctx, updatePrefix+key)
	}
	return out, nil
}

// result is a window's output payload.
func (s *aggregateStage) result(w *windowState) map[string]any {
	v := make(map[string]any, len(s.fields)+2)
	for i, f := range s.fields {
		v[f.Name] = w.Fields[i].value(f)
	}
	v["key"] = w.Group
	v["window"] = map[string]any{
		"start": time.UnixMilli(w.Start).UTC().Format(time.RFC3339Nano),
		"end":   time.UnixMilli(w.End).UTC().Format(time.RFC3339Nano),
	}
	return v
}

// windowState is a window's accumulators, as its state holds them (JSON).
type windowState struct {
	Group  string        `json:"g"`
	Start  int64         `json:"s"`
	End    int64         `json:"e"`
	Fields []accumulator `json:"f"`
}

// accumulator is one aggregate field's running value: each function uses the parts it needs.
type accumulator struct {
	N        int64            `json:"n,omitempty"` // values counted (count, avg)
	Sum      float64          `json:"sum,omitempty"`
	Best     any              `json:"best,omitempty"` // min or max so far
	Distinct map[string]bool  `json:"d,omitempty"`
	Counts   map[string]int64 `json:"c,omitempty"` // top_k
	Value    any              `json:"v,omitempty"` // first or last
	At       int64            `json:"at,omitempty"`
	Set      bool             `json:"set,omitempty"` // Value (or Best) has been set
}

// add folds one value (the field's argument on one message, at its event time) in. Nulls count for
// count() only.
func (a *accumulator) add(fn string, v any, at int64) {
	if fn == "count" {
		a.N++
		return
	}
	if v == nil {
		return
	}
	switch fn {
	case "sum", "avg":
		if f, ok := toFloat(v); ok {
			a.Sum += f
			a.N++
		}
	case "min", "max":
		if !a.Set || better(fn, v, a.Best) {
			a.Best, a.Set = v, true
		}
	case "count_distinct":
		a.Distinct = put(a.Distinct, canonical(v), true)
	case "top_k":
		if a.Counts == nil {
			a.Counts = map[string]int64{}
		}
		a.Counts[canonical(v)]++
	case "first":
		if !a.Set || at < a.At {
			a.Value, a.At, a.Set = v, at, true
		}
	case "last":
		if !a.Set || at >= a.At {
			a.Value, a.At, a.Set = v, at, true
		}
	}
}

// value is the field's result.
func (a *accumulator) value(f flow.Aggregate) any {
	switch f.Func {
	case "count":
		return a.N
	case "sum":
		return number(a.Sum)
	case "avg":
		if a.N == 0 {
			return nil
		}
		return number(a.Sum / float64(a.N))
	case "min", "max":
		return a.Best
	case "count_distinct":
		return len(a.Distinct)
	case "top_k":
		values := make([]string, 0, len(a.Counts))
		for v := range a.Counts {
			values = append(values, v)
		}
		sort.Slice(values, func(i, j int) bool {
			if a.Counts[values[i]] != a.Counts[values[j]] {
				return a.Counts[values[i]] > a.Counts[values[j]]
			}
			return values[i] < values[j]
		})
		top := make([]any, 0, min(f.K, len(values)))
		for _, v := range values[:min(f.K, len(values))] {
			var x any
			if json.Unmarshal([]byte(v), &x) != nil {
				x = v
			}
			top = append(top, x)
		}
		return top
	}
	return a.Value // first, last
}

func put[V any](m map[string]V, k string, v V) map[string]V {
	if m == nil {
		m = map[string]V{}
	}
	m[k] = v
	return m
}

// canonical is a value's JSON, for counting equal values together.
func canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}

// better reports whether v beats best for min or max: numbers by value, anything else by its text.
func better(fn string, v, best any) bool {
	fv, vNum := toFloat(v)
	fb, bNum := toFloat(best)
	var less, greater bool
	if vNum && bNum {
		less, greater = fv < fb, fv > fb
	} else {
		sv, sb := fmt.Sprint(v), fmt.Sprint(best)
		less, greater = sv < sb, sv > sb
	}
	if fn == "min" {
		return less
	}
	return greater
}

// number is a float64 result, as a whole number when it is one.
func number(f float64) any {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return int64(f)
	}
	return f
}

// floorDiv divides rounding towards negative infinity, so that windows align before 1970 too.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
