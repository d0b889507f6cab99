package redis

import (
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// The Lua scripts. Each touches only the keys it is given, and all of a script's keys share one
// hash tag, so every script runs on a Redis Cluster. They are run with EVALSHA, falling back to
// EVAL when the server does not know the script yet (go-redis Script.Run), and inside pipelines
// with EVALSHA plus a retry through Script.Run on NOSCRIPT.

// leaseLostPrefix starts the error reply of a fenced script whose lease is not held.
const leaseLostPrefix = "LEASELOST"

// unwrittenPrefix starts the error reply of a settle or checkpoint script that found the
// effectively-once outputs of its transaction unwritten, and so acked nothing.
const unwrittenPrefix = "UNWRITTEN"

// acquireLeaseScript takes a lease if nobody holds it: SET NX PX and the fencing token (INCR of
// the companion counter) in one atomic step.
//
//	KEYS[1] lease key, KEYS[2] fencing counter; ARGV[1] owner, ARGV[2] ttl in ms
//	returns {1, value, ttl} when taken, {0, current value, remaining ttl} when held by someone
var acquireLeaseScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  return {0, cur, redis.call('PTTL', KEYS[1])}
end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. '#' .. token
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {1, value, tonumber(ARGV[2])}
`)

// renewLeaseScript extends a lease only if it still holds the caller's owner and token.
//
//	KEYS[1] lease key; ARGV[1] expected value, ARGV[2] ttl in ms; returns 1 or 0
var renewLeaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

// releaseLeaseScript deletes a lease only if it still holds the caller's owner and token, so a
// slow owner never deletes its successor's lease.
//
//	KEYS[1] lease key; ARGV[1] expected value; returns 1 or 0
var releaseLeaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)

// settleScript settles a batch on its input partition in one atomic step: it checks the lease,
// acks the entries, removes finished retries from the retry set and schedules new ones, and writes
// a stateful stage's state and timers. One call per batch. It checks, before it writes anything,
// that its user may run each command it will run (aclCheckLua): a command refused after the ack
// would leave the input acked and its retry or state unwritten, which loses it.
//
// In a transaction that also writes effectively-once outputs it checks first that they were
// written: the effectively-once script (xaddOnceScript) runs before it in the same EXEC, and a
// failure at run time inside EXEC (WRONGTYPE, OOM) does not stop the commands after it. Each
// call of that script writes its markers in order and stops at the first failure, so its last
// marker exists only if every output of the call was written (now or by an earlier commit).
//
// Plain outputs (without markers) are checked too: each stream they were written to must be a
// stream now, or an XADD failed at run time (WRONGTYPE: another application's key at an output's
// name) and acking would lose the inputs. A plain output whose payload is offloaded (offload.go,
// staged or not) is checked by its payload key, which its script makes only with the entry: the
// script writes nothing when its XADD is refused for lack of memory, which the stream's type
// would not show.
//
//	KEYS[1] input stream, KEYS[2] retry set (the stream again when unused), KEYS[3] lease key
//	(the stream again when not fenced), KEYS[4] state hash, KEYS[5] timer set and KEYS[6] holds
//	set (the stream again when unused), then the last marker of each effectively-once call and
//	the payload key of each plain output whose payload was staged, then
//	the streams of the plain outputs, as many as the last ARGV says
//	ARGV[1] group, ARGV[2] expected lease value ("" when not fenced), then the number of IDs to
//	ack and the IDs, the number of retry members to remove and them, the number of retries to
//	add and their (due ms, member) pairs; then the state: twice the number of keys to set and their
//	(key, value) pairs, the number of keys to delete and them, twice the number of timers to set
//	and their (due ms, name) pairs, the number of timers to cancel and them, twice the number of
//	holds to set and their (ms, name) pairs, the number of holds to release and them. Lua's unpack has a
//	stack limit, so each command takes
//	at most 1000 arguments.
//	returns the number acked, or a LEASELOST, UNWRITTEN, WRONGTYPE or NOPERM error
var settleScript = goredis.NewScript(aclCheckLua + `
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return redis.error_reply('` + leaseLostPrefix + ` lease ' .. KEYS[3] .. ' is not held by ' .. ARGV[2])
end
local guarded = #KEYS - tonumber(ARGV[#ARGV])
for g = 7, guarded do
  if redis.call('EXISTS', KEYS[g]) == 0 then
    return redis.error_reply('` + unwrittenPrefix + ` no ' .. KEYS[g] .. ': the outputs were not written')
  end
end
for g = guarded + 1, #KEYS do
  if redis.call('TYPE', KEYS[g]).ok ~= 'stream' then
    return redis.error_reply('` + unwrittenPrefix + ` ' .. KEYS[g] .. ' is not a stream: the outputs were not written')
  end
end
` + checkStateTypes + `local refused = settleRefusal(3)
if refused then
  return refused
end
local i = 3
` + settleSteps + `return acked
`)

// checkStateTypes are the settle and effectively-once scripts' check, before they write anything,
// that each state key they may write holds its type or nothing: KEYS[4] the state hash, KEYS[5]
// the timer set and KEYS[6] the holds set (each the input stream, KEYS[1], when unused). Without
// it, a key of another type there (another application's) would let the batch be acked and its
// state then fail to be written.
const checkStateTypes = `for g, want in pairs({[4] = 'hash', [5] = 'zset', [6] = 'zset'}) do
  if KEYS[g] ~= KEYS[1] then
    local t = redis.call('TYPE', KEYS[g]).ok
    if t ~= want and t ~= 'none' then
      return redis.error_reply('WRONGTYPE ' .. KEYS[g] .. ' holds a ' .. t .. ', not a ' .. want .. ': nothing was acked')
    end
  end
end
`

// settleOps are the settle steps' commands, in the order of their arguments (after the lease's):
// the command, the index in KEYS of its key, and how many arguments each counted item takes (the
// retries to add are counted once per (due ms, member) pair, the state's writes per argument).
const settleOps = `local settleOps = {{'XACK', 1, 1}, {'ZREM', 2, 1}, {'ZADD', 2, 2}, {'HSET', 4, 1}, {'HDEL', 4, 1},
  {'ZADD', 5, 1}, {'ZREM', 5, 1}, {'ZADD', 6, 1}, {'ZREM', 6, 1}}
`

// refusalLua defines refusal, with which a script checks, before its first write, that its user
// may run each command it will run, on its key: Lua undoes nothing, so a command refused after a
// write (a permission taken away while the run goes on) would leave the script's work half done:
// effectively-once outputs written and their inputs unacked (written again once processed again:
// a duplicate), inputs acked and their retries or state unwritten (lost), or an entry written
// without its offloaded payload. The refusal is a NOPERM error, which ends the run (Unrecoverable),
// having written nothing. Each (command, key) is checked once per call. Redis before 7.0 and the
// embedded miniredis lack redis.acl_check_cmd: there the scripts check nothing (and a refusal
// after a write is as it was before).
//
// payloadRefusal checks keepPayload's writes (keepPayloadLua) of an offloaded payload.
const refusalLua = `local aclCheck = redis.acl_check_cmd
local mayRun = {}
local function refusal(command, key, ...)
  if type(aclCheck) ~= 'function' then
    return nil
  end
  local byKey = mayRun[command]
  if not byKey then
    byKey = {}
    mayRun[command] = byKey
  end
  if byKey[key] == nil then
    byKey[key] = aclCheck(command, key, ...)
  end
  if not byKey[key] then
    return redis.error_reply('NOPERM this user may not run ' .. command .. ' on the key ' .. key ..
      ': nothing was written and nothing was acked')
  end
end
local function payloadRefusal(stream, key, payload)
  if payload == '' then
    return refusal('RENAME', key .. ':staged', key) or refusal('PERSIST', key) or
      refusal('ZADD', stream .. ':payloads', '0', 'member')
  end
  return refusal('SET', key, 'payload') or refusal('ZADD', stream .. ':payloads', '0', 'member')
end
`

// aclCheckLua is refusalLua with settleRefusal, with which the settle and effectively-once scripts
// check the settle steps' commands (settleSteps), those that the arguments from ARGV[i], the number
// of IDs to ack, make run: it returns the refusal, if any, and the index after the settle
// arguments.
const aclCheckLua = settleOps + refusalLua + `local function settleRefusal(i)
  for _, op in ipairs(settleOps) do
    local c = op[3] * tonumber(ARGV[i])
    if c > 0 then
      local refused
      if op[1] == 'XACK' then
        refused = refusal('XACK', KEYS[1], ARGV[1], ARGV[i + 1])
      else
        refused = refusal(op[1], KEYS[op[2]], unpack(ARGV, i + 1, i + math.min(c, 2)))
      end
      if refused then
        return refused, i
      end
    end
    i = i + 1 + c
  end
  return nil, i
end
`

// settleSteps are the settle script's steps from the IDs on, shared with the effectively-once
// commit script (onceScript), which both define settleOps (aclCheckLua): the Lua variable i is the
// index in ARGV of the number of IDs to ack, KEYS[1] the input stream, KEYS[2] the retry set,
// KEYS[4] the state hash, KEYS[5] the timer set and KEYS[6] the holds set. They define acked, the
// number of entries acked, and leave i after the arguments they read.
const settleSteps = `local acked = 0
for _, op in ipairs(settleOps) do
  local c = op[3] * tonumber(ARGV[i])
  i = i + 1
  for j = i, i + c - 1, 1000 do
    local last = math.min(j + 999, i + c - 1)
    if op[1] == 'XACK' then
      acked = acked + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, j, last))
    else
      redis.call(op[1], KEYS[op[2]], unpack(ARGV, j, last))
    end
  end
  i = i + c
