package redis

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	goredis "github.com/redis/go-redis/v9"
)

// DefaultDedupTTL is how long an effectively-once marker lives by default. It must cover the
// longest time between writing an output and re-processing its input after a crash (claim idle
// time plus processing). Markers cost about 100 bytes each: at 1,000 messages/s, 10 minutes of
// markers is about 60 MB.
const DefaultDedupTTL = 10 * time.Minute

// Output is one entry a batch writes.
type Output struct {
	// Stream is the output stream key (a topic partition or a dead-letter stream).
	Stream string
	// Entry is the entry to append; its ID is ignored.
	Entry Entry
	// MaxLen, when positive, caps the stream at about that many entries (XADD MAXLEN ~), for
	// streams that other applications read and no retention timer trims. It is ignored with
	// DedupKey, except in a commit without markers (see Commit).
	MaxLen int64
	// Inline keeps the payload in the entry whatever its size (see WithOffloadOver): for streams
	// that other applications read, which expect a payload field.
	Inline bool
	// DedupKey, when set, makes the output effectively-once. On a single server, a commit that
	// settles inputs under a lease writes it without a marker, in one script with the acks (see
	// Commit): such a commit is never made twice. Otherwise the entry is appended only if the
	// marker key does not exist, and the marker (holding the entry's ID) is written in the same
	// script as the XADD. It must share the stream's hash tag (see Keys.Dedup). A repeated
	// commit of the same input then writes nothing and returns the first write's ID.
	DedupKey string

	// staged is the payload key of an entry whose payload (Entry.Large) was staged for the commit
	// (stageLarge).
	staged string
}

// CommitArgs are a batch's outputs and the input entries it acks.
type CommitArgs struct {
	// Outputs are appended, in order per stream.
	Outputs []Output
	// Stream, Group and IDs name the input entries to ack. IDs may be empty (a batch that only
	// writes) and Outputs may be empty (a batch that only acks).
	Stream string
	Group  string
	IDs    []string
	// Lease, when set, fences the ack: it happens only if the lease (whose key must share the
	// input stream's hash tag, see Keys.Lease) still holds Lease.Value(); otherwise Commit
	// returns an error wrapping ErrLeaseLost and acks nothing.
	Lease *Lease
	// DedupTTL is the time to live of the effectively-once markers; default DefaultDedupTTL.
	DedupTTL time.Duration

	// RetryKey is the retry set of the input partition (Keys.Retry, which shares the input
	// stream's hash tag). RetryDone are retries (from ClaimRetries) to remove from it, finished or
	// given up, and Retries are messages to schedule in it. Both happen in the same atomic step
	// as the acks, fenced by the lease like them: a message moved to the retry set is never both
	// acked and lost, nor left unacked and scheduled.
	RetryKey  string
	RetryDone []Retry
	Retries   []Retry

	// State, when set, are a stateful stage's writes for the batch: per-key state and durable
	// timers, applied in the same atomic step as the acks and fenced by the lease like them, so
	// that state never runs ahead of or behind the inputs it was computed from.
	State *StateWrites

	// Checkpoint, when set, records how far a source that produces the outputs has got (a file
	// source's position), in place of acks: a source commit has no input stream. It is written
	// after the outputs, in the same MULTI/EXEC where they share a server, and fenced by Lease,
	// which must then be the source's lease in the checkpoint key's slot.
	Checkpoint *Checkpoint

	// Marks are the watermarks of the writer that commits, for the watermarks hashes of the
	// partitions it writes to (see Keys.Watermarks). They are set after the outputs: in the same
	// atomic step on a single server, and once the outputs and the settle are done on a cluster,
	// so that a reader that sees a mark has the outputs written before it in its stream.
	Marks []MarkWrite

	// commitID, when set, is the ID of a commit made by onceScript in place of a new one: the
	// tests send one commit twice with it.
	commitID string
}

// StateWrites are the state changes of one batch of a stateful stage on one partition. Its keys
// (Keys.State, Keys.Timers) must share the input stream's hash tag.
type StateWrites struct {
	Key       string            // the state hash
	Set       map[string][]byte // per-key values to set
	Delete    []string          // keys whose state to remove
	TimersKey string            // the timer set
	Timers    map[string]int64  // timers to set: name -> due time in Unix ms
	Cancel    []string          // timers to remove
	HoldsKey  string            // the holds set (Keys.Holds)
	Holds     map[string]int64  // holds to set: name -> time in Unix ms
	Release   []string          // holds to remove
}

func (s *StateWrites) empty() bool {
	return s == nil || len(s.Set)+len(s.Delete)+len(s.Timers)+len(s.Cancel)+len(s.Holds)+len(s.Release) == 0
}

// ReadState returns a key's state in a state hash, and false when it has none.
func (c *Client) ReadState(ctx context.Context, hash, key string) ([]byte, bool, error) {
	v, err := c.rdb.HGet(ctx, hash, key).Bytes()
	if isNil(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, wrap(classify(err), "reading state in", hash)
	}
	return v, true, nil
}

