package runtime

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Tables at run time. A table's stage (flow.TableKind) keeps each key's row in the state hash of
// its input partition, like any stateful stage. A lookup stage reads it through a tableReader: the
// partition that holds a key is the one the key routes to in the table stage's input (the table's
// topic, or the repartition topic the compiler inserted), found as route.go finds it, and the row
// is the committed value in that partition's state hash. The reads of a batch that the lookup read
// from its stream are one pipeline of an HMGET per partition of the table (GetMany, through
// stages.BatchReader), at the start of the batch; a message made on the way by a stage fused before
// the lookup, or retried, is one HGET. They are in other slots than the lookup's commit: they need
// no atomicity with it, as the lookup never writes the table.
//
// Before a lookup stage processes anything, its table catches up (tableCatchUp): the end of every
// partition of the table's topic is taken when the stage starts in this process, and the stage's
// units wait until the table's chain (the repartition stage, if any, then the table's stage) has
// committed up to there, hop by hop. From then on updates apply as they are committed
// (processing time).

// tableReader reads a table's rows from its stage's state.
type tableReader struct {
	rdb        *redis.Client
	keys       redis.Keys
	topic      string // the table stage's input topic, where its state lives
	partitions int
	stage      string
	versioned  bool // its entries are versions (flow.Table.Versioned), read by stages.TableRow
}

func (t *tableReader) Get(ctx context.Context, key string) ([]byte, bool, error) {
	return t.GetAsOf(ctx, key, time.Time{})
}

func (t *tableReader) GetAsOf(ctx context.Context, key string, at time.Time) ([]byte, bool, error) {
	p := redis.Partition(key, t.partitions)
	entry, found, err := t.rdb.ReadState(ctx, t.keys.State(t.topic, p, t.stage), key)
	if err != nil || !found {
		return nil, false, err
	}
	row, found, err := stages.TableRow(entry, t.versioned, at)
	if err != nil {
		return nil, false, stages.Permanent(err)
	}
	return row, found, nil
}

// GetMany reads the rows of keys with one HMGET per partition of the table they fall in, in one
// pipeline (stages.BatchReader: a lookup's batch).
func (t *tableReader) GetMany(ctx context.Context, keys []string) ([][]byte, error) {
	var hashes []string
	var fields [][]string
	var where [][]int      // each hash's keys' indexes in keys
	index := map[int]int{} // partition -> its index in hashes
	for i, key := range keys {
		p := redis.Partition(key, t.partitions)
		h, ok := index[p]
		if !ok {
			h = len(hashes)
			index[p] = h
			hashes = append(hashes, t.keys.State(t.topic, p, t.stage))
			fields, where = append(fields, nil), append(where, nil)
		}
		fields[h], where[h] = append(fields[h], key), append(where[h], i)
	}
	vals, err := t.rdb.ReadStatesOf(ctx, hashes, fields)
	if err != nil {
		return nil, err
	}
	rows := make([][]byte, len(keys))
	for h := range hashes {
		for j, i := range where[h] {
			if vals[h][j] == nil {
				continue
			}
			// An entry is the row, or a table's versions: the latest row of those, as Get reads it.
			row, found, err := stages.TableRow(vals[h][j], t.versioned, time.Time{})
			if err != nil {
				return nil, stages.Permanent(err)
			}
			if found {
				rows[i] = row
			}
		}
	}
	return rows, nil
}

// tableReaders makes a reader of every table of the plan, for the lookup stages' Env.
func (r *runner) tableReaders() map[string]stages.TableReader {
	out := make(map[string]stages.TableReader, len(r.plan.Tables))
	for _, t := range r.plan.Tables {
		if t.Stage == nil || t.Stage.Input == nil {
			continue
		}
		out[t.Name] = &tableReader{rdb: r.rdb, keys: r.keys, topic: t.Stage.Input.Name, partitions: t.Stage.Input.Partitions,
			stage: t.Stage.Name, versioned: t.Versioned()}
	}
	return out
}

