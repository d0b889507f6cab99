package stages

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The aggregate stage's attributes and blocks, and the values of late and emit.
const (
	aggregateFieldGroupBy   = "group_by"
	aggregateFieldGrace     = "grace"
	aggregateFieldLate      = "late"
	aggregateFieldEmit      = "emit"
	aggregateFieldAggregate = "aggregate"
	aggregateBlockWindow    = "window"

	aggregateLateDrop       = "drop"
	aggregateLateDeadLetter = "dead_letter"
	aggregateEmitOnClose    = "on_close"
	aggregateEmitOnUpdate   = "on_update"
)

// The attributes of an aggregate's window block, and the types of windows.
const (
	windowFieldType    = "type"
	windowFieldSize    = "size"
	windowFieldAdvance = "advance"
	windowFieldGap     = "gap"

	windowTumbling = "tumbling"
	windowHopping  = "hopping"
	windowSession  = "session"
)

// The aggregate stage folds the messages of each group into windows of event time and emits one
// message per group and window when the window closes (or after every batch that changed it). A
// window's accumulators are state of the input partition; the result is written, and the state
// deleted, in the commit of the batch whose watermark closed the window: both or neither.
func init() {
	// Inline: it computes on the state that the runtime read ahead for the batch (StateKeys), so its
	// attempts need no timer of their own.
	RegisterStage(StageKind{Spec: aggregateSpec, Traits: StageTraits{Stateful: true, Inline: true}, NewStateful: newAggregateStage})
}

// aggregateSpec is the aggregate kind in the language.
var aggregateSpec = &flow.Kind{
	Name:     "aggregate",
	StateKey: aggregateFieldGroupBy,
	// What a window's accumulators mean: the windows, and what is folded into them.
	StateShape: []string{aggregateBlockWindow, aggregateFieldAggregate},
	Results:    true,
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
			Name: aggregateFieldGroupBy, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg"}, Deterministic: true,
			Doc: "The group a message counts in, such as group_by = msg.customer_id; a constant, such as group_by = \"all\", " +
				"counts every message in one group.",
		},
		{
			Name: flow.EventTimeAttribute, Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true, DefaultDoc: "the time the message's entry was written",
			Doc: "The message's event time: an RFC 3339 string, or Unix milliseconds.",
		},
		{Name: aggregateFieldGrace, Type: flow.TypeDuration, Default: time.Duration(0), Doc: "How far behind the watermark an event may be and still count, in event time: a window closes once the watermark passes its end plus grace."},
		{
			Name: aggregateFieldLate, Type: flow.TypeTopicOrChoice, Enum: []string{aggregateLateDrop, aggregateLateDeadLetter}, Default: aggregateLateDeadLetter,
			Doc: `What happens to an event for a window that has closed: "drop" (counted as dropped), "dead_letter", or topic.NAME. ` +
				`An event that is late for some of its windows (hopping) counts in the others, and goes where late says for those.`,
		},
		{
			Name: flow.IdleTimeoutAttribute, Type: flow.TypeDuration, Default: time.Minute,
			Doc: "A writer of the stage's input (a source, or a stage before it) that has had nothing to write for this long, with nothing pending " +
				"and no retry waiting, moves its watermark on by the time that passes on the clock, so that the last windows close; " +
				"the shortest idle_timeout of the stateful stages a writer feeds is its own; \"0s\": only events move it.",
		},
		{
			Name: aggregateFieldEmit, Type: flow.TypeString, Enum: []string{aggregateEmitOnClose, aggregateEmitOnUpdate}, Default: aggregateEmitOnClose,
			Doc: "on_close emits a window's result once, when it closes; on_update emits its current value after each batch that changed it, and again when it closes. " +
				"When an event merges sessions, on_update emits the merged session (whose start is the earliest's), and the sessions merged into it emit nothing more.",
		},
		{
			Name: aggregateFieldAggregate, Type: flow.TypeAggregates, Required: true, Roots: []string{"msg"}, Deterministic: true,
			Doc: "The fields of the result: count(), sum(x), min(x), max(x), avg(x), count_distinct(x), top_k(x, k) " +
				"(the k most frequent values, most frequent first), first(x) and last(x) (by event time), " +
				"max_by(x, by) and min_by(x, by) (x of the message with the largest or smallest by; " +
				"on a tie in by, the largest or smallest x; a message whose by is null does not count).",
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
}