// ReadStates returns the values of keys in a state hash, nil for a key it does not hold, in one
// round trip.
func (c *Client) ReadStates(ctx context.Context, hash string, keys []string) ([][]byte, error) {
	vals, err := c.rdb.HMGet(ctx, hash, keys...).Result()
	if err != nil {
		return nil, wrap(classify(err), "reading state in", hash)
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i] = []byte(s)
		}
	}
	return out, nil
}

// StateEntry is a field of a state hash and its value.
type StateEntry struct {
	Key, Value string
}

// ScanState returns a page of the fields of a state hash from cursor on, with their values (HSCAN,
// about count at a time), and the cursor of the next page: 0 after the last. A scan from 0 to 0
// returns every field that the hash held throughout, and may return some twice.
func (c *Client) ScanState(ctx context.Context, hash string, cursor uint64, count int64) ([]StateEntry, uint64, error) {
	pairs, next, err := c.rdb.HScan(ctx, hash, cursor, "", count).Result()
	if err != nil {
		return nil, 0, wrap(classify(err), "reading state in", hash)
	}
	entries := make([]StateEntry, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		entries = append(entries, StateEntry{Key: pairs[i], Value: pairs[i+1]})
	}
	return entries, next, nil
}

// ReadStatesOf returns the values of keys[i] in the state hash hashes[i], for every i, in one
// pipeline (on a cluster, one per node): out[i][j] is keys[i][j]'s value, nil where hashes[i]
// holds none.
func (c *Client) ReadStatesOf(ctx context.Context, hashes []string, keys [][]string) ([][][]byte, error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*goredis.SliceCmd, len(hashes))
	for i, hash := range hashes {
		cmds[i] = pipe.HMGet(ctx, hash, keys[i]...)
	}
	_, _ = pipe.Exec(ctx) // each command's error is its own
	out := make([][][]byte, len(hashes))
	for i, cmd := range cmds {
		vals, err := cmd.Result()
		if err != nil {
			return nil, wrap(classify(err), "reading state in", hashes[i])
		}
		out[i] = make([][]byte, len(vals))
		for j, v := range vals {
			if s, ok := v.(string); ok {
				out[i][j] = []byte(s)
			}
		}
	}
	return out, nil
}

// WatermarkField is the field of a state hash (StateWrites.Key) that holds the partition's
// watermark, in Unix ms: the fields that begin with a NUL byte are the runtime's, not the kind's.
const WatermarkField = "\x00watermark"

// PackedKeysField begins the name of each field of a state hash that holds a batch's keys of a kind
// whose owner keeps its keys in memory (a dedupe's): the field is PackedKeysField and the record's
// number in decimal, and its value the keys the batch set and deleted (docs/redis-keys.md).
const PackedKeysField = "\x00packed:"

// MeasuredField is the field of a unit's state hash that holds the watermarks that a unit which
// measures its input (nothing of the pipeline writes it) has measured, as of its last commit, so
// that it measures on from there after a restart: one "domain=Unix ms" a line.
const MeasuredField = "\x00measured"

// DueTimer is a timer of a timer set (StateWrites.TimersKey) and when it is due, in Unix ms.
type DueTimer struct {
	Name string
	At   int64
}

// DueTimers returns up to count timers of a timer set due at or before until (Unix ms), earliest
// first.
func (c *Client) DueTimers(ctx context.Context, key string, until, count int64) ([]DueTimer, error) {
	zs, err := c.rdb.ZRangeByScoreWithScores(ctx, key, &goredis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(until, 10), Count: count,
	}).Result()
	if err != nil {
		return nil, wrap(classify(err), "reading due timers in", key)
	}
	out := make([]DueTimer, len(zs))
	for i, z := range zs {
		name, _ := z.Member.(string)
		out[i] = DueTimer{Name: name, At: int64(z.Score)}
	}
	return out, nil
}

// Checkpoint is a value that Commit sets at a key together with a batch's outputs.
type Checkpoint struct {
	Key   string
	Value string
}

// ReadCheckpoint returns the checkpoint recorded at key, and false when there is none.
func (c *Client) ReadCheckpoint(ctx context.Context, key string) (string, bool, error) {
	v, err := c.rdb.Get(ctx, key).Result()
	if isNil(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, wrap(err, "reading checkpoint", key)
	}
	return v, true, nil
}

// settles reports whether the commit acks inputs, moves retries or records a checkpoint.
func (a CommitArgs) settles() bool {
	return len(a.IDs) > 0 || len(a.RetryDone) > 0 || len(a.Retries) > 0 || a.Checkpoint != nil || !a.State.empty()
}

