package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The pattern stage's attributes.
const (
	patternFieldKey        = "key"
	patternFieldSequence   = "sequence"
	patternFieldWithin     = "within"
	patternFieldGrace      = "grace"
	patternFieldSelect     = "select"
	patternKeyTimerPrefix  = "key:"
	patternMaxPendingError = "the key holds %d events waiting for the watermark, the most one key may hold"
)

// maxPatternPending bounds the events one key may hold while they wait for the watermark to pass
// them: a key whose events run far ahead of the watermark would otherwise grow without bound.
const maxPatternPending = 10000

// The pattern stage finds sequences of events per key: a message for each time its steps match, in
// order of event time, within a span of event time. Events wait in the key's state until the
// watermark is past them (plus grace) and are then matched in event-time order, so that what
// matches depends on event times only, not on the order events arrived in; an event that comes
// when the watermark is already past it (plus grace) is late and goes where late says.
//
// Matching is "followed by": other events may come between the steps. Every event that matches the
// first step starts an attempt at the sequence; an attempt takes, for its next step, the first
// later event that matches it, and emits once, when its last step matches; an attempt whose first
// event is more than within before the event it waits for is given up. An event may take a step in
// several attempts at once, and start one.
func init() {
	RegisterStage(StageKind{Spec: patternSpec, Traits: StageTraits{Stateful: true}, NewStateful: newPatternStage})
}

var patternSpec = &flow.Kind{
	Name:     "pattern",
	StateKey: patternFieldKey,
	// A key's partial match is a position in the sequence, within a time.
	StateShape: []string{patternFieldSequence, patternFieldWithin},
	Results:    true,
	Doc: "Finds sequences of events per key, in event-time order, with other events allowed between the steps " +
		"(followed by): each event that matches the first step starts an attempt, which takes for each next step " +
		"the first later event that matches it, and emits select once its last step matches, if the whole match " +
		"lies within. Events wait until the partition's watermark is past them plus grace, then match in " +
		"event-time order; a result's event time is its last step's. A key's messages must share a partition: " +
		"where the input topic is keyed otherwise, the stage reads a repartition topic keyed by the key (<stage>.by_key).",
	Attributes: []flow.Attribute{
		{Name: patternFieldKey, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg"}, Deterministic: true, Doc: "What a sequence is matched per, such as msg.card."},
		{
			Name: flow.EventTimeAttribute, Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the time the message's entry was written",
			Doc: "The message's event time: an RFC 3339 string, or Unix milliseconds.",
		},
		{
			Name: patternFieldSequence, Type: flow.TypeSequence, Required: true, Deterministic: true,
			Doc: "The steps, in order: each { name, where }, where is a condition on the message. A step's name is how select reads its message.",
		},
		{Name: patternFieldWithin, Type: flow.TypeDuration, Required: true, Doc: "The longest a match may span, from its first step's event time to its last's."},
		{
			Name: flow.IdleTimeoutAttribute, Type: flow.TypeDuration, Default: time.Minute,
			Doc: "A writer of the stage's input that has had nothing to write for this long, with nothing pending and no retry " +
				"waiting, moves its watermark on by the time that passes on the clock, so that the last events match; \"0s\": only events move it.",
		},
		{Name: patternFieldGrace, Type: flow.TypeDuration, Default: time.Duration(0), Doc: "How far behind the watermark an event may be and still match: events are matched once the watermark passes them plus grace."},
		{
			Name: patternFieldSelect, Type: flow.TypeMessageFields, Required: true, RootsFrom: patternFieldSequence, Deterministic: true,
			Doc: "The result of a match, as an object of expressions over the steps' messages, such as { card = big.card, first = probe1.ts }.",
		},
		lateAttribute(),
		maxKeysAttribute("keys with events or attempts", "A key counts until its last event has matched or expired."),
	},
	Example: `stage "card_testing" {
  kind       = "pattern"
  input      = topic.payments
  key        = msg.card
  event_time = msg.ts
  sequence = [
    { name = "probe1", where = msg.amount < 2 },
    { name = "probe2", where = msg.amount < 2 },
    { name = "big", where = msg.amount > 500 },
  ]
  within = "10m"
  select = { card = big.card, amount = big.amount, first_probe = probe1.ts }
}`,
	Check: func(c *flow.KindCheck) {
		if c.Has(patternFieldWithin) && c.Config.Duration(patternFieldWithin) <= 0 {
			c.Errorf(patternFieldWithin, "Invalid within", "within must be a positive duration, such as \"10m\".")
		}
		if c.Config.Duration(patternFieldGrace) < 0 {
			c.Errorf(patternFieldGrace, "Invalid grace", "grace must not be negative.")
		}
	},
}

func newPatternStage(s *flow.Stage, _ Env) (StatefulStage, error) {
	p := &patternStage{
		out: s.Output, key: s.Config.Expr(patternFieldKey), eventTime: flow.EventTimeOf(s),
		steps: s.Config.Sequence(patternFieldSequence), selects: s.Config.Fields(patternFieldSelect),
		within: s.Config.Duration(patternFieldWithin).Milliseconds(), grace: s.Config.Duration(patternFieldGrace).Milliseconds(),
		keys: newKeyLimit(s),
	}
	p.late = newLateRoute(s, time.Duration(p.grace)*time.Millisecond)
	return StatefulStage{Processor: p, TimerHandler: p, FireAtEnd: true, StatePrefetcher: p, OutputWatermarker: p}, nil
}

type patternStage struct {
	out       *flow.Topic
	key       *expr.Program
	eventTime *expr.Program // nil: the entry's time
	steps     []flow.Step
	selects   []flow.Field
	within    int64 // ms
	grace     int64 // ms
	late      lateRoute
	keys      keyLimit
}

// patternKey is what the state holds per key: the events that wait for the watermark, in the
// order they will match, and the attempts under way.
type patternKey struct {
	Pending  []patternEvent   `json:"pending,omitempty"`
	Attempts []patternAttempt `json:"attempts,omitempty"`
	// Seq numbers the key's events as they arrive: events of the same time match in that order.
	Seq int64 `json:"seq"`
}

type patternEvent struct {
	At      int64           `json:"at"`
	Seq     int64           `json:"seq"`
	Payload json.RawMessage `json:"payload"`
}

// patternAttempt is an attempt at the sequence: the events of the steps it has taken, in order.
type patternAttempt struct {
	Steps []patternEvent `json:"steps"`
}

func (s *patternStage) Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error) {
	key, err := s.keyOf(m)
	if err != nil {
		return out, err
	}
	at, err := EventTime(s.eventTime, m)
	if err != nil {
		return out, err
	}
	watermark, err := st.Watermark(ctx)
	if err != nil {
		return out, err
	}
	if at.UnixMilli()+s.grace < watermark.UnixMilli() {
		return s.late.send(st, m, at, watermark, out)
	}
	payload, err := m.Payload()
	if err != nil {
		return out, err
	}
	k, found, err := loadKey[patternKey](ctx, st, key)
	if err != nil {
		return out, err
	}
	if !found {
		if err := s.keys.admit(ctx, st); err != nil {
			return out, err
		}
	}
	if len(k.Pending) >= maxPatternPending {
		return out, Permanent(fmt.Errorf(patternMaxPendingError, len(k.Pending)))
	}
	k.Seq++
	e := patternEvent{At: at.UnixMilli(), Seq: k.Seq, Payload: payload}
	i := sort.Search(len(k.Pending), func(i int) bool { return e.before(k.Pending[i]) })
	k.Pending = append(k.Pending[:i], append([]patternEvent{e}, k.Pending[i:]...)...)
	return out, s.save(ctx, st, key, k)
}

