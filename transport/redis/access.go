package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// A run that may not do what its pipeline needs finds out at start: CheckAccess asks the server,
// in one script and without running anything, whether the connection's ACL user may send each
// command the run will send, with the keys it will send it on. Otherwise an ACL user restricted
// to other keys, or one without a command, fails (or retries) in the middle of a run, after it
// has read and written part of its work.
//
// Access builds the list. Its methods mirror the Client's operations: each adds what that
// operation sends, with the caller's keys in their places, so that the runtime, which knows
// which operations it uses on which keys, need not know the commands. A test runs pipelines as
// a user allowed exactly these commands, so that a command added to an operation and not here
// shows up.

// AccessCheck is one command that a run will send, as it will send it.
type AccessCheck struct {
	// Args is the command: its name (and subcommand), then its arguments with the keys in their
	// places, for example {"xgroup", "create", stream, group, "0", "mkstream"}. Values that ACL
	// rules cannot tell apart (IDs, counts, payloads) are placeholders.
	Args []string
	// Words is how many of Args name the command: 1, or 2 for a subcommand (XGROUP CREATE).
	Words int
	// Keys are the keys among Args, in order; none for a command without keys.
	Keys []string
	// Patterns are the ACL key patterns that grant Keys in the suggested rule, one per key, for
	// example "flow:*" for every key of a pipeline with the prefix "flow".
	Patterns []string
	// For says who needs the command, for messages: "stage enrich".
	For string
	// Optional marks a command that the run does without where the user may not send it: WATCH,
	// which fences a stateless stage's commit with less work for Redis than the settle script
	// (watched.go). CheckAccess refuses no run for it; it tells the client not to send it.
	Optional bool
}

// Command returns the command's name as Redis documents it: "XAUTOCLAIM", "XGROUP CREATE".
func (a AccessCheck) Command() string {
	return strings.ToUpper(strings.Join(a.Args[:a.Words], " "))
}

// rule returns the command as an ACL rule: "+xautoclaim", "+xgroup|create".
func (a AccessCheck) rule() string {
	return "+" + strings.ToLower(strings.Join(a.Args[:a.Words], "|"))
}

// Access collects the checks of a run. The zero value is not usable; see NewAccess.
type Access struct {
	keys   Keys
	checks []AccessCheck
	seen   map[string]bool
}

// NewAccess returns an empty list for the keys of k: the suggested rule grants every key under
// k's prefix with one pattern.
func NewAccess(k Keys) *Access { return &Access{keys: k, seen: map[string]bool{}} }

// Checks returns the checks, in the order they were added, without repeats.
func (a *Access) Checks() []AccessCheck { return a.checks }

// add adds a command whose key (if any) is key.
func (a *Access) add(who, key string, words int, args ...string) {
	var keys []string
	if key != "" {
		keys = []string{key}
	}
	a.addKeys(who, keys, words, args...)
}

// addKeys adds a command whose keys are keys.
func (a *Access) addKeys(who string, keys []string, words int, args ...string) {
	a.addCheck(false, who, keys, words, args...)
}

// addCheck adds a command whose keys are keys, optional or not (AccessCheck.Optional).
func (a *Access) addCheck(optional bool, who string, keys []string, words int, args ...string) {
	id := strings.Join(args, "\x00")
	if a.seen[id] {
		return
	}
	a.seen[id] = true
	c := AccessCheck{Args: args, Words: words, Keys: keys, For: who, Optional: optional}
	for _, k := range keys {
		c.Patterns = append(c.Patterns, a.pattern(k))
	}
	a.checks = append(a.checks, c)
}

// pattern returns the ACL pattern that the suggested rule grants key with.
func (a *Access) pattern(key string) string {
	if a.keys.Prefix != "" && strings.HasPrefix(key, a.keys.Prefix+":") {
		return globEscape(a.keys.Prefix) + ":*"
	}
	return globEscape(key)
}

// globEscape escapes the characters that ACL key patterns (glob-style) treat specially.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(s)
}

