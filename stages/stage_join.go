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

// The join stage's attributes, its sides and its types.
const (
	joinFieldType      = "type"
	joinFieldBefore    = "before"
	joinFieldAfter     = "after"
	joinFieldGrace     = "grace"
	joinFieldSelect    = "select"
	joinFieldMaxPerKey = "max_per_key"
	joinLeft           = "left"
	joinRight          = "right"
	joinInner          = "inner"
	joinOuter          = "outer"
	joinKeyTimerPrefix = "key:"
)

// SideHeader tags a message on its way to a stage with two inputs (a join) with the side it comes
// from, "left" or "right": the repartition stage of each side sets it (flow/sides.go).
const SideHeader = "flowrun-side"

// The join stage matches the events of two inputs by key, within a span of event time: a left
// event at time L matches every right event of its key at a time R with L-before <= R <= L+after.
// Both sides reach the stage through one repartition topic (flow/sides.go), so that each key's
// events of both sides are in one partition's state, and one commit takes the match, the state and
// the acknowledgement of both.
//
// A match is emitted as soon as its second event arrives. An event is kept until the watermark is
// past the last time an event of the other side could still match it (plus grace): no event that
// comes after that can match it without being late. It is then forgotten, and, unmatched, emitted
// alone (with the other side null) by a left join for a left event and by an outer join for either.
// So an unmatched row comes once, after every match it could have had, and never before a match.
// What matches, and what comes out unmatched, depends on event times only, not on arrival order.
func init() {
	RegisterStage(StageKind{Spec: joinSpec, Traits: StageTraits{Stateful: true}, NewStateful: newJoinStage})
}

var joinSpec = &flow.Kind{
	Name:    "join",
	Results: true,
	Sides:   []string{joinLeft, joinRight},
	// Each side's buffered messages are kept by its key, for the join's type and time bounds.
	StateShape: []string{joinLeft, joinRight, joinFieldType, joinFieldBefore, joinFieldAfter},
	Doc: "Matches the events of two inputs by key within a span of event time: a left event at time L matches each " +
		"right event of its key at a time R with L - before <= R <= L + after, and each match is emitted as soon as " +
		"its second event arrives. An inner join emits matches only; a left join also emits each left event that " +
		"matched nothing, with right null, once the watermark has passed its span plus grace; an outer join does so " +
		"for the events of both sides. The stage reads both sides through one repartition topic keyed by the sides' " +
		"keys (<stage>.by_key), written by a stage per side (<stage>.left, <stage>.right). A result's event time is " +
		"the later of its events'.",
	Attributes: []flow.Attribute{
		{
			Name: joinFieldType, Type: flow.TypeString, Default: joinInner, Enum: []string{joinInner, joinLeft, joinOuter},
			Doc: `"inner": matches only; "left": also the left events that matched nothing; "outer": also those of both sides.`,
		},
		{Name: joinFieldBefore, Type: flow.TypeDuration, Default: time.Duration(0), Doc: "How long before its left event a right event may be and still match it."},
		{Name: joinFieldAfter, Type: flow.TypeDuration, Default: time.Duration(0), Doc: "How long after its left event a right event may be and still match it."},
		{
			Name: joinFieldGrace, Type: flow.TypeDuration, Default: time.Duration(0),
			Doc: "How far behind the watermark an event may be and still match; an event further behind is late.",
		},
		{
			Name: flow.IdleTimeoutAttribute, Type: flow.TypeDuration, Default: time.Minute,
			Doc: "A writer of either side that has had nothing to write for this long, with nothing pending and no retry " +
				"waiting, moves its watermark on by the time that passes on the clock, so that the last events are " +
				"emitted unmatched; \"0s\": only events move it.",
		},
		{
			Name: joinFieldSelect, Type: flow.TypeMessageFields, Roots: []string{joinLeft, joinRight}, Deterministic: true,
			DefaultDoc: "{ left = left, right = right }: both events whole",
			Doc: "The result of a match, as an object of expressions over the two events, such as { ad = left.ad_id, " +
				"clicked = right.ts }. An unmatched side is null, and so is each of its fields.",
		},
		lateAttribute(),
		{
			Name: joinFieldMaxPerKey, Type: flow.TypeInteger, Default: int64(10000), Min: flow.Bound(1),
			Doc: "How many events of one side one key may hold while they wait for matches. An event past it is " +
				"dead-lettered, saying so; none is forgotten early.",
		},
		maxKeysAttribute("keys with events", "A key counts until its last event is forgotten."),
	},
	Blocks: []flow.NestedBlock{
		{Spec: &flow.BlockSpec{Type: joinLeft, Doc: "The left input of the join.", Attributes: flow.SideAttributes(joinLeft)}, Min: 1, Max: 1},
		{Spec: &flow.BlockSpec{Type: joinRight, Doc: "The right input of the join.", Attributes: flow.SideAttributes(joinRight)}, Min: 1, Max: 1},
	},
	Example: `stage "clicked_views" {
  kind = "join"
  type = "left"
  left {
    input      = topic.views
    key        = msg.ad_id
    event_time = msg.ts
  }
  right {
    input      = topic.clicks
    key        = msg.ad_id
    event_time = msg.ts
  }
  after  = "10m"
  grace  = "30s"
  select = { ad = left.ad_id, viewed = left.ts, clicked = right.ts }
}`,
}

