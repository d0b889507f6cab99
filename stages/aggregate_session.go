package stages

import (
	"context"
	"fmt"
	"time"
)

// The session windows of the aggregate kind (stage_aggregate.go): a session per group, from its
// first event to gap after its last, which each event less than gap away extends and an event that
// bridges two merges. Sessions are kept as the other windows are (aggregate_window.go), numbered
// in their group's index instead of named by their start, which moves.

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
			if err := s.forgetWindow(ctx, a.st, windowName(a.group, o.ID)); err != nil {
				return err
			}
		}
		w.Start, w.End = min(w.Start, a.at), max(w.End, a.at+gap)
	}
	name := windowName(a.group, id)
	if err := s.fold(ctx, a.st, name, w, a.values, a.at, true); err != nil {
		return err
	}
	// Its result will carry its start, which may lie before what OutputWatermark says of later
	// results: hold the watermark the stage passes on there until it closes.
	if err := a.st.Hold(ctx, name, time.UnixMilli(w.Start)); err != nil {
		return err
	}
	g.Windows = append(others, openWindow{ID: id, Start: w.Start, End: w.End})
	a.added = true
	return s.putGroup(ctx, a.st, a.group, g)
}

// loadSession reads a session that its group's index lists.
func (s *aggregateStage) loadSession(ctx context.Context, st State, group string, id int64) (*windowState, error) {
	name := windowName(group, id)
	w, err := s.load(ctx, st, name)
	if err == nil && w == nil {
		err = Permanent(fmt.Errorf("the state of session %q, which its group's index lists, is missing", keyOf(name)))
	}
	return w, err
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
	return st.Put(ctx, groupPrefix+group, g.appendJSON(nil))
}

// merge folds another window of the group in: a session that an event joined to this one.
func (w *windowState) merge(o *windowState, fields []aggregateField) {
	w.Start, w.End = min(w.Start, o.Start), max(w.End, o.End)
	for i, f := range fields {
		f.fn.merge(&w.Fields[i], &o.Fields[i])
	}
}