// script adds the invocation of a script on keys: EVALSHA and EVAL for a script sent with
// Script.Run (which falls back to EVAL when the server does not have the script yet), EVAL alone
// for one sent with Script.Eval (inside transactions).
func (a *Access) script(who string, s *goredis.Script, runs bool, keys ...string) {
	tail := append([]string{strconv.Itoa(len(keys))}, keys...)
	if runs {
		a.addKeys(who, keys, 1, append([]string{"evalsha", s.Hash()}, tail...)...)
	}
	a.addKeys(who, keys, 1, append([]string{"eval", "-- script"}, tail...)...)
}

// Members adds Heartbeat and Leave on a members key (Keys.Members, Keys.NodeMembers).
func (a *Access) Members(who, key string) {
	a.add(who, key, 1, "zadd", key, "0", "process")
	a.add(who, key, 1, "zremrangebyscore", key, "-inf", "(0")
	a.add(who, key, 1, "zcard", key)
	a.add(who, key, 1, "zrange", key, "0", "1", "withscores")
	a.add(who, key, 1, "zrem", key, "process")
}

// Consume adds what a consumer of a stream's group sends: EnsureGroupAt, ReadGroup, ReadPending,
// Reclaim and DeleteIdleConsumer.
func (a *Access) Consume(who, stream, group string) {
	a.Group(who, stream, group)
	a.add(who, stream, 1, "xreadgroup", "group", group, "consumer", "count", "1", "block", "1", "streams", stream, ">")
	a.add(who, stream, 1, "xautoclaim", stream, group, "consumer", "1", "0-0", "count", "1")
	a.add(who, stream, 1, "xpending", stream, group, "-", "+", "1", "consumer")
	a.add(who, stream, 1, "xclaim", stream, group, "consumer", "0", "0-1", "retrycount", "1", "justid")
	a.script(who, deleteIdleConsumerScript, true, stream)
	a.add(who, stream, 2, "xgroup", "delconsumer", stream, group, "consumer")
}

// Group adds EnsureGroup: XGROUP CREATE with MKSTREAM.
func (a *Access) Group(who, stream, group string) {
	a.add(who, stream, 2, "xgroup", "create", stream, group, "0", "mkstream")
}

// Settle adds the acknowledgement part of Commit (and Ack) on a stream's group, with the unit's
// retry set and lease ("" for none). The settle script checks, before it acks, what the unit's
// outputs wrote in the same transaction: markers are a marker of each effectively-once output
// stream, streams the streams of its other outputs; all of them at once in the check.
//
// A stateful stage's unit settles its state with the batch: state are its state hash, timer set
// and holds set (zero for others).
func (a *Access) Settle(who, stream, group, retryKey, leaseKey string, state StateKeys, markers, streams []string) {
	if retryKey == "" && leaseKey == "" && state.Hash == "" && len(markers)+len(streams) == 0 {
		a.add(who, stream, 1, "xack", stream, group, "0-1")
		return
	}
	keys := []string{stream, stream, stream, stream, stream, stream}
	if retryKey != "" {
		keys[1] = retryKey
	}
	if leaseKey != "" {
		keys[2] = leaseKey
	}
	if state.Hash != "" {
		keys[3], keys[4], keys[5] = state.Hash, state.Timers, state.Holds
	}
	a.script(who, settleScript, true, append(append(keys, markers...), streams...)...)
	a.guards(who, markers, streams)
	a.add(who, stream, 1, "xack", stream, group, "0-1")
	if leaseKey != "" {
		a.add(who, leaseKey, 1, "get", leaseKey)
	}
	if leaseKey != "" {
		a.watched(who, leaseKey, streams, state)
	}
	if retryKey != "" {
		a.add(who, retryKey, 1, "zrem", retryKey, "retry")
		a.add(who, retryKey, 1, "zadd", retryKey, "0", "retry")
	}
}

