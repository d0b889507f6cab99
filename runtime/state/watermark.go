package state

import (
	"context"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A unit (a stage on one input partition) that feeds a stateful stage, or is one, keeps the
// watermarks of its input partition, one per time domain it needs (flow.StageWatermark), and passes
// them on to the partitions it writes (flow/watermarks.go has the rule). Its input's watermark is
// either followed or measured:
//
//   - Followed, when sources or stages of the pipeline write the input: it is the least of the
//     writers' marks in the partition's watermarks hash, and counts once the unit has processed its
//     stream up to where it stood when the marks were read. A writer that has no mark yet holds it
//     back; one that has been idle since before it had one is left out; one that closed (a job's
//     end) counts as later than any time.
//   - Measured, when only the outside writes it: the latest event time read there. A partition
//     that is idle for the idle timeout, with nothing pending, moves it on with the clock.
//
// A stateful unit's own watermark is its input's in its own domain, persisted with its state and
// never going back. What a unit passes on is its input's watermark, or, to the readers of results
// of its own (an aggregate's windows), what the kind says the earliest later result can carry
// (stages.OutputWatermarker), held back by its holds. The marks are written with the commit that
// writes the outputs they follow.

// Spec is what a unit's Watermarks need to know of it, made once.
type Spec struct {
	Domains []flow.TimeDomain
	Own     int // the index in Domains of a stateful stage's own domain; -1
	// Stateful: the unit keeps its own watermark in its state (Load), and what it measures of
	// other domains besides (Resume).
	Stateful bool
	// Measures: the unit measures its input (see above); otherwise it follows Writers, by their
	// names in the marks of the input partition's watermarks hash, Marks.
	Measures    bool
	IdleTimeout time.Duration // measuring units: 0, never idle
	// Carries lists the domains (by index) whose watermark a measuring unit puts in the headers of
	// the messages it passes on (stages.WatermarkHeader).
	Carries []int
	Writers []string
	Marks   string
	Stream  string // the input partition
	Group   string
	Outputs []Output
	// Close is where the unit says that it has closed (a job's end), for the end test of the jobs
	// that run it, in whichever process: a field of a watermarks hash.
	Close CloseMark
}

// CloseMark is the field of a watermarks hash that says that a unit has closed ("closed:").
type CloseMark struct {
	Hash, Field string
}

// Output is where a unit passes its watermarks on: the partitions it writes of one topic.
type Output struct {
	Hashes []string // their watermarks hashes
	Writer string   // the unit's name as their writer: "stage.NAME:P"
	Names  []string // the topic's domains
	// From is, for each of Names, the index in Spec.Domains of the watermark passed on; unused
	// for Results.
	From    []int
	Results bool // the unit writes results of its own there: OutputWatermark gives the marks
}

// Watermarks are a unit's watermarks while it runs.
type Watermarks struct {
	spec Spec
	in   []int64 // committed, per domain, in Unix ms; 0: none yet
	// idle says, for a domain without a watermark, that its writers are all idle (or, measured,
	// that the partition has been idle since before it had one): what the unit passes on.
	idle   []bool
	closed bool // the input is closed: a job's end
	// pending is the writers' minimum read before a batch, and until the stream's last entry then:
	// it counts once the unit has processed the stream that far.
	pending      []int64
	pendingUntil string
	// next is what the batch being processed makes of in, once committed; nextClosed its close.
	next       []int64
	nextIdle   []bool
	nextClosed bool
	// idleSince is when a measuring unit's reads began to find nothing; idleMoved how far its
	// watermarks have moved with the clock since.
	idleSince time.Time
	idleMoved time.Duration
	loaded    bool
	resumed   bool // a measuring unit has read back what it measured when it last committed
	// persisted is what a measuring unit's state hash holds of what it measured (Resume), and
	// measuring what the commit in progress writes there (Measured).
	persisted, measuring string
	reached              bool   // the batch in progress takes the pending minimum
	lastAllIdle          []bool // per domain, as the last read of the writers found: every one idle or closed
	// published holds what the unit last wrote to each mark ("hash|field"), to write only changes.
	published map[string]string
	written   map[string]string // what the commit in progress writes, published once it is done
	// held is the domain (an index in spec.Domains; -1: none) that the batch in progress holds
	// back at heldAt in what it passes on (HoldPassedOn).
	held   int
	heldAt int64
}

// NewWatermarks starts a unit's watermarks.
func NewWatermarks(spec Spec) *Watermarks {
	n := len(spec.Domains)
	return &Watermarks{spec: spec, in: make([]int64, n), idle: make([]bool, n), next: make([]int64, n),
		nextIdle: make([]bool, n), published: map[string]string{}, held: -1}
}

// HoldPassedOn keeps the watermark that the batch in progress passes on in domain d (an index in
// the spec's Domains; -1: none) at or before at, in Unix ms (0: no hold): a stage that delays
// messages (flow.Kind.Delays) holds it at its earliest waiting message's time, which it passes on
// later.
func (w *Watermarks) HoldPassedOn(d int, at int64) { w.held, w.heldAt = d, at }

// Measures reports whether the unit measures its input rather than following its writers.
func (w *Watermarks) Measures() bool { return w.spec.Measures }

// Closed reports whether the unit's input is closed (committed).
func (w *Watermarks) Closed() bool { return w.closed }

// Load reads a stateful unit's own watermark as it was committed (in its state hash), once.
func (w *Watermarks) Load(ctx context.Context, store Store, hash string) error {
	if w.loaded || w.spec.Own < 0 {
		return nil
	}
	wm, err := LoadWatermark(ctx, store, hash)
	if err != nil {
		return err
	}
	w.in[w.spec.Own] = max(w.in[w.spec.Own], wm)
	w.loaded = true
	return nil
}

// Resume starts a measuring unit from what it had measured when it last committed, which it keeps
// in its state hash (hash, in its input partition's slot), written with its acks (Measured). A unit
// that starts again after a crash, or takes a partition back, then measures on from there, as if it
// had never stopped: the messages it passes on carry the watermarks they would have carried
// (stages.WatermarkHeader), whatever the crash. From nothing, they would carry less, and a message
// late where it entered would not be late any more.
func (w *Watermarks) Resume(ctx context.Context, store Store, hash string) error {
	if !w.spec.Measures || w.resumed || hash == "" {
		return nil
	}
	raw, found, err := store.ReadState(ctx, hash, redis.MeasuredField)
	if err != nil {
		if !redis.Unrecoverable(err) {
			err = stages.Transient(err)
		}
		return err
	}
	if found {
		for _, line := range strings.Split(string(raw), "\n") {
			i := strings.LastIndexByte(line, '=')
			if i < 0 {
				continue
			}
			at, err := strconv.ParseInt(line[i+1:], 10, 64)
			d := slices.IndexFunc(w.spec.Domains, func(d flow.TimeDomain) bool { return d.Name == line[:i] })
			if err != nil || d < 0 {
				continue // a domain the pipeline no longer reads
			}
			w.in[d] = max(w.in[d], at)
			w.next[d] = max(w.next[d], at) // the batch in progress began before it resumed
		}
	}
	w.persisted = string(raw)
	w.resumed = true
	return nil
}

// Measured returns what a measuring unit writes to its state hash (redis.MeasuredField) with the
// commit of the batch in progress: its watermarks as the batch leaves them, one "domain=ms" a line
// (a stateful unit's own domain aside: its state's watermark has it); nil when they have not moved
// since it last wrote them.
func (w *Watermarks) Measured() []byte {
	if !w.spec.Measures || !w.resumed {
		return nil
	}
	var b []byte
	for d, dom := range w.spec.Domains {
		if w.next[d] <= 0 || w.spec.Stateful && d == w.spec.Own {
			continue
		}
		if len(b) > 0 {
			b = append(b, '\n')
		}
		b = append(b, dom.Name...)
		b = append(b, '=')
		b = strconv.AppendInt(b, w.next[d], 10)
	}
	if string(b) == w.persisted {
		return nil
	}
	w.measuring = string(b)
	return b
}

// Own returns the unit's own watermark as the batch leaves it, in Unix ms; 0 when it has none.
func (w *Watermarks) Own() int64 {
	if w.spec.Own < 0 {
		return 0
	}
	return max(w.in[w.spec.Own], w.next[w.spec.Own])
}

// Committed returns the unit's own watermark as committed: what a batch's messages of a followed
// input are judged by.
func (w *Watermarks) Committed() int64 {
	if w.spec.Own < 0 {
		return 0
	}
	return w.in[w.spec.Own]
}

// Begin starts a batch: next starts from what is committed.
func (w *Watermarks) Begin() {
	copy(w.next, w.in)
	copy(w.nextIdle, w.idle)
	w.nextClosed = w.closed
	w.written, w.reached = nil, false
}

// Follow reads the writers' marks before a batch of a followed input is processed, unless a minimum
// read before is still waiting for the stream to be processed to where it stood.
func (w *Watermarks) Follow(ctx context.Context, store Store) error {
	if w.spec.Measures || w.pending != nil {
		return nil
	}
	least, _, until, err := w.readWriters(ctx, store)
	if err != nil || least == nil {
		return err
	}
	for d, at := range least {
		if at > w.in[d] {
			w.pending, w.pendingUntil = least, until
			return nil
		}
	}
	return nil
}

// Reached tells a followed unit that the batch has processed its stream up to last (the batch's
// greatest ID): a minimum read when the stream stood there or before counts now.
func (w *Watermarks) Reached(last string) {
	if w.pending == nil || last == "" {
		return
	}
	if c, err := redis.CompareIDs(last, w.pendingUntil); err != nil || c < 0 {
		return
	}
	for d, at := range w.pending {
		w.next[d] = max(w.next[d], at)
		if at > 0 {
			w.nextIdle[d] = false
		}
	}
	w.reached = true
}

// Observe measures the event times of a batch's messages, in their order, for a measuring unit,
// and returns the unit's own watermark as of each (the latest of its own domain so far, the
// message itself included).
func (w *Watermarks) Observe(msgs []*stages.Message) []int64 {
	if !w.spec.Measures {
		return nil
	}
	var own []int64
	if w.spec.Own >= 0 {
		own = make([]int64, len(msgs))
	}
	for i, m := range msgs {
		for d, dom := range w.spec.Domains {
			at, ok := EventTime(dom, m)
			if ok && at > w.next[d] {
				w.next[d], w.nextIdle[d] = at, false
			}
		}
		if own != nil {
			own[i] = w.next[w.spec.Own]
		}
		if len(w.spec.Carries) > 0 {
			headers := make(map[string]string, len(m.Headers)+len(w.spec.Carries))
			for k, v := range m.Headers {
				headers[k] = v
			}
			for _, d := range w.spec.Carries {
				if w.next[d] > 0 {
					headers[stages.WatermarkHeaderOf(w.spec.Domains[d].Name)] = strconv.FormatInt(w.next[d], 10)
				}
			}
			m.Headers = headers
		}
	}
	if len(msgs) > 0 {
		w.idleSince, w.idleMoved = time.Time{}, 0
	}
	return own
}

// EventTime is a message's event time in a domain, in Unix ms; false when it has none that can
// be read (the stage that reads it dead-letters it).
func EventTime(d flow.TimeDomain, m *stages.Message) (int64, bool) {
	at, err := stages.EventTime(d.Expr, m)
	if err != nil {
		return 0, false
	}
	return at.UnixMilli(), true
}

// Idle is a turn of a unit whose read found nothing. A followed unit with nothing left to process
// takes the writers' minimum at once (everything written before their marks has been processed)
// and closes when they all have; a measuring unit that has been idle for its idle timeout, with
// nothing left to process, moves its watermarks on by the time that passed since (or, before it
// had any, says it is idle), and closes at a job's end (closing). caughtUp says whether the unit
// has nothing pending, no retry waiting and no lag; it is asked only when needed. It reports
// whether anything changed, for the caller to commit.
func (w *Watermarks) Idle(ctx context.Context, store Store, now time.Time, closing bool, caughtUp func() (bool, error)) (bool, error) {
	if w.closed {
		return false, nil
	}
	if !w.spec.Measures {
		least, closed, _, err := w.readWriters(ctx, store)
		if err != nil || least == nil {
			return false, err
		}
		if ok, err := caughtUp(); err != nil || !ok {
			return false, err
		}
		changed := false
		for d, at := range least {
			if at > w.next[d] {
				w.next[d], w.nextIdle[d], changed = at, false, true
			}
			if at == 0 && !w.nextIdle[d] && w.next[d] == 0 && w.allIdle(d) {
				w.nextIdle[d], changed = true, true
			}
		}
		if closed {
			w.nextClosed, changed = true, true
		}
		w.reached = true
		return changed, nil
	}
	if closing {
		if ok, err := caughtUp(); err != nil || !ok {
			return false, err
		}
		w.nextClosed = true
		return true, nil
	}
	if w.spec.IdleTimeout <= 0 {
		return false, nil
	}
	if w.idleSince.IsZero() {
		w.idleSince, w.idleMoved = now, 0
		return false, nil
	}
	due := now.Sub(w.idleSince) - w.spec.IdleTimeout - w.idleMoved
	if due <= 0 {
		return false, nil
	}
	if ok, err := caughtUp(); err != nil || !ok {
		return false, err
	}
	changed := false
	for d := range w.next {
		switch {
		case w.next[d] > 0:
			w.next[d] += due.Milliseconds()
			changed = true
		case !w.nextIdle[d]:
			w.nextIdle[d], changed = true, true
		}
	}
	w.idleMoved += due
	return changed, nil
}

// allIdle is set by readWriters: whether every writer of the last read was idle or closed in
// domain d.
func (w *Watermarks) allIdle(d int) bool { return w.lastAllIdle != nil && w.lastAllIdle[d] }

// readWriters reads the marks of the input's writers and returns, per domain, the least of them
// (0 for a domain some writer has no mark of yet, or all are idle), whether every writer has
// closed, and the stream's last ID as of the read; nil when the input has no writers.
func (w *Watermarks) readWriters(ctx context.Context, store Store) ([]int64, bool, string, error) {
	if len(w.spec.Writers) == 0 {
		return nil, false, "", nil
	}
	fields, until, err := store.ReadMarks(ctx, w.spec.Marks, w.spec.Stream)
	if err != nil {
		if !redis.Unrecoverable(err) {
			err = stages.Transient(err)
		}
		return nil, false, "", err
	}
	least := make([]int64, len(w.spec.Domains))
	if w.lastAllIdle == nil {
		w.lastAllIdle = make([]bool, len(w.spec.Domains))
	}
	closed := true
	for d, dom := range w.spec.Domains {
		var low, closedLow int64 = math.MaxInt64, math.MaxInt64
		missing, values := false, false
		for _, writer := range w.spec.Writers {
			raw, ok := fields[redis.MarkField(writer, dom.Name)]
			if !ok {
				missing, closed = true, false
				continue
			}
			m, err := redis.ParseMark(raw)
			if err != nil {
				missing, closed = true, false
				continue
			}
			switch {
			case m.Closed:
				if m.At > 0 {
					closedLow = min(closedLow, m.At)
				}
			case m.At > 0:
				values, closed = true, false
				low = min(low, m.At)
			case m.Idle:
				closed = false
			default:
				missing, closed = true, false
			}
		}
		w.lastAllIdle[d] = !missing && !values
		switch {
		case !missing && values:
			least[d] = low
		case closed && closedLow < math.MaxInt64:
			// Every writer has closed: later than any time for this job, and for the next one,
			// which takes the closes back, the least of what they had said.
			least[d] = closedLow
		}
	}
	return least, closed, until, nil
}

// Marks returns the marks that the batch in progress writes, where they changed: for each output,
// the watermarks as the batch leaves them. results gives the watermark of the unit's own results,
// in Unix ms (0: none yet), for Results outputs.
func (w *Watermarks) Marks(results func() int64) []redis.MarkWrite {
	var out []redis.MarkWrite
	var resultsAt int64
	resultsDone := false
	for _, o := range w.spec.Outputs {
		fields := map[string]string{}
		for i, name := range o.Names {
			var m redis.Mark
			if o.Results {
				if !resultsDone {
					resultsAt, resultsDone = results(), true
				}
				m.At = resultsAt
				if m.At <= 0 && w.spec.Own >= 0 {
					m.At, m.Idle = 0, w.nextIdle[w.spec.Own]
				}
			} else {
				d := o.From[i]
				m.At, m.Idle = w.next[d], w.next[d] == 0 && w.nextIdle[d]
				if d == w.held && w.heldAt > 0 && (m.Idle || m.At > w.heldAt) {
					m.At, m.Idle = w.heldAt, false
				}
			}
			m.Closed = w.nextClosed
			if m.At < 0 {
				m.At = 0
			}
			if m.At == 0 && !m.Idle && !m.Closed {
				continue // nothing to say yet
			}
			fields[redis.MarkField(o.Writer, name)] = m.String()
		}
		if len(fields) == 0 {
			continue
		}
		for _, h := range o.Hashes {
			changed := map[string]string{}
			for f, v := range fields {
				if w.published[h+"|"+f] != v {
					changed[f] = v
				}
			}
			if len(changed) == 0 {
				continue
			}
			out = append(out, redis.MarkWrite{Hash: h, Fields: changed})
			if w.written == nil {
				w.written = map[string]string{}
			}
			for f, v := range changed {
				w.written[h+"|"+f] = v
			}
		}
	}
	if own := w.spec.Own; w.spec.Close.Hash != "" && (w.nextClosed || own >= 0) {
		// Where the unit says that it closed, it also says, until then, that its own time has no
		// watermark and its input has gone quiet: a table's lookups as_of do not wait for such a
		// partition of the table (runtime/tables.go).
		f, v := w.spec.Close.Field, redis.Mark{Closed: true}.String()
		if !w.nextClosed {
			v = redis.Mark{Idle: w.next[own] == 0 && w.nextIdle[own]}.String()
		}
		if w.published[w.spec.Close.Hash+"|"+f] != v {
			out = append(out, redis.MarkWrite{Hash: w.spec.Close.Hash, Fields: map[string]string{f: v}})
			if w.written == nil {
				w.written = map[string]string{}
			}
			w.written[w.spec.Close.Hash+"|"+f] = v
		}
	}
	return out
}

// Commit makes what the batch in progress did to the watermarks committed: its commit is done.
func (w *Watermarks) Commit() {
	copy(w.in, w.next)
	if w.measuring != "" {
		w.persisted, w.measuring = w.measuring, ""
	}
	copy(w.idle, w.nextIdle)
	w.closed = w.nextClosed
	if w.reached {
		w.pending = nil
	}
	for k, v := range w.written {
		w.published[k] = v
	}
	w.written, w.reached = nil, false
}

// Ahead makes what the batch in progress did to the watermarks the start of the next batch before
// its commit is done, for a worker that processes the next batch while the last one commits: as
// Commit, but it returns the watermarks as they were, for Undo should that commit not end well.
func (w *Watermarks) Ahead() *Watermarks {
	saved := *w
	saved.in, saved.idle = slices.Clone(w.in), slices.Clone(w.idle)
	saved.next, saved.nextIdle = slices.Clone(w.next), slices.Clone(w.nextIdle)
	saved.lastAllIdle = slices.Clone(w.lastAllIdle)
	saved.written = maps.Clone(w.written)
	w.Commit()
	return &saved
}

// Undo takes the watermarks back to what Ahead returned: the commit it ran ahead of did not end
// well, and the batch processed meanwhile is given up. Every mark is written again (Republish):
// what was published may include the failed commit's marks, or may not.
func (w *Watermarks) Undo(saved *Watermarks) {
	*w = *saved
	w.Republish()
}

// Republish forgets what was published, so that the next batch writes every mark again, and a
// measuring unit resumes from its state hash again (a lost lease: another process may have written
// them since).
func (w *Watermarks) Republish() {
	clear(w.published)
	w.resumed = false
}

// KeepOpen keeps the unit's input from closing with the batch in progress: it has timers left to
// fire, which a later turn closes after.
func (w *Watermarks) KeepOpen() { w.nextClosed = w.closed }

// Closing reports whether the batch in progress closes the unit's input (a job's end).
func (w *Watermarks) Closing() bool { return w.nextClosed && !w.closed }