// Commit writes a batch's outputs and acks its inputs, and returns the IDs of the outputs in
// the order of a.Outputs.
//
// On a single server (and on a cluster when every key is in the input stream's slot) it is one
// round trip: a MULTI/EXEC pipeline of the XADDs followed by the ack (a fencing script when
// a.Lease is set). Redis rejects a transaction whose commands cannot be queued, out-of-memory
// included, as a whole, so a failed XADD does not leave its input acked. An XADD that fails at
// run time inside EXEC (WRONGTYPE: a non-stream key at an output name) does not stop the
// commands after it, so the ack checks first that every output's key is a stream and acks
// nothing when one is not. Effectively-once outputs are written by a script that can fail at run
// time too (WRONGTYPE, OOM); the ack checks their markers first, likewise. A stateless commit
// under a lease is fenced by WATCH instead of the script, in two round trips (watched.go).
//
// On a cluster with outputs in other slots it is two steps: the outputs (go-redis sends one
// pipeline per node, in parallel), then, only if every output was written, the ack. A cluster
// pipeline runs its per-node parts concurrently, so a single round trip could ack inputs whose
// outputs failed on another node.
//
// When the lease is lost the outputs may have been written (they are duplicates the new owner
// also writes, as at-least-once delivery allows; DedupKey removes them), but nothing is acked
// and the error wraps ErrLeaseLost.
//
// Effectively-once outputs (DedupKey) of a commit that settles inputs under a lease, on a single
// server (not a cluster), are committed by one script instead (onceScript): it checks the lease
// first and writes the outputs, acks, retry moves and state together, or nothing. An input is
// then processed again only if the commit that settles it never ran, so it wrote nothing, and no
// marker is needed: none is written or read. The script also records the commit's ID under the
// lease (LeaseCommit), so that the same call sent twice (a client that retries after a lost
// reply) writes once; the second call returns no IDs. Everywhere else (a cluster, where outputs
// live on other nodes than the acks; a commit without a lease, whose inputs another consumer may
// process too; a source's batch, which is written again after a failure) the markers are kept.
func (c *Client) Commit(ctx context.Context, a CommitArgs) ([]string, error) {
	var err error
	if a.Outputs, err = c.stageLarge(ctx, a.Outputs); err != nil {
		return nil, err
	}
	plan, err := c.planCommit(a)
	if err != nil {
		return nil, err
	}
	if plan.fenced {
		return c.commitFenced(ctx, a, plan)
	}
	if len(a.Outputs) == 0 && (len(a.Marks) == 0 || !plan.atomic) {
		if a.settles() {
			if err := c.settle(ctx, a); err != nil { // a lone ack needs no transaction
				return nil, err
			}
		}
		return nil, c.WriteMarks(ctx, a.Marks)
	}
	if plan.atomic {
		if c.watchable(a, plan) {
			return c.commitWatched(ctx, a, plan)
		}
		return c.commitAtomic(ctx, a, plan)
	}
	ids, err := c.writeOutputs(ctx, c.rdb.Pipeline(), plan)
	if err != nil {
		return ids, err
	}
	if a.settles() {
		if err := c.settle(ctx, a); err != nil {
			return ids, err
		}
	}
	return ids, c.WriteMarks(ctx, a.Marks)
}

// commitPlan is a validated, encoded batch.
type commitPlan struct {
	atomic bool
	// fenced: the commit is one onceScript call; all are its outputs in order, streams their
	// distinct streams and keyOf the index in the script's KEYS of each.
	fenced bool
	all    []plainOutput
	keyOf  map[string]int
	plain  []plainOutput         // outputs without a dedup key, in order
	dedup  map[string]*dedupCall // per stream, outputs with a dedup key
	order  []string              // streams of dedup calls, in first-use order
	// guards are the last marker of each dedup call and the payload key of each offloaded plain
	// output: see settleScript.
	guards []string
	// streams are the streams of the plain outputs, which the settle checks are streams: see
	// settleScript.
	streams []string
	n       int // number of outputs
	ttlMS   int64
}

type plainOutput struct {
	index  int
	stream string
	values []any
	maxLen int64
	off    *offloaded // the payload, when it goes under its own key (see offload.go)
}

type dedupCall struct {
	stream  string
	keys    []string // stream, then markers
	args    []any    // ttl, then per entry: offloadArgs, count, fields
	indexes []int    // output index of each marker
}

