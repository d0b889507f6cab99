package stages

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/flowrun/flowrun/flow/expr"
)

// A message's event time, and the headers that carry time from hop to hop: the event time of a
// message whose own is its entry's (EventTimeHeader), and the watermarks where it entered the
// pipeline (WatermarkHeader).

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
	if m.timeBy == e {
		return m.timeAt, nil
	}
	at, err := evalEventTime(e, m)
	if err == nil {
		m.timeBy, m.timeAt = e, at
	}
	return at, err
}

// evalEventTime is EventTime by an expression, evaluated.
func evalEventTime(e *expr.Program, m *Message) (time.Time, error) {
	if err := m.decodeFor(e); err != nil {
		return time.Time{}, err
	}
	env := borrowEnv(m.Value)
	defer returnEnv(env)
	v, err := e.Eval(env)
	if err != nil {
		return time.Time{}, evalError(err)
	}
	switch x := v.Interface().(type) {
	case string:
		return eventTimeOfString(x)
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

// eventTimeOfString is the event time of a string value.
func eventTimeOfString(x string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, x)
	if err != nil {
		return time.Time{}, Permanent(fmt.Errorf("the event time %q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", x))
	}
	return t, nil
}

// scannedEventTime is the event time of a field's value as its JSON text holds it (scanFields),
// where that tells it as the expression would: a string without escapes that is an RFC 3339 time,
// or an integer of up to 15 digits (which a float64, as the expression reads it, holds exactly).
// ok is false for any other value, which the expression evaluates (and refuses, where it does).
func scannedEventTime(raw []byte) (at time.Time, ok bool) {
	switch {
	case isPlainString(raw):
		at, err := eventTimeOfString(string(raw[1 : len(raw)-1]))
		return at, err == nil
	case isSmallInteger(raw):
		ms, err := strconv.ParseInt(string(raw), 10, 64)
		return time.UnixMilli(ms), err == nil
	}
	return time.Time{}, false
}

// isSmallInteger reports whether the JSON text of a number is an integer of 1 to 15 digits.
func isSmallInteger(raw []byte) bool {
	digits := bytes.TrimPrefix(raw, []byte("-"))
	if len(digits) == 0 || len(digits) > 15 {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// EventTimeHeader carries the event time, in Unix milliseconds, of a message whose event time is
// the time its entry was first written (a stateful stage without event_time), or that an aggregate
// gave its result: EventTime reads it in place of the time of the entry it arrives in. Sources and
// the stages that read what comes from outside the pipeline set it, where it is needed.
const EventTimeHeader = "flowrun-event-time"

// WatermarkHeader starts the name of the headers that carry, for each time domain (flow.TimeDomain)
// that stages after it read event time by, the watermark of the place the message entered the
// pipeline (its source) as it was when the message was written there, in Unix milliseconds:
// "flowrun-watermark:msg.ts". A stateful stage takes a message for late when it is late by that
// watermark or by its own, so that what is late is what was late where it entered, whatever the
// batches, partitions and processes on the way.
const WatermarkHeader = "flowrun-watermark"

// WatermarkHeaderOf names the header of a domain.
func WatermarkHeaderOf(domain string) string {
	if domain == "" {
		return WatermarkHeader
	}
	return WatermarkHeader + ":" + domain
}

// CarriedWatermark returns the watermark a message carries for a domain (WatermarkHeader), in Unix
// ms; 0 when it carries none.
func CarriedWatermark(m *Message, domain string) int64 {
	v := m.Headers[WatermarkHeaderOf(domain)]
	if v == "" {
		return 0
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0
	}
	return ms
}
