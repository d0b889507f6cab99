package modeltest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
)

// The reference model: each stage computed over everything it reads at once, as a function of the
// multiset of its input. Nothing here depends on order, except where the documented semantics
// make order irrelevant for the drawn data (a dedupe keeps the first of copies that are equal; first
// and last pick by event time, which differs between events that differ).

// item is a message on its way through the model: its payload and, for an aggregate's result, the
// event time it carries (its window's start).
type item struct {
	msg Message
	at  int64
}

// Expected computes what each sink receives, by sink name.
func (d *Draw) Expected() map[string][]Message {
	m := newModel(d)
	out := map[string][]Message{}
	for _, s := range d.Pipeline.Sinks {
		for _, it := range m.read(s.Input) {
			out[s.Name] = append(out[s.Name], it.msg)
		}
		if out[s.Name] == nil {
			out[s.Name] = []Message{}
		}
	}
	return out
}

// Flows counts what the model sends through the pipeline: the messages of each declared topic, by
// name, and of each stage's input and own output, by stage name (input under "NAME<", output under
// "NAME>"), for telling where a run first differs.
func (d *Draw) Flows() map[string]int {
	m := newModel(d)
	out := map[string]int{}
	for _, t := range d.Pipeline.Topics {
		out[t.Name] = len(m.read(Ref{Topic: t}))
	}
	for _, s := range d.Pipeline.Stages {
		out[s.Name+"<"] = len(m.read(s.Input))
		out[s.Name+">"] = len(m.stage(s)[nil])
	}
	return out
}

type model struct {
	d           *Draw
	outputs     map[*Stage]map[*Topic][]item // by output topic; nil: the stage's own output
	topics      map[*Topic][]item
	deadLetters map[string]int // by stage name
}

func newModel(d *Draw) *model {
	return &model{d: d, outputs: map[*Stage]map[*Topic][]item{}, topics: map[*Topic][]item{}, deadLetters: map[string]int{}}
}

// DeadLetters counts the messages each stage dead-letters, by stage name (a lookup's of keys its
// table does not hold, with missing = "dead_letter"); a stage that dead-letters none is absent.
func (d *Draw) DeadLetters() map[string]int {
	m := newModel(d)
	for _, s := range d.Pipeline.Stages {
		m.stage(s)
	}
	return m.deadLetters
}

// Rows is the table as its updates leave it: each key's last row, deleted keys absent, numbers
// as a reader decodes them.
func (t *Table) Rows() map[string]Message {
	rows := map[string]Message{}
	for _, u := range t.Updates {
		if u.Row == nil {
			delete(rows, u.Key)
		} else {
			rows[u.Key] = decoded(u.Row)
		}
	}
	return rows
}

// RowAsOf is the row of key that held at event time at (Unix ms) in a Versioned table: its
// latest version whose upd is at or before at.
func (t *Table) RowAsOf(key string, at int64) (Message, bool) {
	var row Message
	for _, u := range t.Updates {
		if u.Key == key && u.Row != nil && int64(num(u.Row["upd"])) <= at {
			row = u.Row // a key's updates come in upd order
		}
	}
	return decoded(row), row != nil
}

// read is what a stage or sink reading r gets.
func (m *model) read(r Ref) []item {
	if r.Stage != nil {
		return m.stage(r.Stage)[nil]
	}
	if items, ok := m.topics[r.Topic]; ok {
		return items
	}
	items := []item{}
	for _, s := range m.d.Pipeline.Sources {
		if s.Output == r.Topic {
			for _, msg := range m.d.Inputs[s.Input] {
				items = append(items, item{msg: msg})
			}
		}
	}
	for _, s := range m.d.Pipeline.Stages {
		if slices.Contains(append(writtenBy(s), s.Duplicates, s.LateTopic), r.Topic) {
			items = append(items, m.stage(s)[r.Topic]...)
		}
	}
	m.topics[r.Topic] = items
	return items
}