func (c *Client) planCommit(a CommitArgs) (*commitPlan, error) {
	p := &commitPlan{n: len(a.Outputs), ttlMS: a.DedupTTL.Milliseconds()}
	if a.DedupTTL <= 0 {
		p.ttlMS = DefaultDedupTTL.Milliseconds()
	} else if p.ttlMS < 1 {
		return nil, fmt.Errorf("redis: commit: dedup ttl %s is below 1ms", a.DedupTTL)
	}
	if a.Checkpoint != nil {
		if a.Stream != "" || len(a.IDs) > 0 || a.RetryKey != "" {
			return nil, errors.New("redis: commit: a checkpoint replaces acks and retries; a commit has one or the other")
		}
		if a.Lease != nil && HashSlot(a.Lease.Key) != HashSlot(a.Checkpoint.Key) {
			return nil, fmt.Errorf("redis: commit: lease %s is not in the hash slot of checkpoint %s; use Keys.SourceLease and Keys.SourcePosition",
				a.Lease.Key, a.Checkpoint.Key)
		}
	} else if a.settles() && (a.Stream == "" || a.Group == "") {
		return nil, errors.New("redis: commit: acking needs the input stream and group")
	}
	if (len(a.RetryDone) > 0 || len(a.Retries) > 0) && HashSlot(a.RetryKey) != HashSlot(a.Stream) {
		return nil, fmt.Errorf("redis: commit: retry set %q is not in the hash slot of stream %s; use Keys.Retry", a.RetryKey, a.Stream)
	}
	if c.fencedOnce(a) {
		return c.planFenced(a, p)
	}
	args := newArgSlab(len(a.Outputs))
	var offloaded []string // the payload keys of plain outputs whose payloads are offloaded
	slot := -1
	sameSlot := true
	last := "" // the key seen last: a batch's outputs mostly go to a few streams in turn
	see := func(key string) {
		// Only a cluster's slots can part a commit: a single server's commit is atomic anyway, and
		// hashing each key cost a source 2% of its CPU (its outputs take the partitions in turn).
		if !c.cluster || key == last {
			return
		}
		last = key
		s := HashSlot(key)
		if slot < 0 {
			slot = s
		} else if s != slot {
			sameSlot = false
		}
	}
	if a.Checkpoint != nil {
		see(a.Checkpoint.Key)
	} else if a.settles() {
		see(a.Stream)
		if a.Lease != nil && HashSlot(a.Lease.Key) != HashSlot(a.Stream) {
			return nil, fmt.Errorf("redis: commit: lease %s is not in the hash slot of stream %s; use Keys.Lease", a.Lease.Key, a.Stream)
		}
	}
	p.plain = make([]plainOutput, 0, len(a.Outputs))
	for i, o := range a.Outputs {
		if o.Stream == "" {
			return nil, fmt.Errorf("redis: commit: output %d has no stream", i)
		}
		values, off, err := c.encodeOutput(&o, args)
		if err != nil {
			return nil, fmt.Errorf("redis: commit: output %d to %s: %w", i, o.Stream, err)
		}
		see(o.Stream)
		if o.DedupKey == "" {
			p.plain = append(p.plain, plainOutput{index: i, stream: o.Stream, values: values, maxLen: o.MaxLen, off: off})
			if off != nil {
				// Its payload key exists after the commit only if its script wrote the entry, and
				// the script writes nothing when one of its writes would fail (a staged payload
				// gone, a command the user may not run, its XADD refused for lack of memory):
				// the stream is a stream all the same, so the settle checks the key.
				offloaded = append(offloaded, off.key)
			}
			continue
		}
		if HashSlot(o.DedupKey) != HashSlot(o.Stream) {
			return nil, fmt.Errorf("redis: commit: dedup key %s is not in the hash slot of stream %s; use Keys.Dedup", o.DedupKey, o.Stream)
		}
		if p.dedup == nil {
			p.dedup = map[string]*dedupCall{}
		}
		d := p.dedup[o.Stream]
		if d == nil {
			d = &dedupCall{stream: o.Stream, keys: []string{o.Stream}, args: []any{p.ttlMS}}
			p.dedup[o.Stream] = d
			p.order = append(p.order, o.Stream)
		}
		d.keys = append(d.keys, o.DedupKey)
		d.args = offloadArgs(d.args, off)
		d.args = append(d.args, len(values))
		d.args = append(d.args, values...)
		d.indexes = append(d.indexes, i)
	}
	for _, s := range p.order {
		d := p.dedup[s]
		p.guards = append(p.guards, d.keys[len(d.keys)-1])
	}
	p.guards = append(p.guards, offloaded...)
	seen := map[string]bool{}
	for _, o := range p.plain {
		if !seen[o.stream] {
			seen[o.stream] = true
			p.streams = append(p.streams, o.stream)
		}
	}
	for _, m := range a.Marks {
		see(m.Hash)
	}
	p.atomic = !c.cluster || sameSlot
	return p, nil
}

// fencedOnce reports whether a commit is made by onceScript: it has an effectively-once output,
// settles inputs under a lease and records no checkpoint, on a single server.
func (c *Client) fencedOnce(a CommitArgs) bool {
	if c.cluster || a.Lease == nil || a.Checkpoint != nil || !a.settles() {
		return false
	}
	for i := range a.Outputs {
		if a.Outputs[i].DedupKey != "" {
			return true
		}
	}
	return false
}

