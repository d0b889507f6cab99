package stages

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The windows of the aggregate kind (stage_aggregate.go) and their state: tumbling and hopping
// windows, aligned to the Unix epoch, and what sessions (aggregate_session.go) share with them.
//
// The state of a group is an index of its open windows (groupPrefix and the group: a groupState),
// which exists while the group has an open window and is what max_keys counts, and each window's
// accumulators (windowName: a windowState). A window's id is its start for tumbling
// and hopping windows, which are aligned and so never share one; a session's start moves as events
// join it, so the index numbers the group's sessions instead. A window's timers are named by its
// key: windowPrefix closes it, updatePrefix emits its value after a batch (emit = "on_update").
const windowPrefix, updatePrefix, groupPrefix, forgetPrefix = "w:", "u:", "g:", "c:"

// windowName is the name of a window's state, windowPrefix and its key, the group, NUL and its id
// (made at once: a message names its window to read it ahead, to load it and to write it), and of
// its own timer.
func windowName(group string, id int64) string {
	b := make([]byte, 0, len(windowPrefix)+len(group)+21)
	b = append(b, windowPrefix...)
	b = append(b, group...)
	b = append(b, 0)
	return string(strconv.AppendInt(b, id, 10))
}

// keyOf is the key of the window whose state is named name.
func keyOf(name string) string { return name[len(windowPrefix):] }

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
		name := windowName(a.group, start)
		w, err := s.load(ctx, a.st, name)
		if err != nil {
			return err
		}
		opened := w == nil
		if opened {
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
		if err := s.fold(ctx, a.st, name, w, a.values, a.at, opened); err != nil {
			return err
		}
		a.added = true
	}
	slices.Reverse(a.late) // earliest first
	return nil
}

func (s *aggregateStage) newWindow(group string, start, end int64) *windowState {
	return &windowState{Group: group, Start: start, End: end, Fields: make([]accumulator, len(s.fields))}
}

// fold adds one message's values to a window and writes it, with its timers: with closes, the one
// that closes it, at its end plus grace, and, with emit = "on_update", one that emits its value
// after this batch. closes is for a window that the message opened, or a session (whose end may
// move): a tumbling or hopping window's timer, set with its state when it opened, stays until it
// closes the window, and setting it again at every message was a timer to write per window of
// every batch.
//
// Each window has a closing timer of its own. Windows that close together could share one, as a
// dedupe's keys do, saving a timer to add and remove per window; but a process of an earlier
// version fires a shared timer as none of its own, so during a rolling upgrade (or after a
// rollback) the windows of a partition it took over would never be emitted; and an
// effectively-once stage names a timer's outputs by the timer, which a batch processed again after
// a crash, cut otherwise, would share out otherwise. OnTimer reads shared timers all the same
// (TimerMembers), so that a later version may write them.
func (s *aggregateStage) fold(ctx context.Context, st State, name string, w *windowState, values []any, at int64, closes bool) error {
	for i, f := range s.fields {
		w.Fields[i].add(f.fn, values[i], at)
	}
	b, err := w.appendJSON(make([]byte, 0, 64+48*len(w.Fields)))
	if err != nil {
		return err
	}
	if err := st.Put(ctx, name, b); err != nil {
		return err
	}
	s.decoded.keep(st.Partition(), name, b, w)
	if closes {
		if err := st.SetTimer(ctx, name, time.UnixMilli(w.End+s.grace.Milliseconds())); err != nil {
			return err
		}
	}
	if s.onUpdate {
		// Due at once: timers fire after the batch's messages, so this emits once per batch.
		return st.SetTimer(ctx, updatePrefix+keyOf(name), time.UnixMilli(at))
	}
	return nil
}

// load reads the window whose state is named name (windowName); nil when the state has none.
func (s *aggregateStage) load(ctx context.Context, st State, name string) (*windowState, error) {
	b, found, err := st.Get(ctx, name)
	if err != nil || !found {
		return nil, err
	}
	if w := s.decoded.take(st.Partition(), name, b); w != nil {
		return w, nil
	}
	var w windowState
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, Permanent(fmt.Errorf("the state of window %q cannot be read: %w", keyOf(name), err))
	}
	if len(w.Fields) != len(s.fields) {
		return nil, Permanent(fmt.Errorf("the state of window %q has %d fields, the stage %d: the aggregate changed under existing state", keyOf(name), len(w.Fields), len(s.fields)))
	}
	return &w, nil
}

