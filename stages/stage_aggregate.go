package stages

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
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
			Results:  true,
			Doc: "Folds the messages of each group (group_by) into windows of event time and emits, per group and " +
				"window, the aggregate fields with key (the group) and window = { start, end } (RFC 3339, UTC); a result's " +
				"event time is its window's start. Windows " +
				"are half-open [start, end): tumbling and hopping ones aligned to the Unix epoch, a session from a " +
				"group's first event to gap after its last. A window closes when the partition's " +
				"watermark passes its end plus grace; an event for a closed window " +
				"is late for it. A group's messages must share a partition: where the input topic is keyed otherwise, the stage reads a " +
				"repartition topic keyed by the group (<stage>.by_key).",
			Attributes: []flow.Attribute{
				{
					Name: "group_by", Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg"}, Deterministic: true,
					Doc: "The group a message counts in, such as group_by = msg.customer_id; a constant, such as group_by = \"all\", " +
						"counts every message in one group.",
				},
				{
					Name: "event_time", Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the time the message's entry was written",
					Doc: "The message's event time: an RFC 3339 string, or Unix milliseconds.",
				},
				{Name: "grace", Type: flow.TypeDuration, Default: time.Duration(0), Doc: "How far behind the watermark an event may be and still count, in event time: a window closes once the watermark passes its end plus grace."},
				{
					Name: "late", Type: flow.TypeTopicOrChoice, Enum: []string{"drop", "dead_letter"}, Default: "dead_letter",
					Doc: `What happens to an event for a window that has closed: "drop" (counted as dropped), "dead_letter", or topic.NAME. ` +
						`An event that is late for some of its windows (hopping) counts in the others, and goes where late says for those.`,
				},
				{
					Name: "idle_timeout", Type: flow.TypeDuration, Default: time.Minute,
					Doc: "A writer of the stage's input (a source, or a stage before it) that has had nothing to write for this long, with nothing pending " +
						"and no retry waiting, moves its watermark on by the time that passes on the clock, so that the last windows close; " +
						"the shortest idle_timeout of the stateful stages a writer feeds is its own; \"0s\": only events move it.",
				},
				{
					Name: "emit", Type: flow.TypeString, Enum: []string{"on_close", "on_update"}, Default: "on_close",
					Doc: "on_close emits a window's result once, when it closes; on_update emits its current value after each batch that changed it, and again when it closes. " +
						"When an event merges sessions, on_update emits the merged session (whose start is the earliest's), and the sessions merged into it emit nothing more.",
				},
				{
					Name: "aggregate", Type: flow.TypeAggregates, Required: true, Roots: []string{"msg"}, Deterministic: true,
					Doc: "The fields of the result: count(), sum(x), min(x), max(x), avg(x), count_distinct(x), top_k(x, k) " +
						"(the k most frequent values, most frequent first), first(x) and last(x) (by event time).",
				},
				maxKeysAttribute("groups with open windows", "A group counts until its last window's timer fires, at the end of the batch whose watermark closed it."),
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
		NewStateful: func(s *flow.Stage, env Env) (StatefulProcessor, error) {
			w := s.Config.Blocks("window")[0]
			a := &aggregateStage{
				out: s.Output, groupBy: s.Config.Expr("group_by"), eventTime: s.Config.Expr("event_time"),
				size: w.Duration("size"), advance: w.Duration("advance"), grace: s.Config.Duration("grace"),
				session: w.String("type") == "session", gap: w.Duration("gap"),
				onUpdate:    s.Config.String("emit") == "on_update",
				idleTimeout: s.Config.Duration("idle_timeout"), keys: newKeyLimit(s),
			}
			for _, f := range s.Config.Aggregates("aggregate") {
				fn, ok := aggregateFunctions[f.Func]
				if !ok {
					return nil, fmt.Errorf("stage %s: %s has no aggregate function %q", s.Name, f.Name, f.Func)
				}
				a.fields = append(a.fields, aggregateField{Aggregate: f, fn: fn})
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
		{
			Name: "type", Type: flow.TypeString, Required: true, Enum: []string{"tumbling", "hopping", "session"},
			Doc: "tumbling: windows of size, one after another; hopping: windows of size that start every advance, and overlap; " +
				"session: a window per group from its first event to gap after its last, which each event less than gap away extends.",
		},
		{Name: "size", Type: flow.TypeDuration, DefaultDoc: "none: tumbling and hopping windows need one", Doc: "How long a tumbling or hopping window is."},
		{Name: "advance", Type: flow.TypeDuration, DefaultDoc: "size", Doc: "How far apart hopping windows start."},
		{
			Name: "gap", Type: flow.TypeDuration, DefaultDoc: "none: session windows need one",
			Doc: "How long a session lasts past its last event: an event less than gap after its last event (or before its first) " +
				"joins it, and an event less than gap away from two sessions merges them.",
		},
	},
}

// checkWindow checks the window's durations fit its type, at the attribute that does not.
func checkWindow(c *flow.KindCheck) {
	blocks := c.Config.Blocks("window")
	if len(blocks) != 1 {
		return
	}
	w := blocks[0]
	typ := w.String("type")
	invalid := func(attribute, detail string) { c.BlockErrorf("window", attribute, "Invalid window", "%s", detail) }
	if typ == "session" {
		switch {
		case w.Has("size"):
			invalid("size", "A session window has no size: it lasts from its group's first event to gap after its last.")
		case w.Has("advance"):
			invalid("advance", "A session window has no advance: an event extends the session it joins.")
		case !w.Has("gap"):
			invalid("gap", `A session window needs a gap, such as "5m": how long a session lasts past its last event.`)
		case w.Duration("gap") < time.Millisecond:
			invalid("gap", "The session's gap must be at least 1ms.")
		}
		return
	}
	size, advance := w.Duration("size"), w.Duration("advance")
	switch {
	case w.Has("gap"):
		invalid("gap", "Only a session window has a gap; a "+typ+" window has a size.")
	case !w.Has("size"):
		invalid("size", "A "+typ+` window needs a size, such as "1m".`)
	case size < time.Millisecond:
		invalid("size", "The window's size must be at least 1ms.")
	case typ == "hopping" && (advance <= 0 || advance > size):
		invalid("advance", "A hopping window needs an advance greater than 0 and no greater than its size.")
	case typ == "hopping" && size%advance != 0:
		invalid("advance", "A hopping window's size must be a whole number of advances.")
	case typ == "tumbling" && advance != 0 && advance != size:
		invalid("advance", "A tumbling window has no advance: its windows follow one another.")
	}
}

type aggregateStage struct {
	out           *flow.Topic
	groupBy       *expr.Program
	eventTime     *expr.Program // nil: the entry's time
	size, advance time.Duration // tumbling and hopping windows
	session       bool
	gap           time.Duration // session windows
	grace         time.Duration
	late          string      // "drop" or "dead_letter" when lateTopic is nil
	lateTopic     *flow.Topic // where late events go, if a topic
	onUpdate      bool
	idleTimeout   time.Duration
	fields        []aggregateField
	keys          keyLimit // max_keys: groups with open windows
	decoded       windowCache
}

// IdleTimeout makes an idle partition's watermark move with the clock (stages.IdleAdvancer).
func (s *aggregateStage) IdleTimeout() time.Duration { return s.idleTimeout }

// The state of a group is an index of its open windows (groupPrefix and the group: a groupState),
// which exists while the group has an open window and is what max_keys counts, and each window's
// accumulators (windowPrefix and windowKey: a windowState). A window's id is its start for tumbling
// and hopping windows, which are aligned and so never share one; a session's start moves as events
// join it, so the index numbers the group's sessions instead. A window's timers are named by its
// key: windowPrefix closes it, updatePrefix emits its value after a batch (emit = "on_update").
const windowPrefix, updatePrefix, groupPrefix, forgetPrefix = "w:", "u:", "g:", "c:"

func windowKey(group string, id int64) string {
	return group + "\x00" + strconv.FormatInt(id, 10)
}

func (s *aggregateStage) Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error) {
	group, err := s.groupOf(m)
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
	a := &adding{st: st, group: group, at: at.UnixMilli(), watermark: watermark.UnixMilli(), values: values}
	if s.session {
		err = s.addToSession(ctx, a)
	} else {
		err = s.addToWindows(ctx, a)
	}
	if err != nil || len(a.late) == 0 {
		return out, err
	}
	st.Record(Late) // routed, dropped or dead-lettered, it counts as late
	reason := s.lateError(at, watermark, a)
	switch {
	case s.lateTopic != nil:
		return append(out, Output{Topic: s.lateTopic, Message: *m}), nil
	case s.late == "drop":
		return out, nil
	case a.added:
		// Counted in its other windows: the attempt succeeds, and the message is dead-lettered
		// for these.
		return append(out, Output{Message: *m, DeadLetter: reason.Error()}), nil
	}
	return out, Permanent(reason) // counted as dead-lettered, with the reason "late: ..."
}