// CommitOnce adds the effectively-once commit of a unit that settles under a lease on a single
// server (onceScript, see Commit): one script on the unit's keys (as Settle's), the commit record
// of its lease, the streams its outputs may go to (outputs) and the watermarks hashes it sets
// (marks), and the commands it sends on them.
func (a *Access) CommitOnce(who, stream, group, retryKey, leaseKey string, state StateKeys, outputs, marks []string) {
	keys := []string{stream, stream, leaseKey, stream, stream, stream}
	if retryKey != "" {
		keys[1] = retryKey
	}
	if state.Hash != "" {
		keys[3], keys[4], keys[5] = state.Hash, state.Timers, state.Holds
	}
	commit := LeaseCommit(leaseKey)
	a.script(who, onceScript, true, append(append(append(keys, commit), outputs...), marks...)...)
	a.add(who, leaseKey, 1, "get", leaseKey)
	a.add(who, commit, 1, "get", commit)
	a.add(who, commit, 1, "set", commit, "commit", "px", "1")
	for _, s := range outputs {
		a.add(who, s, 1, "type", s)
		a.add(who, s, 1, "xadd", s, "*", "payload", "{}")
	}
	a.add(who, stream, 1, "xack", stream, group, "0-1")
	if retryKey != "" {
		a.add(who, retryKey, 1, "zrem", retryKey, "retry")
		a.add(who, retryKey, 1, "zadd", retryKey, "0", "retry")
	}
	a.watched(who, leaseKey, outputs, state) // a batch without outputs to mark
}

// watched adds the commands of a commit fenced by WATCH (watched.go), which a unit under a lease
// makes when its batch has nothing to settle but acks and state: WATCH of the lease, of the
// streams its outputs may go to and of its state's keys, and UNWATCH. The TYPE of each of those
// keys is guards', State's and Holds', as are the state's writes.
func (a *Access) watched(who, leaseKey string, streams []string, state StateKeys) {
	keys := append([]string{leaseKey}, streams...)
	if state.Hash != "" {
		keys = append(keys, state.Hash, state.Timers, state.Holds)
	}
	a.addCheck(true, who, keys, 1, append([]string{"watch"}, keys...)...)
	a.addCheck(true, who, nil, 1, "unwatch")
}

// StateKeys are a stateful stage's keys on one partition: its state hash, timer set and holds set.
type StateKeys struct{ Hash, Timers, Holds string }

// Output adds the writes of Commit to a stream: an XADD in a MULTI/EXEC transaction, or with a
// dedup marker (dedupKey, "" for none) the effectively-once script.
func (a *Access) Output(who, stream, dedupKey string) {
	a.add(who, "", 1, "multi")
	a.add(who, "", 1, "exec")
	if dedupKey == "" {
		a.add(who, stream, 1, "xadd", stream, "*", "payload", "{}")
		return
	}
	a.script(who, xaddOnceScript, false, stream, dedupKey)
	a.add(who, dedupKey, 1, "get", dedupKey)
	a.add(who, stream, 1, "xadd", stream, "*", "payload", "{}")
	a.add(who, dedupKey, 1, "set", dedupKey, "0-1", "px", "1")
}

// Checkpoint adds the checkpoint Commit records for a source (Keys.SourcePosition), fenced by the
// source's lease, and ReadCheckpoint. markers and streams are what the checkpoint script checks
// of the source's outputs (see Settle).
func (a *Access) Checkpoint(who, key, leaseKey string, markers, streams []string) {
	a.add(who, key, 1, "get", key)
	a.script(who, checkpointScript, true, append(append([]string{key, leaseKey}, markers...), streams...)...)
	a.add(who, leaseKey, 1, "get", leaseKey)
	a.guards(who, markers, streams)
	a.add(who, key, 1, "set", key, "position")
}

// UpstreamLag adds the SET with which the process running a source publishes its upstream lag.
func (a *Access) UpstreamLag(who, key string) { a.add(who, key, 1, "set", key, "lag", "px", "1") }

// guards adds the checks of the settle and checkpoint scripts: EXISTS of the markers (and of the
// keys of staged payloads, see Offload), TYPE of the streams.
func (a *Access) guards(who string, markers, streams []string) {
	for _, k := range markers {
		a.add(who, k, 1, "exists", k)
	}
	for _, k := range streams {
		a.add(who, k, 1, "type", k)
	}
}

// Backlog adds Backlog on a stream (which falls back on StreamStats).
func (a *Access) Backlog(who, stream string) { a.Stats(who, stream) }