// planFenced encodes the outputs of a commit that onceScript makes.
func (c *Client) planFenced(a CommitArgs, p *commitPlan) (*commitPlan, error) {
	p.fenced, p.atomic = true, true
	p.all = make([]plainOutput, len(a.Outputs))
	p.keyOf = make(map[string]int, 4)
	for i, o := range a.Outputs {
		if o.Stream == "" {
			return nil, fmt.Errorf("redis: commit: output %d has no stream", i)
		}
		values, off, err := c.encodeOutput(&o, nil)
		if err != nil {
			return nil, fmt.Errorf("redis: commit: output %d to %s: %w", i, o.Stream, err)
		}
		p.all[i] = plainOutput{index: i, stream: o.Stream, values: values, maxLen: o.MaxLen, off: off}
		if _, ok := p.keyOf[o.Stream]; !ok {
			p.streams = append(p.streams, o.Stream)
			p.keyOf[o.Stream] = onceFirstOutputKey + len(p.streams) - 1
		}
	}
	return p, nil
}

// onceFirstOutputKey is the index in onceScript's KEYS (from 1) of the first output stream.
const onceFirstOutputKey = 8

// commitFenced makes a commit with onceScript (see Commit).
func (c *Client) commitFenced(ctx context.Context, a CommitArgs, p *commitPlan) ([]string, error) {
	keys, settle, err := settleArgs(a)
	if err != nil {
		return nil, err
	}
	keys = append(keys, LeaseCommit(a.Lease.Key))
	keys = append(keys, p.streams...)
	for _, m := range a.Marks {
		keys = append(keys, m.Hash)
	}
	fields := 0
	for _, o := range p.all {
		fields += len(o.values)
	}
	args := make([]any, 0, 5+5*len(p.all)+fields+len(settle)-2)
	id := a.commitID
	if id == "" {
		id = c.nextCommitID()
	}
	args = append(args, settle[0], settle[1], id, p.ttlMS, len(p.all))
	for _, o := range p.all {
		args = append(args, p.keyOf[o.stream], o.maxLen)
		args = offloadArgs(args, o.off)
		args = append(args, len(o.values))
		args = append(args, o.values...)
	}
	args = append(args, settle[2:]...)
	for _, m := range a.Marks {
		args = append(args, 2*len(m.Fields))
		args = append(args, markArgs(m)...)
	}
	args = append(args, len(a.Marks))
	res, err := onceScript.Run(ctx, c.rdb, keys, args...).Slice()
	if err != nil {
		return nil, wrap(classify(err), "committing the effectively-once outputs and acks of group "+a.Group+" on", a.Stream)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("redis: committing to %s: %w", a.Stream, errUnexpected(res))
	}
	if done, _ := res[0].(int64); done == 0 {
		return make([]string, p.n), nil // this commit was made already: its reply was lost
	}
	if len(res) != 1+p.n {
		return nil, fmt.Errorf("redis: committing to %s: %w", a.Stream, errUnexpected(res))
	}
	ids := make([]string, p.n)
	for i := range ids {
		ids[i], _ = res[1+i].(string)
	}
	return ids, nil
}

// nextCommitID returns an ID for a commit that no other commit has: a prefix drawn at random once
// per process and a counter.
func (c *Client) nextCommitID() string {
	return commitPrefix + strconv.FormatUint(commitCount.Add(1), 36)
}

var (
	commitPrefix = func() string {
		b := make([]byte, 12)
		_, _ = rand.Read(b) // never fails (crypto/rand)
		return hex.EncodeToString(b) + "-"
	}()
	commitCount atomic.Uint64
)

// queueOutputs adds the outputs to a pipeline and returns a function that collects their IDs
// after Exec. Scripts in pipelines are sent with EVAL (the full text): an EVALSHA that fails
// with NOSCRIPT inside a transaction could not be retried atomically.
func (p *commitPlan) queueOutputs(ctx context.Context, pipe goredis.Pipeliner) func() ([]string, error) {
	// The commands themselves, not closures over them: a closure per output was an allocation per
	// message at every hop. The XADDs in one slice: a command each was an allocation per message
	// at every hop. Both, and the XADDs' arguments, in memory kept from one commit to the next
	// (outputCmds).
	oc := outputCmdsPool.Get().(*outputCmds)
	adds := slices.Grow(oc.adds[:0], len(p.plain))[:len(p.plain)]
	cmds := slices.Grow(oc.cmds[:0], len(p.plain))[:len(p.plain)]
	xadds := xaddBatch{slab: slices.Grow(oc.slab[:0], p.xaddArgCount())}
	for i, o := range p.plain {
		if o.off != nil {
			adds[i] = offloadScript.Eval(ctx, pipe, []string{o.stream, o.off.key}, append([]any{o.off.body()}, o.values...)...)
			continue
		}
		cmds[i] = *goredis.NewStringCmd(ctx, xadds.of(o)...)
		_ = pipe.Process(ctx, &cmds[i]) // queued: its reply is read after Exec
		adds[i] = &cmds[i]
	}
	scripts := make([]*goredis.Cmd, len(p.order))
	for i, s := range p.order {
		d := p.dedup[s]
		scripts[i] = xaddOnceScript.Eval(ctx, pipe, d.keys, d.args...)
	}
	return func() ([]string, error) {
		ids := make([]string, p.n)
		var first error
		for i, cmd := range adds {
			id, err := appendedID(cmd)
			if err != nil {
				first = firstErr(first, wrap(err, "appending output to", p.plain[i].stream))
				continue
			}
			ids[p.plain[i].index] = id
		}
		for i, cmd := range scripts {
			d := p.dedup[p.order[i]]
			res, err := cmd.StringSlice()
			if err == nil && len(res) != len(d.indexes) {
				err = fmt.Errorf("unexpected reply %v", res)
			}
			if err != nil {
				first = firstErr(first, wrap(err, "appending effectively-once outputs to", d.stream))
				continue
			}
			for j, idx := range d.indexes {
				ids[idx] = res[j]
			}
		}
		oc.keep(adds, cmds, xadds.slab)
		return ids, first
	}
}