// forgetWindow deletes a window's state and cancels its timers and hold. A tumbling or hopping
// window is forgotten as it closes, by its timer, which the runtime cancels as it fires (or which
// it shares with other windows, and fires once for all of them): only a session, which may be
// merged into another, has a timer to cancel here, and a hold. Only with emit = "on_update" has a
// window a timer that emits its value.
func (s *aggregateStage) forgetWindow(ctx context.Context, st State, name string) error {
	if err := st.Delete(ctx, name); err != nil {
		return err
	}
	if s.session {
		if err := st.CancelTimer(ctx, name); err != nil {
			return err
		}
		if err := st.Release(ctx, name); err != nil {
			return err
		}
	}
	if s.onUpdate {
		return st.CancelTimer(ctx, updatePrefix+keyOf(name))
	}
	return nil
}

// loadGroup reads a group's index of its open windows; nil when it has none.
func (s *aggregateStage) loadGroup(ctx context.Context, st State, group string) (*groupState, error) {
	b, found, err := st.Get(ctx, groupPrefix+group)
	if err != nil || !found {
		return nil, err
	}
	if g := s.groups.take(st.Partition(), groupPrefix+group, b); g != nil {
		return g, nil
	}
	if g, ok := parseGroupState(b); ok {
		return g, nil
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
	b := g.appendJSON(nil)
	if err := st.Put(ctx, groupPrefix+group, b); err != nil {
		return err
	}
	s.groups.keep(st.Partition(), groupPrefix+group, b, g)
	return nil
}

// decodedCache keeps the state values (windows, groups' indexes) that the stage encoded last, each
// with the bytes it wrote, so that the next message of a window or group whose state still holds
// those bytes takes the value as it is instead of decoding its JSON again: a value is decoded once
// per process, not once per message. The bytes are compared, so the cache cannot be out of date,
// whatever the state went through (a failed attempt, another process); a value taken out is the
// taker's to change, and is kept again only once written. A value is kept by its state key, with
// its partition.
type decodedCache[T any] struct {
	mu     sync.Mutex
	values map[string]cachedValue[T]
}

type cachedValue[T any] struct {
	partition int
	raw       []byte
	v         *T
}

// maxCachedValues bounds a cache; past it, it starts again empty.
const maxCachedValues = 1 << 16

// take returns the value that raw encodes, if the cache has it, and forgets it.
func (c *decodedCache[T]) take(partition int, name string, raw []byte) *T {
	c.mu.Lock()
	defer c.mu.Unlock()
	cv, ok := c.values[name]
	if !ok {
		return nil
	}
	delete(c.values, name)
	if cv.partition != partition || !bytes.Equal(cv.raw, raw) {
		return nil
	}
	return cv.v
}

// keep remembers the value v that raw encodes, as written to the state.
func (c *decodedCache[T]) keep(partition int, name string, raw []byte, v *T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.values == nil || len(c.values) >= maxCachedValues {
		c.values = make(map[string]cachedValue[T])
	}
	c.values[name] = cachedValue[T]{partition: partition, raw: raw, v: v}
}

// holds reports whether the cache has a value of that name: for a window, most likely open (it
// was written, and a window that closed is never written again).
func (c *decodedCache[T]) holds(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.values[name]
	return ok
}

// windowState is a window's accumulators, as its state holds them (JSON).
type windowState struct {
	Group  string        `json:"g"`
	Start  int64         `json:"s"`
	End    int64         `json:"e"`
	Fields []accumulator `json:"f"`
}

// appendJSON appends the window's JSON, as encoding/json encodes it (TestWindowStateEncodesAsJSON):
// a window is encoded once per message that changes it, and reflection made that a third of the
// aggregate's own time.
func (w *windowState) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"g":`...)
	b = appendString(b, w.Group)
	b = append(b, `,"s":`...)
	b = strconv.AppendInt(b, w.Start, 10)
	b = append(b, `,"e":`...)
	b = strconv.AppendInt(b, w.End, 10)
	b = append(b, `,"f":`...)
	if w.Fields == nil {
		return append(b, "null}"...), nil
	}
	b = append(b, '[')
	for i := range w.Fields {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = w.Fields[i].appendJSON(b); err != nil {
			return nil, err
		}
	}
	return append(b, "]}"...), nil
}

// appendJSON appends the accumulator's JSON, its empty parts left out (omitempty).
func (a *accumulator) appendJSON(b []byte) ([]byte, error) {
	b = append(b, '{')
	start := len(b)
	name := func(n string) {
		if len(b) > start {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, n...)
		b = append(b, '"', ':')
	}
	var err error
	value := func(n string, v any) {
		if err == nil {
			name(n)
			b, err = appendJSON(b, v)
		}
	}
	if a.N != 0 {
		name("n")
		b = strconv.AppendInt(b, a.N, 10)
	}
	if a.Sum != 0 {
		value("sum", a.Sum)
	}
	if a.Best != nil {
		value("best", a.Best)
	}
	if len(a.Distinct) > 0 {
		value("d", a.Distinct)
	}
	if len(a.Counts) > 0 {
		value("c", a.Counts)
	}
	if a.Value != nil {
		value("v", a.Value)
	}
	if a.At != 0 {
		name("at")
		b = strconv.AppendInt(b, a.At, 10)
	}
	if a.Set {
		name("set")
		b = append(b, "true"...)
	}
	if a.By != nil {
		value("by", a.By)
	}
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// groupState is a group's index of its open windows, by start. Next numbers its sessions.
type groupState struct {
	Next    int64        `json:"n,omitempty"`
	Windows []openWindow `json:"w"`
	// ClosedUntil is the latest end of the group's sessions that have closed, while an event that
	// falls before it could still be on time otherwise; 0 for tumbling and hopping windows.
	ClosedUntil int64 `json:"c,omitempty"`
}

// appendJSON appends the group's index as encoding/json encodes it (TestGroupStateCodec): a group's
// index is read and written as each of its windows opens and closes, and reflection made that a
// tenth of a tumbling count's own time.
func (g *groupState) appendJSON(b []byte) []byte {
	b = append(b, '{')
	if g.Next != 0 {
		b = append(b, `"n":`...)
		b = strconv.AppendInt(b, g.Next, 10)
		b = append(b, ',')
	}
	b = append(b, `"w":`...)
	if g.Windows == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, w := range g.Windows {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"i":`...)
			b = strconv.AppendInt(b, w.ID, 10)
			b = append(b, `,"s":`...)
			b = strconv.AppendInt(b, w.Start, 10)
			b = append(b, `,"e":`...)
			b = strconv.AppendInt(b, w.End, 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if g.ClosedUntil != 0 {
		b = append(b, `,"c":`...)
		b = strconv.AppendInt(b, g.ClosedUntil, 10)
	}
	return append(b, '}')
}