// Produce adds what a Producer sends to a stream: pipelined XADDs.
func (a *Access) Produce(who, stream string) {
	a.add(who, stream, 1, "xadd", stream, "*", "payload", "{}")
}

// Offload adds, for a writer of stream whose client offloads payloads (WithOffloadOver), what its
// writes of entries with offloaded payloads send besides Output's, Produce's or CommitOnce's: the
// offloading script (which the others' scripts replace), SET of the payload's key and ZADD to the
// stream's index; and for a large changed payload staged before its commit (stageLarge), the
// script that writes its pieces (SET PX, STRLEN, SETRANGE, EXISTS and RENAME once it is whole), the
// commit scripts' check that it is there (EXISTS), its RENAME to the payload key and PERSIST, the
// DEL of one not needed, and the settle's EXISTS of the payload key.
func (a *Access) Offload(who, stream string) {
	key, index := PayloadKey(stream, "token"), PayloadIndex(stream)
	pieces, staged := piecesKey(key), stagingKey(key)
	a.script(who, offloadScript, false, stream, key)
	a.add(who, stream, 1, "xadd", stream, "*", "payload_ref", "key")
	a.add(who, key, 1, "set", key, "payload")
	a.add(who, index, 1, "zadd", index, "0", "member")
	a.script(who, stagePieceScript, true, pieces, staged)
	a.add(who, pieces, 1, "set", pieces, "piece", "px", "1")
	a.add(who, pieces, 1, "strlen", pieces)
	a.add(who, pieces, 1, "setrange", pieces, "0", "piece")
	a.addKeys(who, []string{pieces, staged}, 1, "rename", pieces, staged)
	a.add(who, staged, 1, "exists", staged)
	a.addKeys(who, []string{staged, key}, 1, "rename", staged, key)
	a.add(who, key, 1, "persist", key)
	a.add(who, staged, 1, "del", staged)
	a.add(who, key, 1, "exists", key)
}

// Fetch adds what a read of stream sends for the entries whose payloads are offloaded: GET of
// their keys.
func (a *Access) Fetch(who, stream string) {
	key := PayloadKey(stream, "token")
	a.add(who, key, 1, "get", key)
}

// Lease adds AcquireLease, RenewLease and ReleaseLease on a lease key (and its fencing counter).
func (a *Access) Lease(who, key string) {
	fence := LeaseFence(key)
	a.script(who, acquireLeaseScript, true, key, fence)
	a.add(who, key, 1, "get", key)
	a.add(who, key, 1, "pttl", key)
	a.add(who, fence, 1, "incr", fence)
	a.add(who, key, 1, "set", key, "owner", "px", "1")
	a.script(who, renewLeaseScript, true, key)
	a.add(who, key, 1, "pexpire", key, "1")
	a.script(who, releaseLeaseScript, true, key)
	a.add(who, key, 1, "del", key)
}

// Retries adds ClaimRetries, NextRetry and ScheduledRetries on a retry set.
func (a *Access) Retries(who, key string) {
	a.script(who, claimRetriesScript, true, key)
	a.add(who, key, 1, "zrangebyscore", key, "-inf", "0", "withscores", "limit", "0", "1")
	a.add(who, key, 1, "zadd", key, "xx", "0", "retry")
	a.add(who, key, 1, "zrange", key, "0", "0", "withscores")
	a.add(who, key, 1, "zcard", key)
}

// Stats adds StreamStats and StreamLen on a stream.
func (a *Access) Stats(who, stream string) {
	a.add(who, stream, 1, "type", stream)
	a.add(who, stream, 1, "xlen", stream)
	a.add(who, stream, 1, "xrange", stream, "-", "+", "count", "1")
	a.add(who, stream, 1, "xrevrange", stream, "+", "-", "count", "1")
	a.add(who, stream, 2, "xinfo", "groups", stream)
	a.add(who, stream, 1, "xpending", stream, "group", "-", "+", "1")
}

// TableRead adds what a lookup stage sends to read a table's row in a state hash (ReadState).
func (a *Access) TableRead(who, hash string) { a.add(who, hash, 1, "hget", hash, "field") }

