package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Large payloads are offloaded: a payload above the client's threshold (WithOffloadOver) is
// stored once, under its own string key in the stream's hash slot, and the entry carries a
// payload_ref field naming that key instead of a payload field:
//
//	XADD flow:{orders:3} * payload_ref 'flow:{orders:3}:payload:<token>' key cust-7 ...
//	SET  flow:{orders:3}:payload:<token> '<the payload>'
//	ZADD flow:{orders:3}:payloads <entry ms> '<entry id> flow:{orders:3}:payload:<token>'
//
// The three writes are one script (offloadScript, or the offloading steps of xaddOnceScript and
// onceScript), so that no entry ever names a key that was not written and no key is written for
// an entry that was not added. The index (PayloadIndex) lists the payload keys of the stream's
// entries by entry ID, so that whatever removes entries removes their payloads in the same script:
// trimming (Trim), deleting dead letters (DeleteEntries) and deleting a stream (DeleteStream).
// A payload key belongs to exactly one entry and lives exactly as long as it: never shared, never
// deleted while the entry is in the stream, so every reader that can still read the entry can read
// its payload. Reads (ReadGroup, ReadPending, Reclaim, Read, EntryByID) fetch the payloads of the
// entries they return in one more round trip, so the callers see an ordinary payload.
// docs/redis-keys.md documents the format for other clients; docs/design/offload.md the reasons.

// FieldPayloadRef is the field of an entry whose payload is offloaded: the name of the string key
// that holds the payload (PayloadKey). An entry has a payload field or a payload_ref field.
const FieldPayloadRef = "payload_ref"

// payloadKeyInfix joins a stream's name and a payload's token in a payload key.
const payloadKeyInfix = ":payload:"

// PayloadKey returns the key of an offloaded payload of stream: "<stream>:payload:<token>",
// in the stream's hash slot when the stream's name has a hash tag (every stream flowrun owns).
func PayloadKey(stream, token string) string { return stream + payloadKeyInfix + token }

// PayloadIndex returns the key of the sorted set that lists the offloaded payloads of stream's
// entries: "<stream>:payloads", score the entry's milliseconds, member "<entry id> <payload key>".
func PayloadIndex(stream string) string { return stream + ":payloads" }

// DefaultOffloadOver is the default threshold of WithOffloadOver that the runtime uses (the
// pipeline's offload_over): 64 KiB, where a payload costs Redis more as a stream field (copied
// into the stream's listpack, and again into every reply) than as a key of its own.
const DefaultOffloadOver = 64 << 10

// WithOffloadOver returns a client on the same connections that offloads the payloads of the
// entries it writes (Commit, Append, Producer) when they are larger than n bytes; n <= 0 turns
// offloading off. Reads fetch offloaded payloads whatever the setting: another process may have
// written them. An output is never offloaded when it is Inline, when it has a MaxLen (XADD MAXLEN
// would trim entries without their payloads), or, on a cluster, when its stream's name has no hash
// tag (the payload's key could not share its slot). Nothing is offloaded on miniredis (the embedded
// Redis of flowrun run and flowrun test): it keeps everything in the process's memory anyway, and it
// walks every key, sorted, on every command to expire keys, so that a key per large payload would
// slow down every command of the run.
func (c *Client) WithOffloadOver(n int64) *Client {
	o := *c
	o.offloadOver = max(n, 0)
	return &o
}

// offloaded is a payload that a write stores under its own key instead of in its entry.
type offloaded struct {
	key     string // PayloadKey: the entry's payload_ref
	payload []byte // nil when it is staged already, at stagingKey(key)
}

// body is the payload's argument in the scripts that write it (keepPayloadLua): the payload, or an
// empty string when it is staged (a payload is never empty).
func (o *offloaded) body() any {
	if o.payload == nil {
		return ""
	}
	return o.payload
}

// offload decides whether an encoded entry (EncodeEntry's values, payload first) of stream goes
// with its payload offloaded. When it does, it replaces the payload field by payload_ref in values
// and returns the payload and its key; otherwise it returns nil and leaves values alone.
func (c *Client) offload(stream string, o *Output, values []any) *offloaded {
	payload, ok := values[1].([]byte)
	if !ok || int64(len(payload)) <= c.offloadOver || !c.offloads(stream, o) {
		return nil
	}
	key := PayloadKey(stream, nextPayloadToken())
	values[0], values[1] = FieldPayloadRef, key
	return &offloaded{key: key, payload: payload}
}

