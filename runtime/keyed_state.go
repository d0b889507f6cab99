package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// A stateful stage (StageTraits.Stateful) keeps per-key state and timers in its input partition's
// hash slot (Keys.State, Keys.Timers). Each attempt at a message writes into a view of its own
// (attemptState); a successful attempt's writes join its batch's (batchState), and the batch's
// commit writes them with the acks in one fenced step (CommitArgs.State). A failed attempt's writes
// are dropped with it; a batch that is not committed (a lost lease, a crash) drops all of them, and
// the partition's next owner processes the batch again from the committed state.

// warnIfStateMayBeEvicted says at start when the server may evict a stateful stage's state, which has
// no time to live: under memory pressure an allkeys-* policy would drop windows and dedupe keys.
func (r *runner) warnIfStateMayBeEvicted(ctx context.Context) {
	var stateful []string
	for _, n := range r.nodes {
		if n.stateful {
			stateful = append(stateful, n.name)
		}
	}
	if len(stateful) == 0 {
		return
	}
	policy, err := r.rdb.EvictsKeysWithoutTTL(ctx)
	switch {
	case err != nil:
		r.log.Debug("cannot tell whether Redis may evict the state of stateful stages", "err", err)
	case policy != "":
		r.log.Warn("Redis may evict keys without a time to live under memory pressure, which would lose the state of stateful stages; "+
			"set maxmemory-policy to noeviction or a volatile-* policy", "maxmemory_policy", policy, "stages", strings.Join(stateful, ", "))
	}
}

// batchState collects the state writes of one batch of one partition.
type batchState struct {
	rdb          *redis.Client
	hash, timers string
	partition    int // the input partition, for the kind's errors (stages.PartitionOf)

	mu      sync.Mutex // lanes of the batch write concurrently (different keys)
	set     map[string][]byte
	del     map[string]bool
	timerAt map[string]int64
	cancel  map[string]bool
	// watermark is the partition's largest event time, in Unix ms, once loaded (watermarkLoaded)
	// from the state hash; moved says the batch moved it.
	watermark       int64
	watermarkLoaded bool
	moved           bool
	// late, duplicates and dropped are the batch's recorded outcomes, counted once it commits.
	late, duplicates, dropped int64
	// followsWriters: the watermark is the writers' of a repartition topic, which the stage's own
	// observations do not move (watermark_writers.go).
	followsWriters bool
	// fetched holds the committed values of the keys read ahead for the batch (prefetch), nil for
	// a key the state does not hold.
	fetched map[string][]byte
}

// prefetch reads the state keys that the batch's messages will read (stages.StatePrefetcher) in
// one round trip. The partition's lease keeps every other process from writing its state, so the
// values stay committed ones until the batch commits its own writes, which Get reads first. A
// failed read is no error: Get then reads each key when it is asked.
func (b *batchState) prefetch(ctx context.Context, p stages.StatePrefetcher, msgs []*message) {
	var keys []string
	for _, m := range msgs {
		keys = p.StateKeys(&m.msg, keys)
	}
	if len(keys) == 0 {
		return
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	vals, err := b.rdb.ReadStates(ctx, b.hash, keys)
	if err != nil {
		return
	}
	b.fetched = make(map[string][]byte, len(keys))
	for i, k := range keys {
		b.fetched[k] = vals[i]
	}
}

func (r *runner) newBatchState(u *unit) *batchState {
	return &batchState{rdb: r.rdb, hash: r.keys.State(u.node.input.Name, u.partition, u.node.name),
		timers: r.keys.Timers(u.node.input.Name, u.partition, u.node.name), followsWriters: u.node.writers != nil,
		partition: u.partition}
}

// writes are the batch's state changes for its commit; nil when it changed nothing.
func (b *batchState) writes() *redis.StateWrites {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.set)+len(b.del)+len(b.timerAt)+len(b.cancel) == 0 && !b.moved {
		return nil
	}
	w := &redis.StateWrites{Key: b.hash, TimersKey: b.timers, Set: b.set, Timers: b.timerAt}
	if b.moved {
		w.Set = put(w.Set, redis.WatermarkField, []byte(strconv.FormatInt(b.watermark, 10)))
	}
	for k := range b.del {
		w.Delete = append(w.Delete, k)
	}
	for k := range b.cancel {
		w.Cancel = append(w.Cancel, k)
	}
	return w
}