end
`

// checkpointScript records a source's checkpoint only if the source's lease still holds the
// caller's owner and token, so that a process that lost the source to another never moves its
// position, and only if the outputs of its transaction were written (see settleScript).
//
//	KEYS[1] checkpoint key, KEYS[2] lease key (the checkpoint key again when not fenced),
//	then the last marker of each effectively-once call, then the streams of the plain outputs
//	ARGV[1] expected lease value ("" when not fenced), ARGV[2] checkpoint, ARGV[3] the number of
//	plain output streams
//	returns 1, or a LEASELOST or UNWRITTEN error
var checkpointScript = goredis.NewScript(`
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return redis.error_reply('` + leaseLostPrefix + ` lease ' .. KEYS[2] .. ' is not held by ' .. ARGV[1])
end
local guarded = #KEYS - tonumber(ARGV[3])
for g = 3, guarded do
  if redis.call('EXISTS', KEYS[g]) == 0 then
    return redis.error_reply('` + unwrittenPrefix + ` no ' .. KEYS[g] .. ': the outputs were not written')
  end
end
for g = guarded + 1, #KEYS do
  if redis.call('TYPE', KEYS[g]).ok ~= 'stream' then
    return redis.error_reply('` + unwrittenPrefix + ` ' .. KEYS[g] .. ' is not a stream: the outputs were not written')
  end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