// tableClock reads the watermark of a table, for a stage whose timers follow it (a lookup with
// as_of, stages.StatefulStage.TableTime): the least, over the table's partitions, of its stage's
// own watermark as committed with its state (redis.WatermarkField), a partition whose unit has
// closed at a job's end counting as later than any time. The watermark is committed with the
// table's state, in one step, so every update it covers is there to read; it is read in another
// slot than the reader's commit, which needs no atomicity with it (the reader never writes it).
type tableClock struct {
	rdb *redis.Client
	// hashes and fields are, per partition, its state hash and redis.WatermarkField, then its
	// watermarks hash and the table stage's close mark there (marks.go, closeMarkOf).
	hashes, fields []string
}

// tableClock makes the clock of the named table; nil when the plan has no such table.
func (r *runner) tableClock(name string) *tableClock {
	t := r.plan.Table(name)
	if t == nil || t.Stage == nil || t.Stage.Input == nil {
		return nil
	}
	c := &tableClock{rdb: r.rdb}
	topic, stage := t.Stage.Input.Name, t.Stage.Name
	for p := range t.Stage.Input.Partitions {
		c.hashes = append(c.hashes, r.keys.State(topic, p, stage), r.keys.Watermarks(topic, p))
		c.fields = append(c.fields, redis.WatermarkField, redis.MarkField("stage."+stage, "closed"))
	}
	return c
}

// watermark returns the table's watermark in Unix ms: the least of its partitions', leaving out
// those that have closed (a job's end) and those that have never had one and have gone quiet for
// the table's idle_timeout (an empty partition must not hold every lookup back); 0 while one has
// none yet, math.MaxInt64 once none is left.
func (c *tableClock) watermark(ctx context.Context) (int64, error) {
	values, err := c.rdb.ReadMarkFields(ctx, c.hashes, c.fields)
	if err != nil {
		return 0, err
	}
	least := int64(math.MaxInt64)
	for i := 0; i < len(values); i += 2 {
		mark, _ := redis.ParseMark(values[i+1])
		if mark.Closed {
			continue
		}
		wm, err := strconv.ParseInt(values[i], 10, 64)
		switch {
		case err == nil:
			least = min(least, wm)
		case mark.Idle:
		default:
			return 0, nil // none yet
		}
	}
	return least, nil
}

// tableCatchUp is a lookup stage's wait for its table, shared by the stage's units in this process.
type tableCatchUp struct {
	table string
	hops  []tableHop
	log   interface{ Info(string, ...any) }
	// sources, in a job, are the producing sources of this process that write the table's topic:
	// the ends are taken once they have finished, so that a job looks up a whole table and its
	// result does not depend on timing.
	sources []*producingSource

	mu      sync.Mutex
	hop     int      // the hop being waited for
	targets []string // its partitions' targets: the ends taken of its input; nil before they are
	started time.Time
	done    atomic.Bool
	waiting atomic.Bool // a unit waits now (for the summary and the progress line)
}

// tableHop is a stage of a table's chain: it must have committed up to the targets on its input.
type tableHop struct {
	topic      string
	partitions int
	group      string
}

// newTableCatchUp returns the wait of a stage that looks tables up, nil for one that looks none up.
func newTableCatchUp(s *flow.Stage, n *node) *tableCatchUp {
	tables := s.Tables()
	if len(tables) == 0 {
		return nil
	}
	t := tables[0] // a lookup reads one table
	if t.Stage == nil || t.Stage.Input == nil {
		return nil
	}
	c := &tableCatchUp{table: t.Name, log: n.log}
	if rep := t.Stage.Input.Repartition; rep != nil && rep.Input != nil {
		c.hops = append(c.hops, tableHop{topic: rep.Input.Name, partitions: rep.Input.Partitions, group: redis.Group(rep.Name)})
	}
	c.hops = append(c.hops, tableHop{topic: t.Stage.Input.Name, partitions: t.Stage.Input.Partitions, group: redis.Group(t.Stage.Name)})
	return c
}