// attemptState is one attempt's writes, over its batch's.
type attemptState struct {
	batch    *batchState
	set      map[string][]byte
	del      map[string]bool
	timerAt  map[string]int64
	cancel   map[string]bool
	observed int64 // the largest event time the attempt observed, Unix ms; 0: none
	// late and duplicates count the attempt's stages.Record calls.
	late, duplicates int64
}

func (a *attemptState) record(o stages.Outcome) {
	switch o {
	case stages.Late:
		a.late++
	case stages.Duplicate:
		a.duplicates++
	}
}

// join adds a successful attempt's writes to its batch, and its outcomes; dropped says that it
// passed the message on nowhere after recording it late or a duplicate.
func (a *attemptState) join(dropped bool) {
	b := a.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range a.set {
		b.set = put(b.set, k, v)
		delete(b.del, k)
	}
	for k := range a.del {
		delete(b.set, k)
		b.del = put(b.del, k, true)
	}
	for k, at := range a.timerAt {
		b.timerAt = put(b.timerAt, k, at)
		delete(b.cancel, k)
	}
	for k := range a.cancel {
		delete(b.timerAt, k)
		b.cancel = put(b.cancel, k, true)
	}
	b.late, b.duplicates = b.late+a.late, b.duplicates+a.duplicates
	if dropped {
		b.dropped++
	}
	if a.observed > b.watermark {
		// Observe loaded the watermark before it recorded anything (loadWatermark).
		b.watermark, b.moved = a.observed, true
	}
}

// loadWatermark reads the partition's watermark once per batch.
func (b *batchState) loadWatermark(ctx context.Context) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watermarkLoaded {
		return b.watermark, nil
	}
	v, found, err := b.rdb.ReadState(ctx, b.hash, redis.WatermarkField)
	if err != nil {
		if !redis.Unrecoverable(err) {
			err = stages.Transient(err)
		}
		return 0, err
	}
	if found {
		if b.watermark, err = strconv.ParseInt(string(v), 10, 64); err != nil {
			return 0, fmt.Errorf("the watermark in %s is %q, not a time in Unix ms", b.hash, v)
		}
	}
	b.watermarkLoaded = true
	return b.watermark, nil
}

func put[V any](m map[string]V, k string, v V) map[string]V {
	if m == nil {
		m = map[string]V{}
	}
	m[k] = v
	return m
}

type attemptStateKey struct{}

// withAttemptState runs one attempt of a stateful stage with a fresh view of its batch's state, and
// joins the view's writes to the batch when the attempt succeeds. It passes on the attempt's
// outputs, and reports whether the attempt dropped its message: recorded it late or a duplicate and
// passed it on nowhere (late = "drop", duplicates = "drop"). An attempt that fails for good at once
// (a permanent error: the message is dead-lettered) counts its outcomes without its writes, so that
// a late message dead-lettered counts as late too.
func withAttemptState(ctx context.Context, b *batchState, attempt func(context.Context) ([]stages.Output, error)) (outs []stages.Output, dropped bool, err error) {
	a := &attemptState{batch: b}
	ctx = stages.WithPartition(context.WithValue(ctx, attemptStateKey{}, a), b.partition)
	outs, err = attempt(stages.WithOutcomes(ctx, a.record))
	if err != nil {
		if stages.IsPermanent(err) {
			b.mu.Lock()
			b.late, b.duplicates = b.late+a.late, b.duplicates+a.duplicates
			b.mu.Unlock()
		}
		return outs, false, err
	}
	dropped = len(outs) == 0 && a.late+a.duplicates > 0
	a.join(dropped)
	return outs, dropped, nil
}