`)

// deleteIdleConsumerScript deletes a consumer only if it has no pending entries (XGROUP
// DELCONSUMER would drop them from the group's PEL, losing them).
//
//	KEYS[1] stream; ARGV[1] group, ARGV[2] consumer; returns 1 when deleted, 0 when it has
//	pending entries
var deleteIdleConsumerScript = goredis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #p > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
`)

// maxLenCutScript finds the first ID to keep when a stream is cut to ARGV[1] entries, cutting
// at most ARGV[2] entries per call. It runs server-side so that the entries read to find the
// position do not cross the network.
//
//	KEYS[1] stream; ARGV[1] max length, ARGV[2] step
//	returns false when the stream is not longer than max length, else {first kept ID, more}
//	where more is 1 if the step limited the cut
var maxLenCutScript = goredis.NewScript(`
local n = redis.call('XLEN', KEYS[1])
local excess = n - tonumber(ARGV[1])
if excess <= 0 then
  return false
end
local more = 0
local step = tonumber(ARGV[2])
if excess > step then
  excess = step
  more = 1
end
local r = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', excess + 1)
return {r[excess + 1][1], more}
`)

// isLeaseLost reports whether err is the LEASELOST error reply of a fenced script.
func isLeaseLost(err error) bool {
	return err != nil && strings.Contains(err.Error(), leaseLostPrefix)
}