func newJoinStage(s *flow.Stage, _ Env) (StatefulStage, error) {
	j := &joinStage{
		out: s.Output, typ: s.Config.String(joinFieldType), selects: s.Config.Fields(joinFieldSelect),
		before: s.Config.Duration(joinFieldBefore).Milliseconds(), after: s.Config.Duration(joinFieldAfter).Milliseconds(),
		grace: s.Config.Duration(joinFieldGrace).Milliseconds(), maxPerKey: int(s.Config.Int(joinFieldMaxPerKey)),
		keys: newKeyLimit(s),
	}
	j.late = newLateRoute(s, time.Duration(j.grace)*time.Millisecond)
	return StatefulStage{Processor: j, TimerHandler: j, FireAtEnd: true, StatePrefetcher: j, OutputWatermarker: j}, nil
}

type joinStage struct {
	out           *flow.Topic
	typ           string
	selects       []flow.Field // none: both events whole
	before, after int64        // ms
	grace         int64        // ms
	maxPerKey     int
	late          lateRoute
	keys          keyLimit
}

// joinKey is what the state holds per key: the events of each side that may still match, in
// event-time order.
type joinKey struct {
	Left  []joinEvent `json:"left,omitempty"`
	Right []joinEvent `json:"right,omitempty"`
	// Seq numbers the key's events as they arrive: events of the same time keep that order.
	Seq int64 `json:"seq"`
}

type joinEvent struct {
	At      int64           `json:"at"`
	Seq     int64           `json:"seq"`
	Payload json.RawMessage `json:"payload"`
	Matched bool            `json:"matched,omitempty"`
}

// before orders events by event time, then by arrival.
func (e joinEvent) before(o joinEvent) bool {
	return e.At < o.At || e.At == o.At && e.Seq < o.Seq
}

func (s *joinStage) Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error) {
	side := m.Headers[SideHeader]
	if side != joinLeft && side != joinRight {
		return out, Permanent(fmt.Errorf("the message has no %s header saying which side of the join it comes from: "+
			"a join reads its sides through the stages that tag them", SideHeader))
	}
	key := m.Key
	if err := checkStateKey(key); err != nil {
		return out, err
	}
	at, err := EventTime(nil, m) // the side's event time, as its repartition stage tagged it
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
	k, found, err := loadKey[joinKey](ctx, st, key)
	if err != nil {
		return out, err
	}
	if !found {
		if err := s.keys.admit(ctx, st); err != nil {
			return out, err
		}
	}
	own, other := &k.Left, k.Right
	if side == joinRight {
		own, other = &k.Right, k.Left
	}
	if len(*own) >= s.maxPerKey {
		return out, Permanent(fmt.Errorf("key %q holds %d %s events that may still match, the most max_per_key = %d allows",
			key, len(*own), side, s.maxPerKey))
	}
	k.Seq++
	e := joinEvent{At: at.UnixMilli(), Seq: k.Seq, Payload: payload}
	for i := range other {
		o := &other[i]
		l, r := &e, o
		if side == joinRight {
			l, r = o, &e
		}
		if r.At < l.At-s.before || r.At > l.At+s.after {
			continue
		}
		result, err := s.result(key, l, r)
		if err != nil {
			return out, err
		}
		out = append(out, result)
		e.Matched, o.Matched = true, true
	}
	i := sort.Search(len(*own), func(i int) bool { return e.before((*own)[i]) })
	*own = append((*own)[:i], append([]joinEvent{e}, (*own)[i:]...)...)
	return out, s.save(ctx, st, key, k)
}