// adding is one message on its way into its group's windows.
type adding struct {
	st        State
	group     string
	at        int64 // its event time, Unix ms
	watermark int64
	values    []any        // the aggregate fields' arguments
	added     bool         // it counts in at least one window
	late      []openWindow // the windows it is late for; for a session, the one it would have made
}

// groupOf is the group m counts in: group_by's value.
func (s *aggregateStage) groupOf(m *Message) (string, error) {
	if err := m.Decode(); err != nil {
		return "", err
	}
	group, err := s.groupBy.EvalString(&expr.Env{Msg: m.Value})
	if err != nil {
		return "", evalError(err)
	}
	return group, nil
}

// StateKeys names what Process reads for m, so that the runtime reads a batch's keys at once
// (StatePrefetcher): the group's index, the count of groups and, for tumbling and hopping windows,
// the windows that hold its event time (a session's are found through the index).
func (s *aggregateStage) StateKeys(m *Message, keys []string) []string {
	group, err := s.groupOf(m)
	if err != nil {
		return keys // Process reports it
	}
	keys = append(keys, groupPrefix+group, KeyCountKey)
	if s.session {
		return keys
	}
	at, err := EventTime(s.eventTime, m)
	if err != nil {
		return keys
	}
	ms, size, advance := at.UnixMilli(), s.size.Milliseconds(), s.advance.Milliseconds()
	for start := floorDiv(ms, advance) * advance; start > ms-size; start -= advance {
		keys = append(keys, windowPrefix+windowKey(group, start))
	}
	return keys
}