// isUnwritten reports whether err is the UNWRITTEN error reply of a settle or checkpoint script.
func isUnwritten(err error) bool {
	return err != nil && strings.Contains(err.Error(), unwrittenPrefix)
}

// xaddOnceScript appends entries to one stream unless their effectively-once marker exists,
// writing each marker (with a time to live) atomically with its XADD. One call per output
// stream per batch.
//
// An entry whose payload is offloaded (offload.go) has its payload stored after its XADD and before
// its marker. A staged payload that is gone stops the script before the entry's XADD, as a failure
// does (its marker and the ones after it are not written); one that is not needed, because the
// entry was written before, is deleted.
//
//	KEYS[1] stream, KEYS[2..] one marker per entry (same hash tag as the stream)
//	ARGV[1] marker ttl in ms, then per entry: its payload key and payload ('' when staged) when
//	the payload is offloaded, else an empty string; the number of field/value strings, then them
//	returns the entry IDs, in order: the new ID, or the ID stored in an existing marker
var xaddOnceScript = goredis.NewScript(keepPayloadLua + `
local ids = {}
local a = 2
for i = 2, #KEYS do
  local pkey, body = ARGV[a], nil
  if pkey ~= '' then
    body = ARGV[a + 1]
    a = a + 1
  end
  local n = tonumber(ARGV[a + 1])
  a = a + 2
  local prev = redis.call('GET', KEYS[i])
  if prev then
    if body == '' then
      redis.call('DEL', pkey .. ':staged')
    end
    ids[#ids + 1] = prev
  else
    local gone = body and unstaged(pkey, body)
    if gone then
      return gone
    end
    local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, a, a + n - 1))
    if body then
      keepPayload(KEYS[1], id, pkey, body)
    end
    redis.call('SET', KEYS[i], id, 'PX', ARGV[1])
    ids[#ids + 1] = id
  end
  a = a + n
end
return ids
`)