// parseGroupState reads a group's index as appendJSON writes it; ok is false for anything else,
// which encoding/json then reads (or refuses).
func parseGroupState(b []byte) (_ *groupState, ok bool) {
	g := &groupState{}
	p := jsonPrefixes{b: b}
	if !p.take(`{`) {
		return nil, false
	}
	if p.take(`"n":`) {
		if g.Next, ok = p.int(); !ok || !p.take(`,`) {
			return nil, false
		}
	}
	if !p.take(`"w":`) {
		return nil, false
	}
	if !p.take("null") {
		if !p.take(`[`) {
			return nil, false
		}
		g.Windows = []openWindow{}
		for first := true; !p.take(`]`); first = false {
			var w openWindow
			if !first && !p.take(`,`) || !p.take(`{"i":`) {
				return nil, false
			}
			if w.ID, ok = p.int(); !ok || !p.take(`,"s":`) {
				return nil, false
			}
			if w.Start, ok = p.int(); !ok || !p.take(`,"e":`) {
				return nil, false
			}
			if w.End, ok = p.int(); !ok || !p.take(`}`) {
				return nil, false
			}
			g.Windows = append(g.Windows, w)
		}
	}
	if p.take(`,"c":`) {
		if g.ClosedUntil, ok = p.int(); !ok {
			return nil, false
		}
	}
	return g, p.take(`}`) && len(p.b) == 0
}

// jsonPrefixes reads JSON of a known shape from its start: the fixed parts and integers.
type jsonPrefixes struct{ b []byte }

// take consumes s if the rest begins with it.
func (p *jsonPrefixes) take(s string) bool {
	if len(p.b) < len(s) || string(p.b[:len(s)]) != s {
		return false
	}
	p.b = p.b[len(s):]
	return true
}

// int consumes an integer, as strconv.AppendInt writes it.
func (p *jsonPrefixes) int() (int64, bool) {
	n := 0
	if n < len(p.b) && p.b[n] == '-' {
		n++
	}
	for n < len(p.b) && '0' <= p.b[n] && p.b[n] <= '9' {
		n++
	}
	v, err := strconv.ParseInt(string(p.b[:n]), 10, 64)
	if err != nil {
		return 0, false
	}
	p.b = p.b[n:]
	return v, true
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
