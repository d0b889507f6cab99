package stages

import (
	"context"
	"errors"
	"github.com/flowrun/flowrun/flow"
	"slices"
	"testing"
	"time"
)

// readLog is a memState that records the keys read.
type readLog struct {
	*memState
	read []string
}

func (s *readLog) Get(ctx context.Context, key string) ([]byte, bool, error) {
	s.read = append(s.read, key)
	return s.memState.Get(ctx, key)
}

// TestStateKeysNameWhatProcessReads: every state key that the aggregate (tumbling, hopping) and
// dedupe kinds read for a message is one their StateKeys named for it, so that a batch's reads are
// one round trip (the runtime reads each key it was not told of on its own).
func TestStateKeysNameWhatProcessReads(t *testing.T) {
	window := func(w string) string {
		return `
stage "st" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  max_keys   = 10
  window {` + w + `}
  aggregate = { n = count(), total = sum(msg.amount) }
}
` + sinkA
	}
	for name, src := range map[string]string{
		"tumbling": window(`
    type = "tumbling"
    size = "1m"
`),
		"hopping": window(`
    type    = "hopping"
    size    = "3m"
    advance = "1m"
`),
		"dedupe": prefetchDedupe,
	} {
		t.Run(name, func(t *testing.T) {
			st, proc := compileLogged(t, src)
			prefetcher := proc.StatePrefetcher
			if prefetcher == nil {
				t.Fatal("the kind names no state keys ahead")
			}
			ctx := context.Background()
			for i, payload := range []string{event("a", 0, 1, ""), event("b", 0.5, 2, ""), event("a", 1.5, 3, ""), event("a", 2.5, 4, "")} {
				m := NewMessage("", []byte(payload), nil)
				named := prefetcher.StateKeys(&m, nil)
				st.read = nil
				st.observe(&m)
				if _, err := proc.Processor.Process(ctx, st, &m, nil); err != nil {
					t.Fatal(err)
				}
				for _, k := range st.read {
					if !slices.Contains(named, k) {
						t.Errorf("message %d: Process read %q, which StateKeys did not name (%q)", i, k, named)
					}
				}
				if len(st.read) == 0 {
					t.Errorf("message %d read no state", i)
				}
			}
		})
	}
}

// timersFailing is a memState whose SetTimer fails while fail is set: an attempt that fails after
// its window was written (the timer that emits it on update comes after).
type timersFailing struct {
	*memState
	fail bool
}

func (s *timersFailing) SetTimer(ctx context.Context, name string, at time.Time) error {
	if s.fail {
		return errors.New("no timers now")
	}
	return s.memState.SetTimer(ctx, name, at)
}

// TestAWindowDecodedOnceIsNeverOutOfDate: the aggregate keeps the windows it wrote decoded, and
// takes one only while the state holds the bytes it wrote: an attempt that failed after writing its
// window leaves the state as it was, and the next message counts from there, not from the window
// the failed attempt changed.
func TestAWindowDecodedOnceIsNeverOutOfDate(t *testing.T) {
	st := &timersFailing{memState: newMemState()}
	st.self = st
	p := plan(t, `
stage "st" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  emit      = "on_update"
  aggregate = { n = count(), total = sum(msg.amount) }
}
`+sinkA)
	st.eventTime = flow.EventTimeOf(p.Stage("st"))
	proc, err := CompileStateful(p.Stage("st"), Env{Node: "st"})
	if err != nil {
		t.Fatal(err)
	}
	_, errs := st.batch(t, proc, event("a", 0, 1, ""))
	noErrors(t, errs)
	st.fail = true
	if _, errs := st.batch(t, proc, event("a", 0.1, 10, "")); errs[0] == nil {
		t.Fatal("the attempt did not fail")
	}
	st.fail = false
	_, errs = st.batch(t, proc, event("a", 0.2, 100, ""))
	noErrors(t, errs)
	wantWindows(t, "the window", windows(t, st.end(t, proc), "n", "total"), "a [0, 1) n=2 total=101")
}