// GroupProgress adds what a lookup stage sends to learn how far a table's stage has got on one of
// its input streams (LastIDs, GroupsProgress).
func (a *Access) GroupProgress(who, stream, group string) {
	a.add(who, stream, 1, "xrevrange", stream, "+", "-", "count", "1")
	a.add(who, stream, 2, "xinfo", "groups", stream)
	a.add(who, stream, 1, "xpending", stream, group)
}

// StatePartitions adds RecordedPartitions and RecordPartitions on a stateful stage's record of its
// partition count, and StateHeld on its state hashes and timer sets (those of some partitions: the
// check reads those of the recorded count).
func (a *Access) StatePartitions(who, record string, hashes, timers []string) {
	a.add(who, record, 1, "get", record)
	a.add(who, record, 1, "set", record, "1")
	for i := range hashes {
		a.add(who, timers[i], 1, "zcard", timers[i])
		a.add(who, hashes[i], 1, "hscan", hashes[i], "0", "count", "100")
	}
}

// StateFingerprint adds RecordedFingerprint and RecordFingerprint on a stateful stage's record of
// its state's fingerprint, and the deletion of its state that Options.ResetState allows.
func (a *Access) StateFingerprint(who, record string, state []string) {
	a.add(who, record, 1, "hmget", record, "fingerprint", "shape")
	a.add(who, record, 1, "hset", record, "fingerprint", "x", "shape", "x")
	for _, k := range state {
		a.add(who, k, 1, "del", k)
	}
}

// State adds what a stateful stage's unit sends on its partition's state hash and timer set: the
// reads (ReadState, ReadStates, ScanState, ReadWatermarks, DueTimers), and the
// checks and writes that the settle script makes (Settle with the same keys).
func (a *Access) State(who, hash, timers string) {
	a.add(who, hash, 1, "type", hash)
	a.add(who, timers, 1, "type", timers)
	a.add(who, hash, 1, "hget", hash, "field")
	a.add(who, hash, 1, "hmget", hash, "field")
	a.add(who, hash, 1, "hscan", hash, "0", "count", "1000")
	a.add(who, timers, 1, "zrangebyscore", timers, "-inf", "0", "withscores", "limit", "0", "1")
	a.add(who, hash, 1, "hset", hash, "field", "value")
	a.add(who, hash, 1, "hdel", hash, "field")
	a.add(who, timers, 1, "zadd", timers, "0", "timer")
	a.add(who, timers, 1, "zrem", timers, "timer")
}

// Holds adds the reads of a stateful stage's holds (Holds); their writes go with the settle.
func (a *Access) Holds(who, key string) {
	a.add(who, key, 1, "type", key)
	a.add(who, key, 1, "zrange", key, "0", "0", "withscores")
	a.add(who, key, 1, "zadd", key, "0", "hold")
	a.add(who, key, 1, "zrem", key, "hold")
}

// ReadMarks adds ReadMarks on a partition's watermarks hash and its stream.
func (a *Access) ReadMarks(who, hash, stream string) {
	a.add(who, hash, 1, "hgetall", hash)
	a.add(who, stream, 1, "xrevrange", stream, "+", "-", "count", "1")
}

// ReadMarkField adds ReadMarkFields on a watermarks hash: a job's end test.
func (a *Access) ReadMarkField(who, hash string) { a.add(who, hash, 1, "hget", hash, "field") }

// WriteMarks adds the writes of a writer's marks to a partition's watermarks hash (with commits,
// WriteMarks, ReopenMarks).
func (a *Access) WriteMarks(who, hash string) {
	a.add(who, hash, 1, "hset", hash, "field", "value")
	a.script(who, reopenScript, true, hash)
}

// Type adds KeyTypes on a key.
func (a *Access) Type(who, key string) { a.add(who, key, 1, "type", key) }

// Len adds StreamLen on a stream.
func (a *Access) Len(who, stream string) {
	a.add(who, stream, 1, "xlen", stream)
}

