package stages

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/flow/expr"
)

// EventTime returns a message's event time: the value of the expression, an RFC 3339 string or Unix
// milliseconds, or, without one, the time its entry was written (or, for a message a repartition
// stage copied, the time its original entry was written: EventTimeHeader). A value of neither form
// is a permanent error: the message cannot be placed in time.
func EventTime(e *expr.Program, m *Message) (time.Time, error) {
	if e == nil {
		if h := m.Headers[EventTimeHeader]; h != "" {
			ms, err := strconv.ParseInt(h, 10, 64)
			if err != nil {
				return time.Time{}, Permanent(fmt.Errorf("the %s header is %q, not Unix milliseconds", EventTimeHeader, h))
			}
			return time.UnixMilli(ms), nil
		}
		if m.EntryTime.IsZero() {
			return time.Time{}, Permanent(fmt.Errorf("the message has no event time: it was not read from a stream"))
		}
		return m.EntryTime, nil
	}
	if err := m.Decode(); err != nil {
		return time.Time{}, err
	}
	v, err := e.Eval(&expr.Env{Msg: m.Value})
	if err != nil {
		return time.Time{}, evalError(err)
	}
	switch x := v.Interface().(type) {
	case string:
		t, err := time.Parse(time.RFC3339Nano, x)
		if err != nil {
			return time.Time{}, Permanent(fmt.Errorf("the event time %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", x))
		}
		return t, nil
	case float64:
		return time.UnixMilli(int64(x)), nil
	case json.Number:
		ms, err := x.Int64()
		if err != nil {
			return time.Time{}, Permanent(fmt.Errorf("the event time %s is not a whole number of Unix milliseconds", x))
		}
		return time.UnixMilli(ms), nil
	}
	return time.Time{}, Permanent(fmt.Errorf("the event time is %s, not an RFC 3339 string or Unix milliseconds", v))
}