// outputCmds is the memory of a commit's XADD commands, which a commit takes from outputCmdsPool
// and gives back once it has their replies: made for every commit, the commands and their
// arguments were 300 bytes of every message at every hop, a sixth of all that a pass-through job
// allocated. A commit that ends before it collects (a transaction that WATCH aborted) leaves its
// commands to the garbage collector.
type outputCmds struct {
	adds []goredis.Cmder
	cmds []goredis.StringCmd
	slab []any
}

var outputCmdsPool = sync.Pool{New: func() any { return new(outputCmds) }}

// keep gives the commands back to outputCmdsPool, emptied: nothing of theirs (a payload the
// arguments point to, a reply) outlives the commit that used them.
func (oc *outputCmds) keep(adds []goredis.Cmder, cmds []goredis.StringCmd, slab []any) {
	clear(adds)
	clear(cmds)
	clear(slab)
	oc.adds, oc.cmds, oc.slab = adds[:0], cmds[:0], slab[:0]
	outputCmdsPool.Put(oc)
}

// xaddBatch makes the arguments of a batch's XADDs, the commands go-redis's XAdd would make, in
// one slice: XAdd allocates its arguments (and the stream's name as an interface) per entry, at
// every hop for every message.
type xaddBatch struct {
	slab    []any
	streams map[string]any // each stream's name, made an interface once
}

// of returns the arguments of the XADD of o: XADD stream [MAXLEN ~ n] * field value ...
func (x *xaddBatch) of(o plainOutput) []any {
	stream, ok := x.streams[o.stream]
	if !ok {
		if x.streams == nil {
			x.streams = map[string]any{}
		}
		stream = o.stream
		x.streams[o.stream] = stream
	}
	start := len(x.slab)
	x.slab = append(x.slab, "xadd", stream)
	if o.maxLen > 0 {
		x.slab = append(x.slab, "maxlen", "~", o.maxLen)
	}
	x.slab = append(x.slab, "*")
	x.slab = append(x.slab, o.values...)
	return x.slab[start:len(x.slab):len(x.slab)]
}

// xaddArgCount counts the arguments of the plan's XADDs (those of offloaded payloads included).
func (p *commitPlan) xaddArgCount() int {
	n := 0
	for _, o := range p.plain {
		n += 6 + len(o.values)
	}
	return n
}

// appendedID is the ID of the entry that an output's command appended: XADD's reply, or that of
// the script that appends an entry with its offloaded payload.
func appendedID(cmd goredis.Cmder) (string, error) {
	if c, ok := cmd.(*goredis.StringCmd); ok {
		return c.Result()
	}
	return cmd.(*goredis.Cmd).Text()
}

func firstErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func (c *Client) writeOutputs(ctx context.Context, pipe goredis.Pipeliner, p *commitPlan) ([]string, error) {
	if p.n == 0 {
		return nil, nil
	}
	collect := p.queueOutputs(ctx, pipe)
	_, _ = pipe.Exec(ctx) // per-command errors are collected below
	return collect()
}

func (c *Client) commitAtomic(ctx context.Context, a CommitArgs, p *commitPlan) ([]string, error) {
	ids, aborted, err := p.commitTx(ctx, c.rdb.TxPipeline(), a, func(pipe goredis.Pipeliner) goredis.Cmder {
		return queueSettle(ctx, pipe, a, p.guards, p.streams)
	})
	if aborted { // nothing was written: the connection watched a key (it never should)
		return nil, wrap(goredis.TxFailedErr, "committing to", a.Stream)
	}
	return ids, err
}