// lateError says why a message is late: the windows it is late for, and the watermark.
func (s *aggregateStage) lateError(at, watermark time.Time, a *adding) error {
	t, wm := at.UTC().Format(time.RFC3339Nano), watermark.UTC().Format(time.RFC3339Nano)
	if s.session {
		return fmt.Errorf("late: its event time %s is before the end of a session of its group that closed, or its own session, "+
			"gap (%s) long, would have closed more than grace (%s) before the watermark %s", t, s.gap, s.grace, wm)
	}
	windows := make([]string, len(a.late))
	for i, w := range a.late {
		windows[i] = fmt.Sprintf("[%s, %s)", time.UnixMilli(w.Start).UTC().Format(time.RFC3339Nano), time.UnixMilli(w.End).UTC().Format(time.RFC3339Nano))
	}
	what := "its window " + windows[0]
	if len(windows) > 1 {
		what = "its windows " + strings.Join(windows, ", ")
	}
	if a.added {
		what += " (it counts in its others)"
	}
	return fmt.Errorf("late: its event time %s is in %s, which closed at the watermark %s: more than grace (%s) past the end", t, what, wm, s.grace)
}

// addToWindows folds one message into the tumbling or hopping windows of its group that hold its
// event time and have not closed, and lists those that have in a.late.
func (s *aggregateStage) addToWindows(ctx context.Context, a *adding) error {
	size, advance, grace := s.size.Milliseconds(), s.advance.Milliseconds(), s.grace.Milliseconds()
	// The windows that hold at start at multiples of advance, from the latest at or before it back
	// to the one that ends just after it. A window is closed once end + grace is at or before the
	// watermark: the batch that moved the watermark there fires its timer, after its messages, and
	// the answer must not depend on where batches end.
	for start := floorDiv(a.at, advance) * advance; start > a.at-size; start -= advance {
		end := start + size
		if end+grace <= a.watermark {
			a.late = append(a.late, openWindow{ID: start, Start: start, End: end})
			continue
		}
		key := windowKey(a.group, start)
		w, err := s.load(ctx, a.st, key)
		if err != nil {
			return err
		}
		if w == nil {
			g, err := s.loadGroup(ctx, a.st, a.group)
			if err != nil {
				return err
			}
			if g, err = s.admit(ctx, a.st, g); err != nil {
				return err
			}
			g.Windows = append(g.Windows, openWindow{ID: start, Start: start, End: end})
			if err := s.putGroup(ctx, a.st, a.group, g); err != nil {
				return err
			}
			w = s.newWindow(a.group, start, end)
		}
		if err := s.fold(ctx, a.st, key, w, a.values, a.at); err != nil {
			return err
		}
		a.added = true
	}
	slices.Reverse(a.late) // earliest first
	return nil
}