// Trim adds Trim on a stream.
func (a *Access) Trim(who, stream string) {
	a.add(who, stream, 2, "xinfo", "groups", stream)
	a.add(who, stream, 1, "xpending", stream, "group")
	a.script(who, maxLenCutScript, true, stream)
	a.add(who, stream, 1, "xlen", stream)
	a.add(who, stream, 1, "xrange", stream, "-", "+", "count", "1")
	a.add(who, stream, 1, "xtrim", stream, "minid", "0-1")
	index := PayloadIndex(stream)
	a.script(who, trimScript, true, stream, index)
	a.add(who, index, 1, "zrangebyscore", index, "-inf", "0")
	a.add(who, index, 1, "zrem", index, "member")
	key := PayloadKey(stream, "token")
	a.add(who, key, 1, "del", key)
}

// connectRules are what Open and every new connection send: HELLO (or AUTH, which every user
// may send), CLIENT SETNAME, PING, and INFO to tell a cluster node; and CLIENT ID, with CLIENT
// UNBLOCK at a stop (UnblockReads). Those two may be refused: the stop then waits out the reads'
// block.
var connectRules = []string{"+hello", "+client|setname", "+ping", "+info", "+client|id", "+client|unblock"}

// ErrAccessUnchecked is returned (wrapped) by CheckAccess when the server cannot check a user's
// permissions: it lacks redis.acl_check_cmd (Redis before 7.0, or the embedded miniredis).
var ErrAccessUnchecked = errors.New("the server cannot check permissions (redis.acl_check_cmd needs Redis 7.0)")

// AccessReason says why a check failed.
type AccessReason int

const (
	// AccessCommand: the user may not run the command at all.
	AccessCommand AccessReason = iota + 1
	// AccessKey: the user may not read and write the key (AccessError.Key), whatever the
	// command.
	AccessKey
	// AccessUnknownCommand: the server does not know the command (rename-command, or too old).
	AccessUnknownCommand
)

// AccessError is a run that the connection's user may not make: the first check that failed,
// and an ACL rule that grants what failed.
type AccessError struct {
	User   string // the ACL user; "default" when the URL names none
	Check  AccessCheck
	Reason AccessReason
	// Key is the key refused, with Reason AccessKey.
	Key string
	// Failed is how many checks failed in all.
	Failed int
	// Rule is an ACL SETUSER command that grants the user the commands and key patterns that
	// failed, and nothing else ("" when the server lacks a command): ACL SETUSER adds to what the
	// user has.
	Rule string
}

func (e *AccessError) Error() string {
	var b strings.Builder
	switch e.Reason {
	case AccessUnknownCommand:
		fmt.Fprintf(&b, "the Redis server does not know the command %s", e.Check.Command())
	case AccessKey:
		fmt.Fprintf(&b, "redis user %q may not access the key %s (%s", e.User, e.Key, e.Check.Command())
	default:
		fmt.Fprintf(&b, "redis user %q may not run %s (", e.User, e.Check.Command())
	}
	if e.Check.For != "" {
		switch e.Reason {
		case AccessUnknownCommand:
			b.WriteString(" (")
		case AccessKey:
			b.WriteString(", ")
		}
		b.WriteString("needed by " + e.Check.For)
		if e.Reason == AccessUnknownCommand {
			b.WriteString(")")
		}
	}
	if e.Reason != AccessUnknownCommand {
		b.WriteString(")")
	}
	switch {
	case e.Failed == 2:
		b.WriteString(" and 1 more command or key")
	case e.Failed > 2:
		fmt.Fprintf(&b, " and %d more commands or keys", e.Failed-1)
	}
	if e.Reason == AccessUnknownCommand {
		b.WriteString(": it was renamed or disabled (rename-command), or the server is older than Redis 7.0")
	}
	if e.Rule != "" {
		them := "it"
		if e.Failed > 1 {
			them = "them"
		}
		b.WriteString("; grant " + them + " with: " + e.Rule)
	}
	return b.String()
}

// maxAccessFailures bounds the failures the check script reports one by one (it counts them all).
const maxAccessFailures = 1000