// newAggregateStage builds an aggregate stage, which fires its timers at a job's end, to close its
// windows, and passes on results of its own.
func newAggregateStage(s *flow.Stage, _ Env) (StatefulStage, error) {
	w := s.Config.Blocks(aggregateBlockWindow)[0]
	a := &aggregateStage{
		out: s.Output, groupBy: s.Config.Expr(aggregateFieldGroupBy), eventTime: flow.EventTimeOf(s),
		size: w.Duration(windowFieldSize), advance: w.Duration(windowFieldAdvance), grace: s.Config.Duration(aggregateFieldGrace),
		session: w.String(windowFieldType) == windowSession, gap: w.Duration(windowFieldGap),
		onUpdate: s.Config.String(aggregateFieldEmit) == aggregateEmitOnUpdate, keys: newKeyLimit(s),
	}
	for _, f := range s.Config.Aggregates(aggregateFieldAggregate) {
		fn, ok := aggregateFunctions[f.Func]
		if !ok {
			return StatefulStage{}, fmt.Errorf("stage %s: %s has no aggregate function %q", s.Name, f.Name, f.Func)
		}
		a.fields = append(a.fields, aggregateField{Aggregate: f, fn: fn})
	}
	if a.advance == 0 {
		a.advance = a.size // tumbling
	}
	if !slices.ContainsFunc(a.fields, func(f aggregateField) bool { return f.Arg != nil }) {
		a.noArguments = make([]any, len(a.fields))
	}
	exprs := []*expr.Program{a.groupBy, a.eventTime}
	for _, f := range a.fields {
		exprs = append(exprs, f.Arg, f.By)
	}
	a.reads = fieldsRead(exprs...)
	a.lateTopic, a.late = s.Config.TopicOrChoice(aggregateFieldLate)
	return StatefulStage{Processor: a, TimerHandler: a, FireAtEnd: true, StatePrefetcher: a, OutputWatermarker: a}, nil
}

// windowSpec is the aggregate's window block: what windows its groups are folded into.
var windowSpec = &flow.BlockSpec{
	Type: aggregateBlockWindow,
	Doc:  "The windows of an aggregate stage.",
	Attributes: []flow.Attribute{
		{
			Name: windowFieldType, Type: flow.TypeString, Required: true, Enum: []string{windowTumbling, windowHopping, windowSession},
			Doc: "tumbling: windows of size, one after another; hopping: windows of size that start every advance, and overlap; " +
				"session: a window per group from its first event to gap after its last, which each event less than gap away extends.",
		},
		{Name: windowFieldSize, Type: flow.TypeDuration, DefaultDoc: "none: tumbling and hopping windows need one", Doc: "How long a tumbling or hopping window is."},
		{Name: windowFieldAdvance, Type: flow.TypeDuration, DefaultDoc: "size", Doc: "How far apart hopping windows start."},
		{
			Name: windowFieldGap, Type: flow.TypeDuration, DefaultDoc: "none: session windows need one",
			Doc: "How long a session lasts past its last event: an event less than gap after its last event (or before its first) " +
				"joins it, and an event less than gap away from two sessions merges them.",
		},
	},
}