// addToSession folds one message into its group's sessions: into the open sessions it is less than
// gap away from (merged into the earliest, when it bridges several), or into a new one.
//
// It is late when it falls before the end of a session of its group that has closed (its end plus
// grace at or before the watermark), which has emitted its result or is about to: joining it would
// give a second, overlapping result. The group's index remembers how far its closed sessions reach
// (ClosedUntil) until no event that could reach them would be on time any more. It is late too when
// it joins no open session and its own would have closed already.
func (s *aggregateStage) addToSession(ctx context.Context, a *adding) error {
	gap, grace := s.gap.Milliseconds(), s.grace.Milliseconds()
	g, err := s.loadGroup(ctx, a.st, a.group)
	if err != nil {
		return err
	}
	// The message's own session would be [at, at+gap): it joins the open sessions that overlap it.
	// A session whose end is grace past the watermark has closed, although its timer fires only
	// after this batch's messages: the answer must not depend on where batches end.
	var joins, others []openWindow
	var closedUntil int64
	if g != nil {
		closedUntil = g.ClosedUntil
		for _, o := range g.Windows {
			switch {
			case o.End+grace <= a.watermark:
				closedUntil = max(closedUntil, o.End)
				others = append(others, o)
			case o.Start < a.at+gap && a.at < o.End:
				joins = append(joins, o)
			default:
				others = append(others, o)
			}
		}
	}
	if a.at < closedUntil || len(joins) == 0 && a.at+gap+grace <= a.watermark {
		a.late = []openWindow{{Start: a.at, End: a.at + gap}}
		return nil
	}
	var id int64
	var w *windowState
	if len(joins) == 0 {
		if g, err = s.admit(ctx, a.st, g); err != nil {
			return err
		}
		id, g.Next = g.Next, g.Next+1
		w = s.newWindow(a.group, a.at, a.at+gap)
	} else {
		// The earliest session takes the others in; they are forgotten with their timers and
		// holds, so that they emit nothing of their own.
		id = joins[0].ID
		if w, err = s.loadSession(ctx, a.st, a.group, id); err != nil {
			return err
		}
		for _, o := range joins[1:] {
			other, err := s.loadSession(ctx, a.st, a.group, o.ID)
			if err != nil {
				return err
			}
			w.merge(other, s.fields)
			if err := s.forgetWindow(ctx, a.st, windowKey(a.group, o.ID)); err != nil {
				return err
			}
		}
		w.Start, w.End = min(w.Start, a.at), max(w.End, a.at+gap)
	}
	key := windowKey(a.group, id)
	if err := s.fold(ctx, a.st, key, w, a.values, a.at); err != nil {
		return err
	}
	// Its result will carry its start, which may lie before what OutputWatermark says of later
	// results: hold the watermark the stage passes on there until it closes.
	if err := a.st.Hold(ctx, windowPrefix+key, time.UnixMilli(w.Start)); err != nil {
		return err
	}
	g.Windows = append(others, openWindow{ID: id, Start: w.Start, End: w.End})
	a.added = true
	return s.putGroup(ctx, a.st, a.group, g)
}

// OutputWatermark is the earliest start a result of a window can have that the stage emits after
// its input's watermark reached watermark (stages.OutputWatermarker): a tumbling or hopping window
// that has not closed ends more than grace before the watermark, and so starts after the
// watermark less grace and its size; a session that starts later starts after the watermark less
// gap and grace, and the open ones hold the watermark at their starts (addToSession).
func (s *aggregateStage) OutputWatermark(watermark time.Time) time.Time {
	if s.session {
		return watermark.Add(-s.gap - s.grace)
	}
	return watermark.Add(-s.grace - s.size)
}

func (s *aggregateStage) newWindow(group string, start, end int64) *windowState {
	return &windowState{Group: group, Start: start, End: end, Fields: make([]accumulator, len(s.fields))}
}

// fold adds one message's values to a window and writes it, with its timers: the one that closes it,
// at its end plus grace (moved when a session's end moves), and, with emit = "on_update", one that
// emits its value after this batch.
func (s *aggregateStage) fold(ctx context.Context, st State, key string, w *windowState, values []any, at int64) error {
	for i, f := range s.fields {
		w.Fields[i].add(f.fn, values[i], at)
	}
	b, err := json.Marshal(w)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, windowPrefix+key, b); err != nil {
		return err
	}
	s.decoded.keep(st.Partition(), key, b, w)
	if err := st.SetTimer(ctx, windowPrefix+key, time.UnixMilli(w.End+s.grace.Milliseconds())); err != nil {
		return err
	}
	if s.onUpdate {
		// Due at once: timers fire after the batch's messages, so this emits once per batch.
		return st.SetTimer(ctx, updatePrefix+key, time.UnixMilli(at))
	}
	return nil
}