// stage computes what a stage writes, by topic (its own output under nil).
func (m *model) stage(s *Stage) map[*Topic][]item {
	if out, ok := m.outputs[s]; ok {
		return out
	}
	out := map[*Topic][]item{}
	in := m.read(s.Input)
	switch s.Kind {
	case "rate_limit": // it delays, and passes every message on as it came
		out[s.Output] = in
	case "filter":
		for _, it := range in {
			if s.Where.Eval(it.msg).(bool) {
				out[s.Output] = append(out[s.Output], it)
			}
		}
	case "map":
		for _, it := range in {
			changed := Message{}
			for k, v := range it.msg {
				changed[k] = v
			}
			for _, f := range s.Set {
				changed[f.Name] = f.Expr.Eval(it.msg)
			}
			for _, f := range s.Drop {
				delete(changed, f)
			}
			out[s.Output] = append(out[s.Output], item{changed, it.at})
		}
	case "route":
		for _, it := range in {
			to, matched := s.Default, false
			for _, c := range s.Cases {
				if c.When.Eval(it.msg).(bool) {
					to, matched = c.Output, true
					break
				}
			}
			if matched || to != nil {
				out[to] = append(out[to], it)
			}
		}
	case "dedupe":
		seen := map[any]bool{}
		for _, it := range in {
			k := s.Key.Eval(it.msg)
			if !seen[k] {
				seen[k] = true
				out[s.Output] = append(out[s.Output], it)
			} else if s.Duplicates != nil {
				out[s.Duplicates] = append(out[s.Duplicates], it)
			}
		}
	case "aggregate":
		out[s.Output] = aggregate(s, in)
	case "pattern":
		out[s.Output] = pattern(s, in)
	case "join":
		out[s.Output] = join(s, in, m.read(s.Right))
	case "lookup":
		rows := s.Table.Rows()
		for _, it := range in {
			key := fmt.Sprint(s.Key.Eval(it.msg))
			row, found := rows[key]
			if s.AsOf != nil {
				row, found = s.Table.RowAsOf(key, s.AsOf.Eval(it.msg).(int64))
			}
			if !found && s.Missing == "drop" {
				continue
			}
			if !found && s.Missing == "dead_letter" {
				m.deadLetters[s.Name]++
				continue
			}
			enriched := Message{s.As: nil}
			for k, v := range it.msg {
				enriched[k] = v
			}
			if found {
				enriched[s.As] = map[string]any(row)
			}
			out[s.Output] = append(out[s.Output], item{enriched, it.at})
		}
	default:
		panic("modeltest: no model of kind " + s.Kind)
	}
	m.outputs[s] = out
	return out
}

// window is one window's messages in the model.
type window struct {
	group      string
	start, end int64
	items      []item
	times      []int64 // the event time of each item
}

// aggregate computes an aggregate's results: every window of every group, none late.
func aggregate(s *Stage, in []item) []item {
	windows := map[string]map[int64]*window{} // group -> start -> window
	put := func(group string, start, end int64, it item, at int64) {
		if windows[group] == nil {
			windows[group] = map[int64]*window{}
		}
		w := windows[group][start]
		if w == nil {
			w = &window{group: group, start: start, end: end}
			windows[group][start] = w
		}
		w.items, w.times = append(w.items, it), append(w.times, at)
	}
	type timed struct {
		it    item
		at    int64
		group string
	}
	var all []timed
	for _, it := range in {
		at := it.at
		if s.EventTime != nil {
			at = s.EventTime.Eval(it.msg).(int64)
		}
		all = append(all, timed{it, at, fmt.Sprint(s.GroupBy.Eval(it.msg))})
	}
	switch s.Window.Type {
	case "tumbling":
		size := s.Window.Size.Milliseconds()
		for _, t := range all {
			start := floorDiv(t.at, size) * size
			put(t.group, start, start+size, t.it, t.at)
		}
	case "hopping":
		size, advance := s.Window.Size.Milliseconds(), s.Window.Advance.Milliseconds()
		for _, t := range all {
			for start := floorDiv(t.at, advance) * advance; start > t.at-size; start -= advance {
				put(t.group, start, start+size, t.it, t.at)
			}
		}
	case "session":
		// A group's events by time: each less than gap after the last one before it joins its
		// session, which ends gap after its last event.
		gap := s.Window.Gap.Milliseconds()
		slices.SortStableFunc(all, func(a, b timed) int { return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(a.at, b.at)) })
		var start, last int64
		for i, t := range all {
			if i == 0 || t.group != all[i-1].group || t.at-last >= gap {
				start = t.at
			}
			last = t.at
			put(t.group, start, 0, t.it, t.at)
			windows[t.group][start].end = last + gap
		}
	}
	var results []item
	for _, byStart := range windows {
		for _, w := range byStart {
			results = append(results, item{msg: decoded(result(s, w)), at: w.start})
		}
	}
	return results
}

