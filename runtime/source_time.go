package runtime

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime/state"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A producing source whose topic feeds a stateful stage is a writer of that topic's watermarks
// (flow/watermarks.go): in each time domain its readers need, the latest event time it has
// written, set in every partition's watermarks hash with the batch that wrote it. The entry's own
// time, for stages without event_time, is the time the batch is written, which the entries carry
// in a header (stages.EventTimeHeader). A source that has written nothing for its topic's idle
// timeout moves its watermarks on with the clock, and a job's end closes them.

// sourceTime is a producing source's watermarks.
type sourceTime struct {
	r       *sourceRun
	src     *producingSource
	domains []flow.TimeDomain
	hashes  []string // every partition's watermarks hash
	writer  string   // "source.NAME"
	idle    time.Duration

	mu     sync.Mutex // the writer's batches and the idle turns
	at     []int64    // what is written, per domain, in Unix ms
	idleAt []bool     // per domain without a watermark: the source said it is idle
	closed bool
	// lastWrite is when the source last wrote; idleMoved how far the idle turns have moved the
	// watermarks since.
	lastWrite time.Time
	idleMoved time.Duration
	resumed   bool
}

func (r *sourceRun) newSourceTime(p *producingSource) *sourceTime {
	tw := p.output.Watermark
	if tw == nil {
		return nil
	}
	t := &sourceTime{r: r, src: p, domains: tw.Domains, writer: "source." + p.node.name, idle: tw.IdleTimeout,
		at: make([]int64, len(tw.Domains)), idleAt: make([]bool, len(tw.Domains))}
	for q := range p.output.Partitions {
		t.hashes = append(t.hashes, r.keys.Watermarks(p.output.Name, q))
	}
	return t
}

// measure returns a message's event times, per domain (0 where it has none that can be read, and
// for the entry's time, which the batch gives it).
func (t *sourceTime) measure(m *stages.Message) []int64 {
	times := make([]int64, len(t.domains))
	for d, dom := range t.domains {
		if dom.Expr == nil {
			continue
		}
		if at, ok := state.EventTime(dom, m); ok {
			times[d] = at
		}
	}
	return times
}

// resume takes the watermarks the source wrote in an earlier run, once, so that a restart does not
// say less than was said.
func (t *sourceTime) resume(ctx context.Context) {
	if t.resumed {
		return
	}
	fields, _, err := t.r.rdb.ReadMarks(ctx, t.hashes[0], t.r.keys.Stream(t.src.output.Name, 0))
	if err != nil {
		return
	}
	for d, dom := range t.domains {
		if m, err := redis.ParseMark(fields[redis.MarkField(t.writer, dom.Name)]); err == nil && m.At > t.at[d] {
			t.at[d] = m.At
		}
	}
	t.resumed = true
}

// write commits a batch of the source's writer with the marks it moves: lock, marks, commit,
// and the marks count once the commit is done.
func (t *sourceTime) write(batch []sourceItem, args *redis.CommitArgs, commit func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resume(t.r.hard)
	now := t.r.clock.Now()
	next := append([]int64(nil), t.at...)
	for i := range batch {
		it := &batch[i]
		if it.rejected {
			continue
		}
		headers := make(map[string]string, len(args.Outputs[i].Entry.Headers)+len(t.domains))
		for k, v := range args.Outputs[i].Entry.Headers {
			headers[k] = v
		}
		for d, dom := range t.domains {
			at := it.times[d]
			if dom.Expr == nil {
				at = now.UnixMilli()
				headers[stages.EventTimeHeader] = strconv.FormatInt(at, 10)
			}
			next[d] = max(next[d], at)
			if dom.Expr != nil && next[d] > 0 {
				// What was late where it entered is late wherever it goes (stages.WatermarkHeader).
				headers[stages.WatermarkHeaderOf(dom.Name)] = strconv.FormatInt(next[d], 10)
			}
		}
		args.Outputs[i].Entry.Headers = headers
	}
	args.Marks = t.marks(next, false)
	if err := commit(); err != nil {
		return err
	}
	t.at, t.lastWrite, t.idleMoved = next, now, 0
	for d := range t.at {
		if t.at[d] > 0 {
			t.idleAt[d] = false
		}
	}
	return nil
}

// marks are the source's marks for the watermarks at, in every partition.
func (t *sourceTime) marks(at []int64, closed bool) []redis.MarkWrite {
	fields := map[string]string{}
	for d, dom := range t.domains {
		m := redis.Mark{At: at[d], Idle: at[d] == 0 && t.idleAt[d], Closed: closed}
		if m.At == 0 && !m.Idle && !m.Closed {
			continue
		}
		fields[redis.MarkField(t.writer, dom.Name)] = m.String()
	}
	if len(fields) == 0 {
		return nil
	}
	out := make([]redis.MarkWrite, len(t.hashes))
	for i, h := range t.hashes {
		out[i] = redis.MarkWrite{Hash: h, Fields: fields}
	}
	return out
}

// run turns the idle source's watermarks until ctx ends: once it has written nothing for its idle
// timeout (with nothing waiting to be written), they move on by the time that passes on the clock,
// and before it has written anything it says it is idle. At a job's end (closing) it closes them.
func (t *sourceTime) run(ctx context.Context) {
	every := t.idle / 4
	if t.idle <= 0 || every > time.Second {
		every = time.Second
	}
	every = max(every, time.Millisecond)
	ticker := t.r.clock.NewTicker(every)
	defer ticker.Stop()
	t.mu.Lock()
	if t.lastWrite.IsZero() {
		t.lastWrite = t.r.clock.Now()
	}
	t.mu.Unlock()
	for {
		if t.r.closing.Load() && t.src.done.Load() {
			t.close(ctx)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		case <-t.r.closeSources:
		}
		t.r.activity.add(1)
		t.turn(ctx)
		t.r.activity.add(-1)
	}
}

// turn is one idle turn (see run).
func (t *sourceTime) turn(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.idle <= 0 || t.closed || t.src.unwritten.Load() > 0 {
		return
	}
	t.resume(ctx)
	due := t.r.clock.Now().Sub(t.lastWrite) - t.idle - t.idleMoved
	if due <= 0 {
		return
	}
	next := append([]int64(nil), t.at...)
	for d := range next {
		if next[d] > 0 {
			next[d] += due.Milliseconds()
		} else {
			t.idleAt[d] = true
		}
	}
	if err := t.r.rdb.WriteMarks(ctx, t.marks(next, false)); err != nil {
		t.r.log.Debug("cannot move an idle source's watermarks", "source", t.src.node.name, "err", err)
		return
	}
	t.at, t.idleMoved = next, t.idleMoved+due
}

// close closes the source's watermarks at a job's end: it will write nothing more.
func (t *sourceTime) close(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.resume(ctx)
	for ctx.Err() == nil {
		err := t.r.rdb.WriteMarks(ctx, t.marks(t.at, true))
		if err == nil {
			break
		}
		if !t.r.redisFailed("source "+t.src.node.name+" closing its watermarks", err) {
			return
		}
		var b backoff
		b.wait(ctx, t.r.clock, &t.r.jitter)
	}
	t.closed = true
	t.r.kickDrain()
	_ = t.r.rdb.UnblockReads(context.Background()) // its readers may close now
}