// offloads reports whether output o to stream goes with its payload offloaded when the payload is
// larger than the threshold (see WithOffloadOver).
func (c *Client) offloads(stream string, o *Output) bool {
	if c.offloadOver <= 0 || c.miniredis || o.Inline || o.MaxLen > 0 {
		return false
	}
	// A payload key is the stream's name and more: it shares the stream's slot when the name has a
	// hash tag. Without one, the key hashes whole, token and all, to a slot of its own: that one
	// token's key lands in the stream's slot says nothing of another's.
	return !c.cluster || hasHashTag(stream)
}

// hasHashTag reports whether a key's slot is that of its hash tag (see HashSlot), which every key
// that begins with it shares.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	return i >= 0 && strings.IndexByte(key[i+1:], '}') > 0
}

// encodeOutput encodes an output of a commit: its entry's fields, and its payload when that goes
// under a key of its own. With args, an entry that keeps its payload has its fields in args.
func (c *Client) encodeOutput(o *Output, args *argSlab) ([]any, *offloaded, error) {
	if p := o.Entry.Payload; args != nil && o.staged == "" && len(p) > 0 &&
		(int64(len(p)) <= c.offloadOver || !c.offloads(o.Stream, o)) {
		values, err := args.fields(o.Entry)
		return values, nil, err
	}
	if o.staged != "" {
		values, err := encodeFields(o.Entry, FieldPayloadRef, o.staged)
		return values, &offloaded{key: o.staged}, err
	}
	values, err := EncodeEntry(o.Entry)
	if err != nil {
		return nil, nil, err
	}
	return values, c.offload(o.Stream, o, values), nil
}

// A large payload that a stage changed (Entry.Large) is staged before the commit that writes it, so
// that the process never holds its JSON whole next to the message it is made from: its pieces go,
// as they are made, to a key in the stream's slot with a time to live (stagePieceScript),
//
//	SET      flow:{orders:3}:payload:<token>:staging '<the first MB>' PX 300000
//	SETRANGE flow:{orders:3}:payload:<token>:staging <its length so far> '<the next piece>'  ...
//	RENAME   flow:{orders:3}:payload:<token>:staging flow:{orders:3}:payload:<token>:staged
//
// the last with the last piece, and the script that writes the entry renames the staged key to the
// payload key (and makes it persistent) where it would otherwise SET the payload: the commit is
// still one step, fenced as before, and a process that dies between the two leaves only a key that
// expires, which no entry names. SETRANGE at an offset rather than APPEND: a piece sent again (the
// client retries a command whose reply it lost) lands where it was, not after itself.
//
// A piece is written only onto the pieces before it: a key that expired or was evicted meanwhile
// fails the staging (SETRANGE would make a new one, zeros up to the offset and persistent), and
// only a payload staged whole is ever at the staged key, which is all the commit's scripts check
// for (a failover that loses the last pieces written loses the RENAME after them too).

// StagingChunk is the size of the pieces a large payload is staged in: large enough that a round
// trip per piece costs little next to sending it, small enough that a piece is no part of the
// process's memory to speak of.
const StagingChunk = 1 << 20

// stagingTTL is how long a staged payload lives unless a commit renames it: the commit follows its
// staging at once, so this only bounds what a process that died in between leaves behind.
const stagingTTL = 5 * time.Minute

// stagingKey returns the key that the payload of payload key is staged at before its commit, once
// it is there whole.
func stagingKey(payloadKey string) string { return payloadKey + ":staged" }

// piecesKey returns the key that the pieces of the payload of payload key are written to, until
// the last one is there and it is renamed to stagingKey.
func piecesKey(payloadKey string) string { return payloadKey + ":staging" }

// stagePieceScript writes a piece of a payload being staged (stage): the first piece makes the key,
// with a time to live; a later one is written at its offset only when the pieces before it are
// there; the one that completes the payload renames the key to the staged key. The last piece sent
// again, once the key was renamed, writes nothing.
//
//	KEYS[1] the pieces' key (piecesKey), KEYS[2] the staged key (stagingKey); ARGV[1] the piece's
//	offset, ARGV[2] the piece, ARGV[3] the payload's size, ARGV[4] the time to live in ms
//	returns 1, or an error when the pieces before this one are gone
var stagePieceScript = goredis.NewScript(`
local at = tonumber(ARGV[1])
if at == 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
elseif redis.call('STRLEN', KEYS[1]) >= at then
  redis.call('SETRANGE', KEYS[1], at, ARGV[2])
elseif at + string.len(ARGV[2]) == tonumber(ARGV[3]) and redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
else
  return redis.error_reply('` + unwrittenPrefix + ` the payload being staged at ' .. KEYS[1] .. ' is gone (expired or evicted)')
end
if at + string.len(ARGV[2]) == tonumber(ARGV[3]) then
  redis.call('RENAME', KEYS[1], KEYS[2])
end
return 1
`)