// checkedTimers is a TimerHandler that holds each timer's reads to what TimerStateKeys named for
// it.
type checkedTimers struct {
	t     *testing.T
	inner TimerHandler
	st    *readLog
	fired int
}

func (c *checkedTimers) OnTimer(ctx context.Context, st State, name string, at time.Time, out []Output) ([]Output, error) {
	named := c.inner.(TimerStatePrefetcher).TimerStateKeys(name, nil)
	c.st.read = nil
	out, err := c.inner.OnTimer(ctx, st, name, at, out)
	for _, k := range c.st.read {
		if !slices.Contains(named, k) {
			c.t.Errorf("timer %q: OnTimer read %q, which TimerStateKeys did not name (%q)", name, k, named)
		}
	}
	c.fired++
	return out, err
}

// TestTimerStateKeysNameWhatOnTimerReads: every state key that the aggregate (tumbling, hopping,
// sessions, emitting on update) and dedupe kinds read for a timer is one their TimerStateKeys named
// for it, so that the reads of a batch's timers are one round trip.
func TestTimerStateKeysNameWhatOnTimerReads(t *testing.T) {
	aggregate := func(w, emit string) string {
		return `
stage "st" {
  kind       = "aggregate"
  input      = topic.in
  output     = topic.a
  group_by   = msg.user
  event_time = msg.at
  max_keys   = 10
  emit       = "` + emit + `"
  window {` + w + `}
  aggregate = { n = count(), total = sum(msg.amount) }
}
` + sinkA
	}
	tumbling, hopping, session := `
    type = "tumbling"
    size = "1m"
`, `
    type    = "hopping"
    size    = "3m"
    advance = "1m"
`, `
    type = "session"
    gap  = "1m"
`
	for name, src := range map[string]string{
		"tumbling":           aggregate(tumbling, "on_close"),
		"hopping":            aggregate(hopping, "on_close"),
		"session":            aggregate(session, "on_close"),
		"tumbling on update": aggregate(tumbling, "on_update"),
		"dedupe":             prefetchDedupe,
	} {
		t.Run(name, func(t *testing.T) {
			st, proc := compileLogged(t, src)
			if _, ok := proc.TimerHandler.(TimerStatePrefetcher); !ok {
				t.Fatal("the kind names no state keys of its timers")
			}
			checked := &checkedTimers{t: t, inner: proc.TimerHandler, st: st}
			proc.TimerHandler = checked
			for _, batch := range [][]string{
				{event("a", 0, 1, ""), event("b", 0.5, 2, "")},
				{event("a", 1.5, 3, ""), event("c", 2.2, 5, "")},
				{event("a", 4.5, 4, ""), event("b", 9, 6, "")},
			} {
				_, errs := st.batch(t, proc, batch...)
				noErrors(t, errs)
			}
			if proc.FireAtEnd {
				st.end(t, proc)
			}
			if checked.fired == 0 {
				t.Fatal("no timer fired")
			}
		})
	}
}

// prefetchDedupe is a dedupe stage "st" of the keys msg.user within 2 minutes of msg.at.
const prefetchDedupe = `
stage "st" {
  kind       = "dedupe"
  input      = topic.in
  output     = topic.a
  key        = msg.user
  event_time = msg.at
  within     = "2m"
}
` + sinkA

// compileLogged compiles the stage "st" of the pipeline src, on a state that logs its reads.
func compileLogged(t *testing.T, src string) (*readLog, StatefulStage) {
	t.Helper()
	st := &readLog{memState: newMemState()}
	st.self = st
	p := plan(t, src)
	st.eventTime = flow.EventTimeOf(p.Stage("st"))
	proc, err := CompileStateful(p.Stage("st"), Env{Node: "st"})
	if err != nil {
		t.Fatal(err)
	}
	return st, proc
}