// stateHandle is the stages.State of a stateful node: it finds the attempt's view in the context.
type stateHandle struct{}

var errNoState = errors.New("stages.State used outside the Process call of a stateful stage")

func attemptOf(ctx context.Context) (*attemptState, error) {
	a, ok := ctx.Value(attemptStateKey{}).(*attemptState)
	if !ok {
		return nil, errNoState
	}
	return a, nil
}

func (stateHandle) Get(ctx context.Context, key string) ([]byte, bool, error) {
	a, err := attemptOf(ctx)
	if err != nil {
		return nil, false, err
	}
	if v, ok := a.set[key]; ok {
		return v, true, nil
	}
	if a.del[key] {
		return nil, false, nil
	}
	b := a.batch
	b.mu.Lock()
	v, set := b.set[key]
	deleted := b.del[key]
	b.mu.Unlock()
	ahead, fetched := b.fetched[key] // written only before the batch's attempts begin
	switch {
	case set:
		return v, true, nil
	case deleted:
		return nil, false, nil
	case fetched:
		return ahead, ahead != nil, nil
	}
	v, found, err := b.rdb.ReadState(ctx, b.hash, key)
	if err != nil && !redis.Unrecoverable(err) {
		// Redis is away: the node pauses and tries again, as for a downstream service, rather than
		// spending the message's attempts (or dead-lettering it) on an outage.
		err = stages.Transient(err)
	}
	return v, found, err
}

// checkKey refuses the keys of the runtime's own fields of the state hash: a kind, or a Go function
// keyed by what its messages say, that wrote one would corrupt the partition's watermark.
func checkKey(key string) error {
	if key == redis.WatermarkField || key == redis.IdleField {
		return stages.Permanent(fmt.Errorf("the state key %q is a field of the runtime's own", key))
	}
	return nil
}

func (stateHandle) Put(ctx context.Context, key string, value []byte) error {
	a, err := attemptOf(ctx)
	if err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		return err
	}
	a.set = put(a.set, key, append([]byte(nil), value...))
	delete(a.del, key)
	return nil
}

func (stateHandle) Delete(ctx context.Context, key string) error {
	a, err := attemptOf(ctx)
	if err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		return err
	}
	delete(a.set, key)
	a.del = put(a.del, key, true)
	return nil
}

func (stateHandle) SetTimer(ctx context.Context, name string, at time.Time) error {
	a, err := attemptOf(ctx)
	if err != nil {
		return err
	}
	a.timerAt = put(a.timerAt, name, at.UnixMilli())
	delete(a.cancel, name)
	return nil
}

func (stateHandle) CancelTimer(ctx context.Context, name string) error {
	a, err := attemptOf(ctx)
	if err != nil {
		return err
	}
	delete(a.timerAt, name)
	a.cancel = put(a.cancel, name, true)
	return nil
}

func (stateHandle) Observe(ctx context.Context, eventTime time.Time) error {
	a, err := attemptOf(ctx)
	if err != nil {
		return err
	}
	if _, err := a.batch.loadWatermark(ctx); err != nil {
		return err
	}
	if !a.batch.followsWriters {
		a.observed = max(a.observed, eventTime.UnixMilli())
	}
	return nil
}

func (stateHandle) Watermark(ctx context.Context) (time.Time, error) {
	a, err := attemptOf(ctx)
	if err != nil {
		return time.Time{}, err
	}
	wm, err := a.batch.loadWatermark(ctx)
	if err != nil {
		return time.Time{}, err
	}
	a.batch.mu.Lock()
	wm = max(wm, a.batch.watermark, a.observed)
	a.batch.mu.Unlock()
	if wm == 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(wm), nil
}

var _ stages.State = stateHandle{}