// checkWindow checks the window's durations fit its type, at the attribute that does not.
func checkWindow(c *flow.KindCheck) {
	blocks := c.Config.Blocks(aggregateBlockWindow)
	if len(blocks) != 1 {
		return
	}
	w := blocks[0]
	typ := w.String(windowFieldType)
	invalid := func(attribute, detail string) {
		c.BlockErrorf(aggregateBlockWindow, attribute, "Invalid window", "%s", detail)
	}
	if typ == windowSession {
		switch {
		case w.Has(windowFieldSize):
			invalid(windowFieldSize, "A session window has no size: it lasts from its group's first event to gap after its last.")
		case w.Has(windowFieldAdvance):
			invalid(windowFieldAdvance, "A session window has no advance: an event extends the session it joins.")
		case !w.Has(windowFieldGap):
			invalid(windowFieldGap, `A session window needs a gap, such as "5m": how long a session lasts past its last event.`)
		case w.Duration(windowFieldGap) < time.Millisecond:
			invalid(windowFieldGap, "The session's gap must be at least 1ms.")
		}
		return
	}
	size, advance := w.Duration(windowFieldSize), w.Duration(windowFieldAdvance)
	switch {
	case w.Has(windowFieldGap):
		invalid(windowFieldGap, "Only a session window has a gap; a "+typ+" window has a size.")
	case !w.Has(windowFieldSize):
		invalid(windowFieldSize, "A "+typ+` window needs a size, such as "1m".`)
	case size < time.Millisecond:
		invalid(windowFieldSize, "The window's size must be at least 1ms.")
	case typ == windowHopping && (advance <= 0 || advance > size):
		invalid(windowFieldAdvance, "A hopping window needs an advance greater than 0 and no greater than its size.")
	case typ == windowHopping && size%advance != 0:
		invalid(windowFieldAdvance, "A hopping window's size must be a whole number of advances.")
	case typ == windowTumbling && advance != 0 && advance != size:
		invalid(windowFieldAdvance, "A tumbling window has no advance: its windows follow one another.")
	}
}

