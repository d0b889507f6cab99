package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/flowrun/flowrun/flow"
)

// The pattern and join kinds hold events in their keys' state until the watermark passes them, and
// share two things: where an event goes that comes when the watermark is already past it plus
// grace (their late attribute), and how a key's state, JSON, is read.

// The values of a late attribute besides topic.NAME.
const (
	lateDrop       = "drop"
	lateDeadLetter = "dead_letter"
)

// lateAttribute declares a kind's late attribute.
func lateAttribute() flow.Attribute {
	return flow.Attribute{
		Name: "late", Type: flow.TypeTopicOrChoice, Enum: []string{lateDrop, lateDeadLetter}, Default: lateDeadLetter,
		Doc: `Where a late event goes (one that comes when the watermark is past it plus grace): "dead_letter" (with why), "drop" (counted as late), or topic.NAME.`,
	}
}

// lateRoute is a stage's late attribute, compiled.
type lateRoute struct {
	topic  *flow.Topic // late = topic.NAME
	choice string      // or lateDrop, lateDeadLetter
	grace  time.Duration
}

func newLateRoute(s *flow.Stage, grace time.Duration) lateRoute {
	topic, choice := s.Config.TopicOrChoice("late")
	return lateRoute{topic: topic, choice: choice, grace: grace}
}

// send counts m as late and sends it where the route says: to its topic, nowhere, or (an error for
// good) to the dead letters, saying why.
func (l lateRoute) send(st State, m *Message, at, watermark time.Time, out []Output) ([]Output, error) {
	st.Record(Late)
	switch {
	case l.topic != nil:
		return append(out, Output{Topic: l.topic, Message: *m}), nil
	case l.choice == lateDrop:
		return out, nil
	}
	return out, Permanent(fmt.Errorf("late: its event time %s is more than grace (%s) before the watermark %s",
		at.UTC().Format(time.RFC3339Nano), l.grace, watermark.UTC().Format(time.RFC3339Nano)))
}

// loadKey reads a key's state, JSON, into a new T; found is false (and T zero) when it has none.
func loadKey[T any](ctx context.Context, st State, key string) (*T, bool, error) {
	raw, found, err := st.Get(ctx, key)
	if err != nil || !found {
		return new(T), false, err
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, false, Permanent(fmt.Errorf("the state of key %q cannot be read: %w", key, err))
	}
	return v, true, nil
}