// onceScript commits a batch of effectively-once outputs on a single server in one atomic step
// that writes its outputs and settles its inputs together, or does nothing: it checks the lease,
// then that the commit is not one it has already made, then that every output key is a stream or
// absent, and only then writes the outputs (XADD), acks the inputs, moves the retries, writes the
// state and records the commit. Nothing it writes is ever written again, because an input that
// is processed again is one whose commit never ran (see Commit); so it needs no marker per
// output. A script that returns an error before its first write has written nothing, and one
// that has written runs to its end (Redis refuses a script's writes for lack of memory only at
// its first write).
//
// A payload staged for the commit (stageLarge) is checked to be there with the rest, before the
// first write, and so is the user's permission to run each command it will run on its key
// (aclCheckLua): a refusal after the first XADD would leave the outputs written and the inputs
// unacked, to be written again.
//
// The commit key (LeaseCommit of the lease) holds the ID of the last commit made by this script
// under the lease: the same call sent again (a client that retries after a lost reply) finds it
// and writes nothing.
//
//	KEYS[1..6] as settleScript's (input stream, retry set, lease key, state hash, timer set, holds
//	set), KEYS[7] the commit key, then the output streams, then the watermarks hashes to set
//	(CommitArgs.Marks), as many as the last ARGV says
//	ARGV[1] group, ARGV[2] lease value, ARGV[3] commit ID, ARGV[4] its time to live in ms,
//	ARGV[5] the number of outputs, then per output: the index in KEYS of its stream, its MAXLEN
//	(0: none), its payload key and payload ('' when staged) when the payload is offloaded
//	(offload.go) or else an empty string, the number of field/value strings and them; then the settle arguments from the
//	number of IDs to ack on, as settleScript's; then per watermarks hash twice the number of
//	fields to set and their (field, value) pairs; then the number of watermarks hashes
//	returns {1, the IDs of the outputs...}, {0} when the commit was already made, or a LEASELOST,
//	UNWRITTEN, WRONGTYPE or NOPERM error
var onceScript = goredis.NewScript(keepPayloadLua + aclCheckLua + `
if redis.call('GET', KEYS[3]) ~= ARGV[2] then
  return redis.error_reply('` + leaseLostPrefix + ` lease ' .. KEYS[3] .. ' is not held by ' .. ARGV[2])
end
if redis.call('GET', KEYS[7]) == ARGV[3] then
  return {0}
end
local marks = tonumber(ARGV[#ARGV])
for g = 8, #KEYS - marks do
  local t = redis.call('TYPE', KEYS[g]).ok
  if t ~= 'stream' and t ~= 'none' then
    return redis.error_reply('WRONGTYPE ' .. KEYS[g] .. ' holds a ' .. t .. ', not a stream: nothing was written and nothing was acked')
  end
  local refused = refusal('XADD', KEYS[g], '*', 'field', 'value')
  if refused then
    return refused
  end
end
` + checkStateTypes + `local i = 6
for o = 1, tonumber(ARGV[5]) do
  if ARGV[i + 2] ~= '' then
    local refused = unstaged(ARGV[i + 2], ARGV[i + 3]) or payloadRefusal(KEYS[tonumber(ARGV[i])], ARGV[i + 2], ARGV[i + 3])
    if refused then
      return refused
    end
    i = i + 1
  end
  i = i + 4 + tonumber(ARGV[i + 3])
end
local refused, m = settleRefusal(i)
for k = #KEYS - marks + 1, #KEYS do
  local c = tonumber(ARGV[m])
  if c > 0 then
    refused = refused or refusal('HSET', KEYS[k], ARGV[m + 1], ARGV[m + 2])
  end
  m = m + 1 + c
end
refused = refused or refusal('SET', KEYS[7], ARGV[3], 'PX', ARGV[4])
if refused then
  return refused
end
local ids = {1}
i = 6
for o = 1, tonumber(ARGV[5]) do
  local key = KEYS[tonumber(ARGV[i])]
  local maxlen = ARGV[i + 1]
  local pkey, body = ARGV[i + 2], nil
  if pkey ~= '' then
    body = ARGV[i + 3]
    i = i + 1
  end
  local f = tonumber(ARGV[i + 3])
  i = i + 4
  local id
  if maxlen ~= '0' then
    id = redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', unpack(ARGV, i, i + f - 1))
  else
    id = redis.call('XADD', key, '*', unpack(ARGV, i, i + f - 1))
  end
  if body then
    keepPayload(key, id, pkey, body)
  end
  ids[#ids + 1] = id
  i = i + f
end
` + settleSteps + `for k = #KEYS - marks + 1, #KEYS do
  local c = tonumber(ARGV[i])
  i = i + 1
  if c > 0 then
    redis.call('HSET', KEYS[k], unpack(ARGV, i, i + c - 1))
  end
  i = i + c
end
redis.call('SET', KEYS[7], ARGV[3], 'PX', ARGV[4])
return ids
`)