// aggregateStage is a stage of the aggregate kind, as its block configures it.
type aggregateStage struct {
	out           *flow.Topic
	groupBy       *expr.Program
	eventTime     *expr.Program // nil: the entry's time
	size, advance time.Duration // tumbling and hopping windows
	session       bool
	gap           time.Duration // session windows
	grace         time.Duration
	late          string      // aggregateLateDrop or aggregateLateDeadLetter when lateTopic is nil
	lateTopic     *flow.Topic // where late events go, if a topic
	onUpdate      bool
	fields        []aggregateField
	keys          keyLimit // max_keys: groups with open windows
	decoded       decodedCache[windowState]
	groups        decodedCache[groupState] // the groups' indexes, as decoded likewise
	// noArguments are the arguments of every message, read only, when no field has one (count()).
	noArguments []any
	// reads are the fields of a message that the stage's expressions read: the others are not
	// decoded (fieldsRead; nil: all are).
	reads []string
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
	values, err := s.arguments(m)
	if err != nil {
		return out, err
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
	case s.late == aggregateLateDrop:
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

// arguments are the values of the aggregate fields' arguments on m, by field (nil for count()),
// evaluated in one environment. Aggregates of count() alone share noArguments.
func (s *aggregateStage) arguments(m *Message) ([]any, error) {
	if s.noArguments != nil {
		return s.noArguments, nil
	}
	values := make([]any, len(s.fields))
	env := borrowEnv(m.Value) // a field has an argument: noArguments is nil
	defer returnEnv(env)
	for i, f := range s.fields {
		if f.Arg == nil {
			continue
		}
		v, err := f.Arg.Eval(env)
		if err != nil {
			return nil, evalError(err)
		}
		values[i] = v.Interface()
		if f.By != nil {
			by, err := f.By.Eval(env)
			if err != nil {
				return nil, evalError(err)
			}
			values[i] = byArgs{value: values[i], by: by.Interface()}
		}
	}
	return values, nil
}

// groupOf is the group m counts in: group_by's value.
func (s *aggregateStage) groupOf(m *Message) (string, error) {
	return stateKey(s.groupBy, s.reads, m)
}

// StateKeys names what Process reads for m, so that the runtime reads a batch's keys at once
// (StatePrefetcher): for tumbling and hopping windows, the windows that hold its event time and,
// when one of them may open, the group's index and the count of groups; for a session, the index
// and the count (its sessions are found through the index). A window of the stage's cache (which
// it wrote) is taken for open, and its group's index is read only when a window opens: most
// messages open no window. A wrong guess costs Process a read of its own.
func (s *aggregateStage) StateKeys(m *Message, keys []string) []string {
	group, err := s.groupOf(m)
	if err != nil {
		return keys // Process reports it
	}
	if s.session {
		return append(keys, groupPrefix+group, KeyCountKey)
	}
	at, err := EventTime(s.eventTime, m)
	if err != nil {
		return keys
	}
	ms, size, advance := at.UnixMilli(), s.size.Milliseconds(), s.advance.Milliseconds()
	mayOpen := false
	for start := floorDiv(ms, advance) * advance; start > ms-size; start -= advance {
		name := windowName(group, start)
		keys = append(keys, name)
		mayOpen = mayOpen || !s.decoded.holds(name)
	}
	if mayOpen {
		keys = append(keys, groupPrefix+group, KeyCountKey)
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

// OnTimer emits the results of windows: of those that close, and then forgets them; or, with emit
// = "on_update", of one that a batch changed. A closing timer is a window's own, as flowrun writes them, or
// one that windows closing at the same time share (TimerGroupName), as a later version may write.
func (s *aggregateStage) OnTimer(ctx context.Context, st State, name string, _ time.Time, out []Output) ([]Output, error) {
	if group, ok := strings.CutPrefix(name, forgetPrefix); ok {
		return out, s.forgetClosed(ctx, st, group)
	}
	if key, ok := strings.CutPrefix(name, updatePrefix); ok {
		w, err := s.load(ctx, st, windowPrefix+key)
		if err != nil || w == nil {
			return out, err
		}
		return append(out, s.resultOutput(w)), nil
	}
	keys, _ := TimerMembers(windowPrefix, name, nil)
	for _, key := range keys {
		var err error
		if out, err = s.close(ctx, st, key, out); err != nil {
			return out, err
		}
	}
	return out, nil
}

// close emits a window's result and forgets it, with its entry in its group's index. A window that
// the state no longer holds closed already.
func (s *aggregateStage) close(ctx context.Context, st State, key string, out []Output) ([]Output, error) {
	name := windowPrefix + key
	w, err := s.load(ctx, st, name)
	if err != nil || w == nil {
		return out, err
	}
	out = append(out, s.resultOutput(w))
	if err := s.forgetWindow(ctx, st, name); err != nil {
		return out, err
	}
	g, err := s.loadGroup(ctx, st, w.Group)
	if err != nil || g == nil {
		return out, err // nil: a window written before groups had an index
	}
	// The key is the group, NUL, the id.
	id, err := strconv.ParseInt(key[strings.LastIndexByte(key, 0)+1:], 10, 64)
	if err != nil {
		return out, Permanent(fmt.Errorf("the window %q has no id", key))
	}
	g.Windows = slices.DeleteFunc(g.Windows, func(o openWindow) bool { return o.ID == id })
	if s.session {
		g.ClosedUntil = max(g.ClosedUntil, w.End)
	}
	return out, s.putGroup(ctx, st, w.Group, g)
}

// TimerStateKeys names what OnTimer reads for a timer (TimerStatePrefetcher), so that the windows
// that close in a batch are read at once, not a round trip each for the window and one for its
// group: each closing window's state and its group's index, and the count of groups; an emitting
// one's state; the index of a group whose closed sessions are forgotten.
func (s *aggregateStage) TimerStateKeys(timer string, keys []string) []string {
	if group, ok := strings.CutPrefix(timer, forgetPrefix); ok {
		return append(keys, groupPrefix+group)
	}
	if key, ok := strings.CutPrefix(timer, updatePrefix); ok {
		return append(keys, windowPrefix+key)
	}
	closing, _ := TimerMembers(windowPrefix, timer, nil)
	for _, key := range closing {
		// A window's key is its group, NUL, its id.
		keys = append(keys, windowPrefix+key)
		if i := strings.LastIndexByte(key, 0); i >= 0 {
			keys = append(keys, groupPrefix+key[:i])
		}
	}
	if len(closing) > 0 {
		keys = append(keys, KeyCountKey)
	}
	return keys
}

// resultOutput is a window's result, as the stage emits it.
func (s *aggregateStage) resultOutput(w *windowState) Output {
	return Output{Topic: s.out, Message: Message{Key: w.Group, Value: s.result(w),
		Headers: map[string]string{EventTimeHeader: strconv.FormatInt(w.Start, 10)}}}
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