func (s *aggregateStage) load(ctx context.Context, st State, key string) (*windowState, error) {
	b, found, err := st.Get(ctx, windowPrefix+key)
	if err != nil || !found {
		return nil, err
	}
	if w := s.decoded.take(st.Partition(), key, b); w != nil {
		return w, nil
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

// loadSession reads a session that its group's index lists.
func (s *aggregateStage) loadSession(ctx context.Context, st State, group string, id int64) (*windowState, error) {
	key := windowKey(group, id)
	w, err := s.load(ctx, st, key)
	if err == nil && w == nil {
		err = Permanent(fmt.Errorf("the state of session %q, which its group's index lists, is missing", key))
	}
	return w, err
}

// forgetWindow deletes a window's state and cancels its timers and hold.
func (s *aggregateStage) forgetWindow(ctx context.Context, st State, key string) error {
	if err := st.Delete(ctx, windowPrefix+key); err != nil {
		return err
	}
	if err := st.CancelTimer(ctx, windowPrefix+key); err != nil {
		return err
	}
	if s.session {
		if err := st.Release(ctx, windowPrefix+key); err != nil {
			return err
		}
	}
	return st.CancelTimer(ctx, updatePrefix+key)
}

// loadGroup reads a group's index of its open windows; nil when it has none.
func (s *aggregateStage) loadGroup(ctx context.Context, st State, group string) (*groupState, error) {
	b, found, err := st.Get(ctx, groupPrefix+group)
	if err != nil || !found {
		return nil, err
	}
	var g groupState
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, Permanent(fmt.Errorf("the state of group %q cannot be read: %w", group, err))
	}
	return &g, nil
}

// admit returns a group's index, counting the group in (max_keys) when it has none yet.
func (s *aggregateStage) admit(ctx context.Context, st State, g *groupState) (*groupState, error) {
	if g != nil && len(g.Windows) > 0 {
		return g, nil
	}
	if err := s.keys.admit(ctx, st); err != nil {
		return nil, err
	}
	if g == nil {
		g = &groupState{}
	}
	return g, nil
}

// putGroup writes a group's index, its windows by start; once it has none, it deletes it and counts
// the group out.
func (s *aggregateStage) putGroup(ctx context.Context, st State, group string, g *groupState) error {
	if len(g.Windows) == 0 {
		// Its last window closed: it counts out. A session's index stays while its closed sessions
		// may still be reached (ClosedUntil), until the timer that forgets it.
		if err := s.keys.release(ctx, st); err != nil {
			return err
		}
		if g.ClosedUntil == 0 {
			return st.Delete(ctx, groupPrefix+group)
		}
		if err := st.SetTimer(ctx, forgetPrefix+group, time.UnixMilli(g.ClosedUntil+s.gap.Milliseconds()+s.grace.Milliseconds())); err != nil {
			return err
		}
	}
	slices.SortFunc(g.Windows, func(a, b openWindow) int { return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.ID, b.ID)) })
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	return st.Put(ctx, groupPrefix+group, b)
}

// OnTimer emits a window's result: when it closes, and then forgets it; or, with emit = "on_update",
// after a batch that changed it.
func (s *aggregateStage) OnTimer(ctx context.Context, st State, name string, _ time.Time, out []Output) ([]Output, error) {
	if group, ok := strings.CutPrefix(name, forgetPrefix); ok {
		return out, s.forgetClosed(ctx, st, group)
	}
	closing := strings.HasPrefix(name, windowPrefix)
	key, ok := strings.CutPrefix(name, windowPrefix)
	if !closing {
		if key, ok = strings.CutPrefix(name, updatePrefix); !ok {
			return out, nil
		}
	}
	w, err := s.load(ctx, st, key)
	if err != nil || w == nil {
		return out, err
	}
	out = append(out, Output{Topic: s.out, Message: Message{Key: w.Group, Value: s.result(w),
		Headers: map[string]string{EventTimeHeader: strconv.FormatInt(w.Start, 10)}}})
	if !closing {
		return out, nil
	}
	if err := s.forgetWindow(ctx, st, key); err != nil {
		return out, err
	}
	g, err := s.loadGroup(ctx, st, w.Group)
	if err != nil || g == nil {
		return out, err // nil: a window written before groups had an index
	}
	g.Windows = slices.DeleteFunc(g.Windows, func(o openWindow) bool { return windowKey(w.Group, o.ID) == key })
	if s.session {
		g.ClosedUntil = max(g.ClosedUntil, w.End)
	}
	return out, s.putGroup(ctx, st, w.Group, g)
}