// before orders events by event time, then by arrival.
func (e patternEvent) before(o patternEvent) bool {
	return e.At < o.At || e.At == o.At && e.Seq < o.Seq
}

// OnTimer matches a key's events that the watermark has passed (plus grace), in event-time order,
// and gives up the attempts that no event still to come could complete.
func (s *patternStage) OnTimer(ctx context.Context, st State, name string, _ time.Time, out []Output) ([]Output, error) {
	key, ok := strings.CutPrefix(name, patternKeyTimerPrefix)
	if !ok {
		return out, nil
	}
	k, found, err := loadKey[patternKey](ctx, st, key)
	if err != nil || !found {
		return out, err
	}
	watermark, err := st.Watermark(ctx)
	if err != nil {
		return out, err
	}
	wm := watermark.UnixMilli()
	n := 0
	for n < len(k.Pending) && k.Pending[n].At+s.grace < wm {
		if out, err = s.match(k, k.Pending[n], key, out); err != nil {
			return out, err
		}
		n++
	}
	k.Pending = k.Pending[n:]
	// An attempt whose next step no event could still take in time is given up: every event to
	// come is at or after the watermark less grace.
	kept := k.Attempts[:0]
	for _, a := range k.Attempts {
		if a.Steps[0].At+s.within >= wm-s.grace {
			kept = append(kept, a)
		}
	}
	k.Attempts = kept
	if len(k.Pending) == 0 && len(k.Attempts) == 0 {
		if err := st.Delete(ctx, key); err != nil {
			return out, err
		}
		if err := st.Release(ctx, patternKeyTimerPrefix+key); err != nil {
			return out, err
		}
		return out, s.keys.release(ctx, st)
	}
	return out, s.save(ctx, st, key, k)
}