// commitTx runs the transaction pipe of the outputs, the watermarks and, when the commit settles,
// the settle that queue adds. aborted says that a key the connection watched changed, so that EXEC
// ran nothing (see commitWatched).
func (p *commitPlan) commitTx(ctx context.Context, pipe goredis.Pipeliner, a CommitArgs, queue func(goredis.Pipeliner) goredis.Cmder) (ids []string, aborted bool, err error) {
	collect := p.queueOutputs(ctx, pipe)
	collectMarks := queueMarks(ctx, pipe, a.Marks)
	var ack goredis.Cmder
	if a.settles() {
		ack = queue(pipe)
	}
	_, execErr := pipe.Exec(ctx)
	if errors.Is(execErr, goredis.TxFailedErr) {
		return nil, true, nil
	}
	ids, err = collect()
	if err == nil {
		err = collectMarks()
	}
	if err != nil {
		if ack != nil && isUnwritten(ack.Err()) {
			return ids, false, fmt.Errorf("%w (nothing was acked: the outputs failed inside the transaction)", err)
		}
		if ack != nil && strings.HasPrefix(errText(err), "EXECABORT") && ack.Err() != nil && !strings.HasPrefix(ack.Err().Error(), "EXECABORT") {
			// Redis refused to queue the ack (NOPERM on its script, say) and discarded the whole
			// transaction: the outputs only say EXECABORT, the ack says why.
			return ids, false, settleError(ack.Err(), a)
		}
		return ids, false, err
	}
	if ack != nil {
		if err := ack.Err(); err != nil {
			return ids, false, settleError(err, a)
		}
	} else if execErr != nil {
		return ids, false, wrap(execErr, "committing to", a.Stream)
	}
	return ids, false, nil
}