// OnTimer forgets a key's events that no event still to come could match (every event to come is
// at or after the watermark less grace), emitting those of them that matched nothing where the
// join's type says so, in event-time order.
func (s *joinStage) OnTimer(ctx context.Context, st State, name string, _ time.Time, out []Output) ([]Output, error) {
	key, ok := strings.CutPrefix(name, joinKeyTimerPrefix)
	if !ok {
		return out, nil
	}
	k, found, err := loadKey[joinKey](ctx, st, key)
	if err != nil || !found {
		return out, err
	}
	watermark, err := st.Watermark(ctx)
	if err != nil {
		return out, err
	}
	wm := watermark.UnixMilli()
	var alone []joinRow
	k.Left, alone = s.expire(k.Left, s.after, wm, s.typ != joinInner, alone, true)
	k.Right, alone = s.expire(k.Right, s.before, wm, s.typ == joinOuter, alone, false)
	sort.SliceStable(alone, func(i, j int) bool { return alone[i].event.before(alone[j].event) })
	for _, a := range alone {
		l, r := &a.event, (*joinEvent)(nil)
		if !a.left {
			l, r = nil, &a.event
		}
		result, err := s.result(key, l, r)
		if err != nil {
			return out, err
		}
		out = append(out, result)
	}
	if len(k.Left) == 0 && len(k.Right) == 0 {
		if err := st.Delete(ctx, key); err != nil {
			return out, err
		}
		return out, s.keys.release(ctx, st)
	}
	return out, s.save(ctx, st, key, k)
}

// joinRow is an event that leaves the state unmatched, to be emitted alone.
type joinRow struct {
	event joinEvent
	left  bool
}

// expire drops the events whose span (span after them, plus grace) the watermark has passed,
// appending those that matched nothing to alone when emit says they are emitted.
func (s *joinStage) expire(events []joinEvent, span, wm int64, emit bool, alone []joinRow, left bool) ([]joinEvent, []joinRow) {
	kept := events[:0]
	for _, e := range events {
		if e.At+span+s.grace >= wm {
			kept = append(kept, e)
			continue
		}
		if emit && !e.Matched {
			alone = append(alone, joinRow{event: e, left: left})
		}
	}
	return kept, alone
}

// result is the output of a match, or of an event alone (the other nil): select over the two
// events, keyed by the key, at the later of their event times.
func (s *joinStage) result(key string, l, r *joinEvent) (Output, error) {
	vars := map[string]any{joinLeft: nil, joinRight: nil}
	var at int64
	for name, e := range map[string]*joinEvent{joinLeft: l, joinRight: r} {
		if e == nil {
			continue
		}
		m := NewMessage(key, e.Payload, nil)
		if err := m.Decode(); err != nil {
			return Output{}, err
		}
		vars[name] = m.Value
		at = max(at, e.At)
	}
	var v map[string]any
	if len(s.selects) == 0 {
		v = vars
	} else {
		env := &expr.Env{Vars: vars}
		v = make(map[string]any, len(s.selects))
		for _, f := range s.selects {
			x, err := f.Expr.Eval(env)
			if err != nil {
				return Output{}, evalError(err)
			}
			v[f.Name] = x.Interface()
		}
	}
	return Output{Topic: s.out, Message: Message{Key: key, Value: v,
		Headers: map[string]string{EventTimeHeader: strconv.FormatInt(at, 10)}}}, nil
}

// OutputWatermark is the earliest event time of a result the stage emits after its input's
// watermark reached watermark (stages.OutputWatermarker): a match carries the later of its events'
// times, and an event still to come is at or after the watermark less grace; an event emitted
// alone carries its own time, at most its span before the watermark less grace.
func (s *joinStage) OutputWatermark(watermark time.Time) time.Time {
	span := int64(0)
	switch s.typ {
	case joinLeft:
		span = s.after
	case joinOuter:
		span = max(s.after, s.before)
	}
	return watermark.Add(-time.Duration(s.grace+span) * time.Millisecond)
}

// StateKeys names what Process reads for m (StatePrefetcher): its key's state and the count of keys.
func (s *joinStage) StateKeys(m *Message, keys []string) []string {
	return append(keys, m.Key, KeyCountKey)
}

// TimerStateKeys names what OnTimer reads for a timer (TimerStatePrefetcher): its key's state and
// the count of keys.
func (s *joinStage) TimerStateKeys(timer string, keys []string) []string {
	if key, ok := strings.CutPrefix(timer, joinKeyTimerPrefix); ok {
		return append(keys, key, KeyCountKey)
	}
	return keys
}

// save writes a key's state and its timer: when the watermark will have passed the span of its
// first event that may be forgotten.
func (s *joinStage) save(ctx context.Context, st State, key string, k *joinKey) error {
	raw, err := json.Marshal(k)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, key, raw); err != nil {
		return err
	}
	due := int64(-1)
	for _, side := range []struct {
		events []joinEvent
		span   int64
	}{{k.Left, s.after}, {k.Right, s.before}} {
		for _, e := range side.events {
			if at := e.At + side.span + s.grace + 1; due < 0 || at < due {
				due = at
			}
		}
	}
	return st.SetTimer(ctx, joinKeyTimerPrefix+key, time.UnixMilli(due))
}