// accessScript runs redis.acl_check_cmd on each check, always on the command as it will be sent
// (a command cut short can make the server read past its arguments while it looks for keys). A
// check that fails is told apart by a second one on its keys alone: EVAL with them as its keys,
// which the user may run (the script runs in EVAL) and which needs read and write access. If the
// keys pass, the command is refused; else the first key that fails alone is. An unknown command
// makes acl_check_cmd raise an error, hence pcall. It returns the number of failed checks
// followed by (check index, reason, key index) of each, up to ARGV[1] of them, or {-1} when the
// server lacks acl_check_cmd.
//
//	ARGV[1] the most failures to list, then per check: the number of arguments, them, the
//	number of keys, them
var accessScript = `
if type(redis.acl_check_cmd) ~= 'function' then
  return {-1}
end
local limit = tonumber(ARGV[1])
local keyok = {}
local function keyAllowed(k)
  if keyok[k] == nil then
    keyok[k] = redis.acl_check_cmd('eval', 'return 0', '1', k)
  end
  return keyok[k]
end
local out = {0}
local i, n = 2, 0
while i <= #ARGV do
  n = n + 1
  local count = tonumber(ARGV[i])
  local args = {unpack(ARGV, i + 1, i + count)}
  i = i + 1 + count
  local nkeys = tonumber(ARGV[i])
  local keys = {unpack(ARGV, i + 1, i + nkeys)}
  i = i + 1 + nkeys
  local reason, bad = 0, 0
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(args))
  if not ok then
    reason = 3
  elseif not allowed then
    reason = 1
    for k = 1, nkeys do
      if not keyAllowed(keys[k]) then
        reason, bad = 2, k
        break
      end
    end
  end
  if reason ~= 0 then
    out[1] = out[1] + 1
    if out[1] <= limit then
      out[#out + 1] = n
      out[#out + 1] = reason
      out[#out + 1] = bad
    end
  end
end
return out
`

// CheckAccess reports whether the connection's user may send every command of checks, without
// sending any: nil when it may, an *AccessError naming the first command or key it may not
// (and an ACL rule that grants them all), an error wrapping ErrAccessUnchecked when the server
// cannot tell, or the error of the check itself. A user who may not run EVAL gets an
// *AccessError about EVAL, which flowrun needs anyway. An optional command that the user may not
// send (AccessCheck.Optional) refuses nothing: the client does without it from then on.
func (c *Client) CheckAccess(ctx context.Context, checks []AccessCheck) error {
	var required, optional []AccessCheck
	for _, ch := range checks {
		if ch.Optional {
			optional = append(optional, ch)
		} else {
			required = append(required, ch)
		}
	}
	if err := c.checkRequired(ctx, required); err != nil {
		return err
	}
	if len(optional) > 0 && c.watched != nil {
		// Without WATCH the client commits through the settle script, sending none: a refusal
		// would only fill the server's ACL log. A check that fails otherwise leaves it to try.
		if res, err := c.rdb.Eval(ctx, accessScript, nil, accessArgs(optional)...).Int64Slice(); err == nil && len(res) > 0 && res[0] > 0 {
			c.watched.refused()
		}
	}
	return nil
}

// accessArgs are the access script's arguments for checks.
func accessArgs(checks []AccessCheck) []any {
	argv := make([]any, 0, 1+10*len(checks))
	argv = append(argv, maxAccessFailures)
	for _, ch := range checks {
		argv = append(argv, len(ch.Args))
		for _, a := range ch.Args {
			argv = append(argv, a)
		}
		argv = append(argv, len(ch.Keys))
		for _, k := range ch.Keys {
			argv = append(argv, k)
		}
	}
	return argv
}