// match takes one event, in event-time order: it advances the attempts whose next step it matches,
// emitting those it completes, and starts an attempt if it matches the first step.
func (s *patternStage) match(k *patternKey, e patternEvent, key string, out []Output) ([]Output, error) {
	m := NewMessage(key, e.Payload, nil)
	if err := m.Decode(); err != nil {
		return out, err
	}
	env := &expr.Env{Msg: m.Value}
	kept := k.Attempts[:0]
	for _, a := range k.Attempts {
		if e.At-a.Steps[0].At > s.within {
			continue // too late for this attempt, as for every later event
		}
		matches, err := s.steps[len(a.Steps)].Where.EvalBool(env)
		if err != nil {
			return out, evalError(err)
		}
		if !matches {
			kept = append(kept, a)
			continue
		}
		a.Steps = append(a.Steps, e)
		if len(a.Steps) < len(s.steps) {
			kept = append(kept, a)
			continue
		}
		result, err := s.result(key, a)
		if err != nil {
			return out, err
		}
		out = append(out, result)
	}
	k.Attempts = kept
	first, err := s.steps[0].Where.EvalBool(env)
	if err != nil {
		return out, evalError(err)
	}
	if !first {
		return out, nil
	}
	a := patternAttempt{Steps: []patternEvent{e}}
	if len(s.steps) > 1 {
		k.Attempts = append(k.Attempts, a)
		return out, nil
	}
	result, err := s.result(key, a)
	if err != nil {
		return out, err
	}
	return append(out, result), nil
}

// result is a completed attempt's output: select over its steps' messages, keyed by the key, at
// its last step's event time.
func (s *patternStage) result(key string, a patternAttempt) (Output, error) {
	vars := make(map[string]any, len(s.steps))
	for i, step := range s.steps {
		m := NewMessage(key, a.Steps[i].Payload, nil)
		if err := m.Decode(); err != nil {
			return Output{}, err
		}
		vars[step.Name] = m.Value
	}
	env := &expr.Env{Vars: vars}
	v := make(map[string]any, len(s.selects))
	for _, f := range s.selects {
		x, err := f.Expr.Eval(env)
		if err != nil {
			return Output{}, evalError(err)
		}
		v[f.Name] = x.Interface()
	}
	last := a.Steps[len(a.Steps)-1].At
	return Output{Topic: s.out, Message: Message{Key: key, Value: v,
		Headers: map[string]string{EventTimeHeader: strconv.FormatInt(last, 10)}}}, nil
}

// OutputWatermark is the earliest event time of a result the stage emits after its input's
// watermark reached watermark (stages.OutputWatermarker): a result carries its last step's time,
// and an event still to come is at or after the watermark less grace. The events already waiting
// hold the watermark back at the earliest of them (save).
func (s *patternStage) OutputWatermark(watermark time.Time) time.Time {
	return watermark.Add(-time.Duration(s.grace) * time.Millisecond)
}

// StateKeys names what Process reads for m (StatePrefetcher): its key's state and the count of keys.
func (s *patternStage) StateKeys(m *Message, keys []string) []string {
	key, err := s.keyOf(m)
	if err != nil {
		return keys
	}
	return append(keys, key, KeyCountKey)
}

// TimerStateKeys names what OnTimer reads for a timer (TimerStatePrefetcher): its key's state and
// the count of keys.
func (s *patternStage) TimerStateKeys(timer string, keys []string) []string {
	if key, ok := strings.CutPrefix(timer, patternKeyTimerPrefix); ok {
		return append(keys, key, KeyCountKey)
	}
	return keys
}

func (s *patternStage) keyOf(m *Message) (string, error) {
	if err := m.Decode(); err != nil {
		return "", err
	}
	key, err := s.key.EvalString(&expr.Env{Msg: m.Value})
	if err != nil {
		return "", evalError(err)
	}
	return key, checkStateKey(key)
}

// save writes a key's state, its timer (when the watermark will pass its first waiting event plus
// grace, or give up its first attempt) and its hold on the output watermark (its first waiting
// event's time, which a result may carry).
func (s *patternStage) save(ctx context.Context, st State, key string, k *patternKey) error {
	raw, err := json.Marshal(k)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, key, raw); err != nil {
		return err
	}
	due := int64(-1)
	if len(k.Pending) > 0 {
		due = k.Pending[0].At + s.grace + 1
		if err := st.Hold(ctx, patternKeyTimerPrefix+key, time.UnixMilli(k.Pending[0].At)); err != nil {
			return err
		}
	} else if err := st.Release(ctx, patternKeyTimerPrefix+key); err != nil {
		return err
	}
	for _, a := range k.Attempts {
		if giveUp := a.Steps[0].At + s.within + s.grace + 1; due < 0 || giveUp < due {
			due = giveUp
		}
	}
	return st.SetTimer(ctx, patternKeyTimerPrefix+key, time.UnixMilli(due))
}