// result is a window's result payload: its aggregate fields, key and window.
func result(s *Stage, w *window) Message {
	r := Message{"key": w.group, "window": map[string]any{"start": formatTime(w.start), "end": formatTime(w.end)}}
	for _, a := range s.Aggregates {
		if a.By != nil {
			r[a.Name] = pickBy(a, w.items)
			continue
		}
		var values []any
		var times []int64
		for i, it := range w.items {
			if a.Arg == nil {
				values = append(values, true)
			} else if v := a.Arg.Eval(it.msg); v != nil {
				values = append(values, v)
			} else {
				continue
			}
			times = append(times, w.times[i])
		}
		r[a.Name] = compute(a, values, times)
	}
	return r
}

// pickBy is max_by or min_by over a window's messages, as docs/language.md says: the value of the
// message with the largest (smallest) BY, and of those, the largest (smallest) value. The model's
// BYs are numbers and its values strings, which order by value and by text.
func pickBy(a Aggregate, items []item) any {
	var pick string
	var by float64
	found := false
	for _, it := range items {
		b, v := a.By.Eval(it.msg), a.Arg.Eval(it.msg).(string)
		if b == nil {
			continue
		}
		order := cmp.Or(cmp.Compare(num(b), by), cmp.Compare(v, pick))
		if a.Func == "min_by" {
			order = -order
		}
		if !found || order > 0 {
			pick, by, found = v, num(b), true
		}
	}
	if !found {
		return nil
	}
	return pick
}

// compute is one aggregate function over a window's values, as docs/reference.md describes them.
func compute(a Aggregate, values []any, times []int64) any {
	switch a.Func {
	case "count":
		return len(values)
	case "sum", "avg":
		var sum float64
		for _, v := range values {
			sum += v.(float64)
		}
		if a.Func == "avg" {
			if len(values) == 0 {
				return nil
			}
			return wholeIfWhole(sum / float64(len(values)))
		}
		return wholeIfWhole(sum)
	case "min", "max":
		var best any
		for _, v := range values {
			if best == nil || a.Func == "min" && v.(float64) < best.(float64) || a.Func == "max" && v.(float64) > best.(float64) {
				best = v
			}
		}
		return best
	case "count_distinct":
		distinct := map[string]bool{}
		for _, v := range values {
			distinct[Canonical(v)] = true
		}
		return len(distinct)
	case "first", "last":
		var pick any
		var at int64
		for i, v := range values {
			if pick == nil || a.Func == "first" && times[i] < at || a.Func == "last" && times[i] > at {
				pick, at = v, times[i]
			}
		}
		return pick
	case "top_k":
		counts := map[string]int{}
		for _, v := range values {
			counts[Canonical(v)]++
		}
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(x, y string) int { return cmp.Or(-cmp.Compare(counts[x], counts[y]), cmp.Compare(x, y)) })
		top := []any{}
		for _, k := range keys[:min(a.K, len(keys))] {
			var v any
			if err := json.Unmarshal([]byte(k), &v); err != nil {
				panic(err)
			}
			top = append(top, v)
		}
		return top
	}
	panic("modeltest: no model of " + a.Func)
}