// stageLarge stages the large payloads of outs (Entry.Large) that go offloaded, and returns the
// outputs to commit: outs itself when none does, else a copy in which those name their payload keys.
func (c *Client) stageLarge(ctx context.Context, outs []Output) ([]Output, error) {
	var staged []Output
	for i := range outs {
		o := &outs[i]
		if o.Entry.Large == nil || len(o.Entry.Payload) > 0 || o.Entry.Large.Size <= c.offloadOver || !c.offloads(o.Stream, o) {
			continue
		}
		if staged == nil {
			staged = slices.Clone(outs) // the caller's stay as they are, to be committed again
		}
		key := PayloadKey(o.Stream, nextPayloadToken())
		if err := c.stage(ctx, key, o.Entry.Large); err != nil {
			return nil, err
		}
		staged[i].staged = key
	}
	if staged == nil {
		return outs, nil
	}
	return staged, nil
}

// stage writes a large payload, a piece at a time as it is made, to the staging key of payload key.
func (c *Client) stage(ctx context.Context, payloadKey string, p *LargePayload) error {
	keys := []string{piecesKey(payloadKey), stagingKey(payloadKey)}
	var at int64
	err := p.Write(StagingChunk, func(piece []byte) error {
		if at+int64(len(piece)) > p.Size {
			return fmt.Errorf("redis: staging a large payload at %s: more than the %d bytes measured", keys[1], p.Size)
		}
		err := stagePieceScript.Run(ctx, c.rdb, keys, at, piece, p.Size, stagingTTL.Milliseconds()).Err()
		if err != nil {
			return wrap(classify(err), "staging a large payload at", keys[0])
		}
		at += int64(len(piece))
		return nil
	})
	if err == nil && at != p.Size {
		err = fmt.Errorf("redis: staging a large payload at %s: %d bytes made of %d", keys[1], at, p.Size)
	}
	return err
}

// nextPayloadToken returns a token that no other payload key has: the process's random prefix
// (that of commit IDs) and a counter.
func nextPayloadToken() string {
	return commitPrefix + "p" + strconv.FormatUint(payloadCount.Add(1), 36)
}

var payloadCount atomic.Uint64

// offloadArgs are the arguments of an output in the scripts that write outputs (xaddOnceScript,
// onceScript): the payload key and the payload when it is offloaded, an empty string when not.
func offloadArgs(args []any, off *offloaded) []any {
	if off == nil {
		return append(args, "")
	}
	return append(args, off.key, off.body())
}

// keepPayloadLua defines the Lua functions that store an offloaded payload for entry id of stream
// (the entry written just before, by the same script) and list it in the stream's index: the
// payload given, or, when it is empty, the one staged at the key's staging key (stagingKey), which
// becomes the payload key and lives as long as its entry. The key was checked to share the stream's
// slot (Client.offloads), and so do the index and the staging key. A script checks with
// unstaged, before it writes anything, that a staged payload is there to rename (it has a time to
// live, and Redis may evict it), so that it never writes an entry without its payload; the error
// says UNWRITTEN, which keeps a settle in the same transaction from acking (see settleScript).
const keepPayloadLua = `local function keepPayload(stream, id, key, payload)
  if payload == '' then
    redis.call('RENAME', key .. ':staged', key)
    redis.call('PERSIST', key)
  else
    redis.call('SET', key, payload)
  end
  redis.call('ZADD', stream .. ':payloads', string.match(id, '^%d+'), id .. ' ' .. key)
end
local function unstaged(key, payload)
  if payload == '' and redis.call('EXISTS', key .. ':staged') == 0 then
    return redis.error_reply('` + unwrittenPrefix + ` the payload staged at ' .. key .. ':staged is gone: nothing was written')
  end
end
`