// forgetClosed forgets how far a group's closed sessions reached, once no event that reaches them
// can be on time (its own session would have closed): the index goes if it has no open session.
func (s *aggregateStage) forgetClosed(ctx context.Context, st State, group string) error {
	g, err := s.loadGroup(ctx, st, group)
	if err != nil || g == nil {
		return err
	}
	if len(g.Windows) == 0 {
		return st.Delete(ctx, groupPrefix+group)
	}
	g.ClosedUntil = 0
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	return st.Put(ctx, groupPrefix+group, b)
}

// result is a window's output payload.
func (s *aggregateStage) result(w *windowState) map[string]any {
	v := make(map[string]any, len(s.fields)+2)
	for i, f := range s.fields {
		v[f.Name] = f.fn.value(&w.Fields[i], f.Aggregate)
	}
	v["key"] = w.Group
	v["window"] = map[string]any{
		"start": time.UnixMilli(w.Start).UTC().Format(time.RFC3339Nano),
		"end":   time.UnixMilli(w.End).UTC().Format(time.RFC3339Nano),
	}
	return v
}

// windowCache keeps the windows that the stage encoded last, each with the bytes it wrote, so that
// the next message of a window whose state still holds those bytes takes the window as it is
// instead of decoding its JSON again: a window is decoded once per process, not once per message.
// The bytes are compared, so the cache cannot be out of date, whatever the state went through (a
// failed attempt, another process); a window taken out is the taker's to change, and is kept again
// only once written.
type windowCache struct {
	mu      sync.Mutex
	windows map[windowCacheKey]cachedWindow
}

type windowCacheKey struct {
	partition int
	key       string
}

type cachedWindow struct {
	raw []byte
	w   *windowState
}

// maxCachedWindows bounds the cache; past it, it starts again empty.
const maxCachedWindows = 1 << 16

// take returns the window that raw encodes, if the cache has it, and forgets it.
func (c *windowCache) take(partition int, key string, raw []byte) *windowState {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := windowCacheKey{partition, key}
	cw, ok := c.windows[k]
	if !ok {
		return nil
	}
	delete(c.windows, k)
	if !bytes.Equal(cw.raw, raw) {
		return nil
	}
	return cw.w
}

// keep remembers the window w that raw encodes, as written to the state.
func (c *windowCache) keep(partition int, key string, raw []byte, w *windowState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.windows == nil || len(c.windows) >= maxCachedWindows {
		c.windows = make(map[windowCacheKey]cachedWindow)
	}
	c.windows[windowCacheKey{partition, key}] = cachedWindow{raw: raw, w: w}
}

// windowState is a window's accumulators, as its state holds them (JSON).
type windowState struct {
	Group  string        `json:"g"`
	Start  int64         `json:"s"`
	End    int64         `json:"e"`
	Fields []accumulator `json:"f"`
}

// merge folds another window of the group in: a session that an event joined to this one.
func (w *windowState) merge(o *windowState, fields []aggregateField) {
	w.Start, w.End = min(w.Start, o.Start), max(w.End, o.End)
	for i, f := range fields {
		f.fn.merge(&w.Fields[i], &o.Fields[i])
	}
}

// groupState is a group's index of its open windows, by start. Next numbers its sessions.
type groupState struct {
	Next    int64        `json:"n,omitempty"`
	Windows []openWindow `json:"w"`
	// ClosedUntil is the latest end of the group's sessions that have closed, while an event that
	// falls before it could still be on time otherwise; 0 for tumbling and hopping windows.
	ClosedUntil int64 `json:"c,omitempty"`
}

// openWindow is a window in its group's index: the id in its state key and timers, and its bounds.
type openWindow struct {
	ID    int64 `json:"i"`
	Start int64 `json:"s"`
	End   int64 `json:"e"`
}

// floorDiv divides rounding towards negative infinity, so that windows align before 1970 too.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