func wholeIfWhole(f float64) any {
	if f == math.Trunc(f) {
		return int64(f)
	}
	return f
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// decoded is a payload as a reader decodes it: numbers are float64.
func decoded(m Message) Message {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	var out Message
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// Canonical is a value as JSON with sorted keys and numbers as JSON writes float64s, so that equal
// payloads compare equal however they were made.
func Canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		panic(err)
	}
	b, err = json.Marshal(x)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// pattern computes a pattern's matches, none late: per key, the events in event-time order (an
// event and its copy share a time, and are alike); from each event that takes the first step, the
// first later event that takes each next step, while within of the first; a match is the select
// over its steps' messages, at its last step's time.
func pattern(s *Stage, in []item) []item {
	type timed struct {
		it  item
		at  int64
		key string
	}
	var all []timed
	for _, it := range in {
		all = append(all, timed{it, s.EventTime.Eval(it.msg).(int64), fmt.Sprint(s.Key.Eval(it.msg))})
	}
	slices.SortStableFunc(all, func(a, b timed) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.at, b.at)) })
	within := s.Within.Milliseconds()
	var results []item
	for i, first := range all {
		if !s.Steps[0].Where.Eval(first.it.msg).(bool) {
			continue
		}
		taken := []timed{first}
		for j := i + 1; j < len(all) && len(taken) < len(s.Steps); j++ {
			e := all[j]
			if e.key != first.key || e.at-first.at > within {
				break
			}
			if s.Steps[len(taken)].Where.Eval(e.it.msg).(bool) {
				taken = append(taken, e)
			}
		}
		if len(taken) < len(s.Steps) {
			continue
		}
		steps := map[string]Message{}
		for k, step := range s.Steps {
			steps[step.Name] = taken[k].it.msg
		}
		match := Message{"steps": steps}
		result := Message{}
		for _, f := range s.Select {
			result[f.Name] = f.Expr.Eval(match)
		}
		results = append(results, item{msg: decoded(result), at: taken[len(taken)-1].at})
	}
	return results
}

// join computes a join's rows, none late: each left and right event of one key with the right one's
// time from before the left one's to after it makes a row; each left event in none makes one alone
// in a left or outer join, and each right event in none in an outer join. A row carries the later
// of its events' times.
func join(s *Stage, left, right []item) []item {
	type timed struct {
		msg Message
		at  int64
		key string
	}
	side := func(in []item, key, at *Expr) []timed {
		var out []timed
		for _, it := range in {
			out = append(out, timed{it.msg, at.Eval(it.msg).(int64), fmt.Sprint(key.Eval(it.msg))})
		}
		return out
	}
	ls, rs := side(left, s.Key, s.EventTime), side(right, s.RightKey, s.RightEventTime)
	row := func(l, r *timed) item {
		pair := Message{"left": nil, "right": nil}
		var at int64
		if l != nil {
			pair["left"], at = l.msg, l.at
		}
		if r != nil {
			pair["right"], at = r.msg, max(at, r.at)
		}
		result := Message{}
		for _, f := range s.Select {
			result[f.Name] = f.Expr.Eval(pair)
		}
		return item{msg: decoded(result), at: at}
	}
	var rows []item
	matched := make([]bool, len(rs))
	for _, l := range ls {
		alone := true
		for j, r := range rs {
			if r.key == l.key && r.at >= l.at-s.Before.Milliseconds() && r.at <= l.at+s.After.Milliseconds() {
				rows = append(rows, row(&l, &r))
				alone, matched[j] = false, true
			}
		}
		if alone && s.JoinType != "inner" {
			rows = append(rows, row(&l, nil))
		}
	}
	if s.JoinType == "outer" {
		for j, r := range rs {
			if !matched[j] {
				rows = append(rows, row(nil, &r))
			}
		}
	}
	return rows
}