// offloadScript appends one entry whose payload is offloaded: the XADD, then the payload's key and
// its index entry. A failing XADD (WRONGTYPE) writes nothing, nor does a staged payload that is
// gone, nor a user who may not run one of the three writes (refusalLua); once it has written, a
// script runs to its end, so the entry and its payload exist together or not at all.
//
//	KEYS[1] stream, KEYS[2] payload key; ARGV[1] payload ('' when staged), then the entry's
//	field/value strings
//	returns the entry's ID
var offloadScript = goredis.NewScript(keepPayloadLua + refusalLua + `
local refused = unstaged(KEYS[2], ARGV[1]) or refusal('XADD', KEYS[1], '*', 'field', 'value') or
  payloadRefusal(KEYS[1], KEYS[2], ARGV[1])
if refused then
  return refused
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
keepPayload(KEYS[1], id, KEYS[2], ARGV[1])
return id
`)

// trimScript removes a stream's entries below an ID (XTRIM MINID) and the offloaded payloads of
// those entries, in one step: no entry is left without its payload, no payload without an entry.
//
//	KEYS[1] stream, KEYS[2] its payload index; ARGV[1] the first ID to keep
//	returns the number of entries removed
var trimScript = goredis.NewScript(idLessLua + `
local cut = ARGV[1]
local cutMS = string.match(cut, '^%d+')
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutMS)) do
  local sp = string.find(m, ' ', 1, true)
  if sp and idLess(string.sub(m, 1, sp - 1), cut) then
    redis.call('DEL', string.sub(m, sp + 1))
    redis.call('ZREM', KEYS[2], m)
  end
end
return redis.call('XTRIM', KEYS[1], 'MINID', cut)
`)

// idLessLua defines idLess(a, b): whether stream ID a ("<ms>-<seq>") is below b.
const idLessLua = `local function idLess(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-?(%d*)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs) or 0
  return am < bm or (am == bm and as < bs)
end
`

// deleteEntriesScript removes entries from a stream (XDEL) with their offloaded payloads.
//
//	KEYS[1] stream, KEYS[2] its payload index; ARGV the IDs
//	returns the number of entries removed
var deleteEntriesScript = goredis.NewScript(`
for _, id in ipairs(ARGV) do
  local ms = string.match(id, '^%d+')
  if ms then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], ms, ms)) do
      if string.sub(m, 1, #id + 1) == id .. ' ' then
        redis.call('DEL', string.sub(m, #id + 2))
        redis.call('ZREM', KEYS[2], m)
      end
    end
  end
end
return redis.call('XDEL', KEYS[1], unpack(ARGV))
`)

// deleteStreamScript deletes a stream with every offloaded payload of its entries and the index.
//
//	KEYS[1] stream, KEYS[2] its payload index
var deleteStreamScript = goredis.NewScript(`
for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local sp = string.find(m, ' ', 1, true)
  if sp then
    redis.call('DEL', string.sub(m, sp + 1))
  end
end
return redis.call('DEL', KEYS[1], KEYS[2])
`)

// fetchPayloads puts the offloaded payloads of messages read from stream into their payload
// field, with one pipeline of GETs (one node on a cluster: the keys share the stream's slot). An
// entry whose payload_ref does not name a payload key of stream, or names one that does not exist,
// keeps no payload field: DecodeEntry reports it as malformed, and it is dead-lettered.
func (c *Client) fetchPayloads(ctx context.Context, stream string, msgs []goredis.XMessage) error {
	var (
		pipe goredis.Pipeliner
		gets []*goredis.StringCmd
		at   []int
	)
	for i, m := range msgs {
		if m.Values == nil {
			continue
		}
		if _, ok := m.Values[FieldPayload]; ok {
			continue
		}
		ref, ok := m.Values[FieldPayloadRef].(string)
		if !ok || !strings.HasPrefix(ref, stream+payloadKeyInfix) {
			continue
		}
		if pipe == nil {
			pipe = c.rdb.Pipeline()
		}
		gets = append(gets, pipe.Get(ctx, ref))
		at = append(at, i)
	}
	if pipe == nil {
		return nil
	}
	_, _ = pipe.Exec(ctx) // each command's error is its own
	for j, get := range gets {
		v, err := get.Result()
		if isNil(err) {
			continue
		}
		if err != nil {
			return wrap(classify(err), "reading the offloaded payloads of", stream)
		}
		msgs[at[j]].Values[FieldPayload] = v
	}
	return nil
}