// checkRequired is CheckAccess for the checks that are not optional.
func (c *Client) checkRequired(ctx context.Context, checks []AccessCheck) error {
	if len(checks) == 0 {
		return nil
	}
	res, err := c.rdb.Eval(ctx, accessScript, nil, accessArgs(checks)...).Int64Slice()
	if err != nil {
		msg := err.Error()
		eval := AccessCheck{Args: []string{"eval"}, Words: 1, For: "flowrun's scripts: leases, acknowledgements, retries"}
		switch {
		case strings.HasPrefix(msg, "NOPERM"):
			return &AccessError{User: c.user, Check: eval, Reason: AccessCommand, Failed: 1,
				Rule: "ACL SETUSER " + quoteACL(c.user) + " +eval +evalsha"}
		case strings.HasPrefix(msg, "ERR unknown command"):
			return &AccessError{User: c.user, Check: eval, Reason: AccessUnknownCommand, Failed: 1}
		}
		return fmt.Errorf("redis: checking the user's permissions: %w", err)
	}
	if len(res) == 1 && res[0] == -1 {
		return fmt.Errorf("redis: %w", ErrAccessUnchecked)
	}
	if len(res) == 0 || len(res)%3 != 1 {
		return fmt.Errorf("redis: checking the user's permissions: %w", errUnexpected(res))
	}
	if res[0] == 0 {
		return nil
	}
	var e *AccessError
	var patterns, rules []string
	failed := map[int64]bool{}
	for i := 1; i+2 < len(res); i += 3 {
		failed[res[i]] = true
	}
	// A command refused on a key it may not access may be refused as such too: the rule grants
	// it as well, unless the command passed on another key (granting it again would be harmless,
	// but noise).
	passed := map[string]bool{}
	for i, ch := range checks {
		if !failed[int64(i+1)] {
			passed[ch.rule()] = true
		}
	}
	for i := 1; i+2 < len(res); i += 3 {
		index, reason, key := res[i], AccessReason(res[i+1]), res[i+2]
		if index < 1 || index > int64(len(checks)) || key < 0 || key > int64(len(checks[index-1].Keys)) ||
			reason == AccessKey && key == 0 {
			return fmt.Errorf("redis: checking the user's permissions: %w", errUnexpected(res))
		}
		ch := checks[index-1]
		if e == nil {
			e = &AccessError{User: c.user, Check: ch, Reason: reason, Failed: int(res[0])}
			if reason == AccessKey {
				e.Key = ch.Keys[key-1]
			}
		}
		switch reason {
		case AccessUnknownCommand:
			// Not the user's to be granted: rename-command or an upgrade fixes it, so it is what
			// the error is about.
			return &AccessError{User: c.user, Check: ch, Reason: reason, Failed: int(res[0])}
		case AccessKey:
			patterns = append(patterns, "~"+ch.Patterns[key-1])
			if !passed[ch.rule()] {
				rules = append(rules, ch.rule())
			}
		default:
			rules = append(rules, ch.rule())
		}
	}
	e.Rule = aclSetUser(c.user, patterns, rules)
	return e
}

// aclSetUser returns "ACL SETUSER user patterns... rules...", each once, the rules sorted.
func aclSetUser(user string, patterns, rules []string) string {
	words := []string{"ACL", "SETUSER", quoteACL(user)}
	seen := map[string]bool{}
	for _, p := range patterns {
		if !seen[p] {
			seen[p] = true
			words = append(words, quoteACL(p))
		}
	}
	var sorted []string
	for _, r := range rules {
		if !seen[r] {
			seen[r] = true
			sorted = append(sorted, r)
		}
	}
	sort.Strings(sorted)
	return strings.Join(append(words, sorted...), " ")
}

// AccessRule returns an ACL SETUSER command that grants the connection's user every check: the
// key patterns, then the commands, connecting's own first, for example
// "ACL SETUSER app ~flow:* +hello +client|setname +ping +info +client|id +client|unblock +del +eval ...
// +zremrangebyscore".
// It adds to what the user has; a user with every key ("~*" or allkeys) must leave out the key
// patterns, which Redis refuses to add to it.
func (c *Client) AccessRule(checks []AccessCheck) string {
	var patterns, rules []string
	for _, ch := range checks {
		for _, p := range ch.Patterns {
			patterns = append(patterns, "~"+p)
		}
		rules = append(rules, ch.rule())
	}
	if c.cluster {
		rules = append(rules, "+cluster|slots")
	}
	// Connecting's own commands go first, where a reader expects them.
	for _, r := range connectRules {
		patterns = append(patterns, r)
		rules = slices.DeleteFunc(rules, func(s string) bool { return s == r })
	}
	return aclSetUser(c.user, patterns, rules)
}

// quoteACL quotes a word of an ACL command for redis-cli when it holds white space or quotes.
func quoteACL(s string) string {
	if strings.ContainsAny(s, " \t\"'") {
		return strconv.Quote(s)
	}
	return s
}