// errText is the text of the error at the end of err's chain: the server's reply.
func errText(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

// settleError describes a failed ack or checkpoint.
func settleError(err error, a CommitArgs) error {
	if a.Checkpoint != nil {
		return wrap(classify(err), "recording checkpoint", a.Checkpoint.Key)
	}
	return wrap(classify(err), "acking group "+a.Group+" on", a.Stream)
}

// queueSettle adds the ack of a batch (and its retry moves), or its checkpoint, to a pipeline: a
// plain XACK or SET when that is all, else the settle or checkpoint script. guards are markers of
// effectively-once outputs in the same transaction: without them, nothing is acked (see
// settleScript).
func queueSettle(ctx context.Context, pipe goredis.Pipeliner, a CommitArgs, guards, streams []string) goredis.Cmder {
	if c := a.Checkpoint; c != nil {
		if a.Lease == nil && len(guards)+len(streams) == 0 {
			return pipe.Set(ctx, c.Key, c.Value, 0)
		}
		leaseKey, leaseValue := c.Key, ""
		if a.Lease != nil {
			leaseKey, leaseValue = a.Lease.Key, a.Lease.Value()
		}
		keys := append(append([]string{c.Key, leaseKey}, guards...), streams...)
		return checkpointScript.Eval(ctx, pipe, keys, leaseValue, c.Value, len(streams))
	}
	if a.Lease == nil && a.RetryKey == "" && len(guards)+len(streams) == 0 && a.State.empty() {
		return queueXAck(ctx, pipe, a)
	}
	keys, args, err := settleArgs(a)
	if err != nil {
		cmd := goredis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return settleScript.Eval(ctx, pipe, append(append(keys, guards...), streams...), append(args, len(streams))...)
}

// queueXAck adds the plain XACK of a batch's inputs to a pipeline: go-redis's XAck, but for its
// arguments (appendIDs).
func queueXAck(ctx context.Context, pipe goredis.Pipeliner, a CommitArgs) *goredis.IntCmd {
	args := make([]any, 0, 3+len(a.IDs))
	args = append(args, "xack", a.Stream, a.Group)
	args = appendIDs(args, a.IDs)
	cmd := goredis.NewIntCmd(ctx, args...)
	_ = pipe.Process(ctx, cmd)
	return cmd
}

// settleArgs encodes the settle script's keys and arguments.
func settleArgs(a CommitArgs) ([]string, []any, error) {
	retryKey, leaseKey, leaseValue := a.Stream, a.Stream, ""
	if a.RetryKey != "" {
		retryKey = a.RetryKey
	}
	if a.Lease != nil {
		leaseKey, leaseValue = a.Lease.Key, a.Lease.Value()
	}
	size := 10 + len(a.IDs) + len(a.RetryDone) + 2*len(a.Retries)
	if s := a.State; s != nil {
		size += 2*(len(s.Set)+len(s.Timers)+len(s.Holds)) + len(s.Delete) + len(s.Cancel) + len(s.Release)
	}
	args := make([]any, 0, size)
	args = append(args, a.Group, leaseValue, len(a.IDs))
	args = appendIDs(args, a.IDs)
	args = append(args, len(a.RetryDone))
	for _, r := range a.RetryDone {
		if r.member == "" {
			return nil, nil, fmt.Errorf("redis: commit: retry of %s was not read from a retry set", r.Entry.ID)
		}
		args = append(args, r.member)
	}
	args = append(args, len(a.Retries))
	for _, r := range a.Retries {
		member, err := r.encode()
		if err != nil {
			return nil, nil, err
		}
		args = append(args, r.Due.UnixMilli(), member)
	}
	stateKey, timersKey, holdsKey := a.Stream, a.Stream, a.Stream
	if s := a.State; !s.empty() {
		stateKey, timersKey = s.Key, s.TimersKey
		if timersKey == "" {
			timersKey = a.Stream
		}
		if s.HoldsKey != "" {
			holdsKey = s.HoldsKey
		}
		// The values in map order: their names are distinct, so the order changes nothing, and
		// sorting the names cost a stateful stage 4% of its time. The timers go earliest first,
		// which is cheaper for Redis: each one joins the timer set next to the one before.
		args = append(args, 2*len(s.Set))
		for k, v := range s.Set {
			args = append(args, k, v)
		}
		args = append(args, len(s.Delete))
		for _, k := range s.Delete {
			args = append(args, k)
		}
		args = append(args, 2*len(s.Timers))
		for _, t := range byTime(s.Timers) {
			args = append(args, t.At, t.Name)
		}
		args = append(args, len(s.Cancel))
		for _, k := range s.Cancel {
			args = append(args, k)
		}
		args = append(args, 2*len(s.Holds))
		for k, at := range s.Holds {
			args = append(args, at, k)
		}
		args = append(args, len(s.Release))
		for _, k := range s.Release {
			args = append(args, k)
		}
	} else {
		args = append(args, 0, 0, 0, 0, 0, 0)
	}
	return []string{a.Stream, retryKey, leaseKey, stateKey, timersKey, holdsKey}, args, nil
}

// appendIDs appends the IDs (or other strings: a state's keys) to a command's arguments as pointers
// to them: a *string goes into an interface without an allocation (go-redis writes it as the
// string), a string with one, for every message at every hop. They must not change until the
// command ran.
func appendIDs(args []any, ids []string) []any {
	for i := range ids {
		args = append(args, &ids[i])
	}
	return args
}

// argSlab is the memory of a commit's field values: the arguments of its commands, in one slice,
// and the values they point to as strings (see appendIDs: a string or a []byte in an interface
// costs an allocation, per field of every output at every hop).
type argSlab struct {
	args []any
	strs []string
}

func newArgSlab(outputs int) *argSlab {
	return &argSlab{args: make([]any, 0, 4*outputs), strs: make([]string, 0, 2*outputs)}
}

// str makes v an argument. An earlier argument still points to the value it had when strs grows.
func (s *argSlab) str(v string) any {
	s.strs = append(s.strs, v)
	return &s.strs[len(s.strs)-1]
}

// fields are encodeFields(e, FieldPayload, e.Payload) in s: the same fields, in the same order.
func (s *argSlab) fields(e Entry) ([]any, error) {
	var headers []byte
	if len(e.Headers) > 0 {
		var err error
		if headers, err = marshalStrings(e.Headers); err != nil {
			return nil, fmt.Errorf("redis: encoding entry headers: %w", err)
		}
	}
	start := len(s.args)
	s.args = append(s.args, FieldPayload, s.str(unsafe.String(&e.Payload[0], len(e.Payload))))
	if e.Key != "" {
		s.args = append(s.args, FieldKey, s.str(e.Key))
	}
	if headers != nil {
		s.args = append(s.args, FieldHeaders, s.str(unsafe.String(&headers[0], len(headers))))
	}
	if e.TraceParent != "" {
		s.args = append(s.args, FieldTraceParent, s.str(e.TraceParent))
	}
	if e.TraceState != "" {
		s.args = append(s.args, FieldTraceState, s.str(e.TraceState))
	}
	return s.args[start:len(s.args):len(s.args)], nil
}

// byTime returns timers, earliest first.
func byTime(timers map[string]int64) []DueTimer {
	out := make([]DueTimer, 0, len(timers))
	for name, at := range timers {
		out = append(out, DueTimer{Name: name, At: at})
	}
	slices.SortFunc(out, func(a, b DueTimer) int { return cmp.Compare(a.At, b.At) })
	return out
}

// settle acks a batch and moves its retries, or records its checkpoint, on its own.
func (c *Client) settle(ctx context.Context, a CommitArgs) error {
	var err error
	switch cp := a.Checkpoint; {
	case cp != nil && a.Lease == nil:
		err = c.rdb.Set(ctx, cp.Key, cp.Value, 0).Err()
	case cp != nil:
		err = checkpointScript.Run(ctx, c.rdb, []string{cp.Key, a.Lease.Key}, a.Lease.Value(), cp.Value, 0).Err()
	case a.Lease == nil && a.RetryKey == "" && a.State.empty():
		err = c.rdb.XAck(ctx, a.Stream, a.Group, a.IDs...).Err()
	default:
		keys, args, aerr := settleArgs(a)
		if aerr != nil {
			return aerr
		}
		err = settleScript.Run(ctx, c.rdb, keys, append(args, 0)...).Err()
	}
	if err != nil {
		return settleError(err, a)
	}
	return nil
}

// Ack acks entries of a group, fenced by a lease when one is given: Commit without outputs.
func (c *Client) Ack(ctx context.Context, stream, group string, lease *Lease, ids ...string) error {
	_, err := c.Commit(ctx, CommitArgs{Stream: stream, Group: group, IDs: ids, Lease: lease})
	return err
}