// tableCatchUpPoll is how often a waiting lookup asks how far its table has got.
const tableCatchUpPoll = 50 * time.Millisecond

// check reports whether the table has caught up, moving on hop by hop.
func (c *tableCatchUp) check(ctx context.Context, r *runner) (bool, error) {
	if c.done.Load() {
		return true, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started.IsZero() {
		c.started = r.clock.Now()
	}
	for c.hop < len(c.hops) {
		h := c.hops[c.hop]
		streams := r.keys.Streams(h.topic, h.partitions)
		if c.targets == nil {
			if c.hop == 0 && !c.sourcesDone() {
				return false, nil
			}
			ids, err := r.rdb.LastIDs(ctx, streams)
			if err != nil {
				return false, err
			}
			c.targets = ids
		}
		progress, err := r.rdb.GroupsProgress(ctx, streams, h.group)
		if err != nil {
			return false, err
		}
		for p := range streams {
			if !progress[p].Committed(c.targets[p]) {
				return false, nil
			}
		}
		c.hop, c.targets = c.hop+1, nil
	}
	if !c.done.Swap(true) {
		c.log.Info("the table has caught up with its topic; looking up", "table", c.table,
			"waited", r.clock.Now().Sub(c.started).Round(time.Millisecond).String())
	}
	return true, nil
}

// sourcesDone reports whether the sources a job's table waits for have finished, with everything
// they produced written.
func (c *tableCatchUp) sourcesDone() bool {
	for _, p := range c.sources {
		if !p.done.Load() || p.unwritten.Load() > 0 {
			return false
		}
	}
	return true
}

// waitForSources makes the lookups of a job wait for the sources of this process that write their
// tables' topics (tableCatchUp.sources).
func (r *runner) waitForSources() {
	for _, n := range r.nodes {
		c := n.catchUp
		if c == nil {
			continue
		}
		for _, p := range r.producers {
			if p.output != nil && p.output.Name == c.hops[0].topic {
				c.sources = append(c.sources, p)
			}
		}
	}
}

// waitForTables holds a unit back until the tables that its nodes look up have caught up; false
// when the run ends first.
func (w *worker) waitForTables(ctx context.Context) bool {
	nodes := []*node{w.u.node}
	if c := w.u.node.chain; c != nil {
		nodes = c.nodes
	}
	for _, n := range nodes {
		c := n.catchUp
		if c == nil || c.done.Load() {
			continue
		}
		logged := false
		for ctx.Err() == nil {
			done, err := c.check(ctx, w.r)
			if err != nil {
				if ctx.Err() != nil || !w.r.redisFailed(n.typ+" "+n.name+" waiting for table "+c.table, err) {
					return false
				}
				w.backoff.wait(ctx, w.r.clock, &w.r.jitter)
				continue
			}
			w.r.outage.OK()
			w.backoff.reset()
			if done {
				break
			}
			if !logged && !c.waiting.Swap(true) {
				logged = true
				n.log.Info("waiting for the table to catch up with its topic before looking up", "table", c.table,
					"chain", c.chain())
			}
			t := w.r.clock.NewTimer(tableCatchUpPoll)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C():
			}
		}
		c.waiting.Store(false)
	}
	return ctx.Err() == nil
}

// chain names the stages the table waits for, in order.
func (c *tableCatchUp) chain() string {
	names := make([]string, len(c.hops))
	for i, h := range c.hops {
		names[i] = "stage." + h.group
	}
	return strings.Join(names, " → ")
}

// catchingUp names the table a node waits for, "" when it does not wait.
func (n *node) catchingUp() string {
	if n.catchUp == nil || n.catchUp.done.Load() || !n.catchUp.waiting.Load() {
		return ""
	}
	return n.catchUp.table
}
