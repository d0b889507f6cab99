package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Every message is a 200-byte JSON object whose fixed-width fields can be read back without a JSON
// parser:
//
//	{"ts":1764478823321000000,"seq":"f000001234","key":"k0421","id":"f000001233","amount":1234,"at":1764478823321,"pad":"xxxx...."}
//
// ts is the Unix time in nanoseconds when the message was published (for end-to-end latency), seq
// starts with the phase that sent it (w warm-up, l latency, f flat out, b backlog, p publish)
// followed by the message's number in that phase. The other fields are what the stateful scenarios
// read: key is one of aggKeys groups (spread over the numbers by a hash), amount a number to sum, at
// the event time (ts in Unix milliseconds), and id what makes two messages the same for a dedupe
// stage: the phase and number, except that every dupEvery-th message repeats the id of the one
// before it.
const (
	payloadSize = 200
	tsDigits    = 19
	seqDigits   = 9
	keyDigits   = 4
	atDigits    = 13

	payloadHead   = `{"ts":`
	payloadSeq    = `,"seq":"`
	payloadKey    = `","key":"k`
	payloadID     = `","id":"`
	payloadAmount = `","amount":`
	payloadAt     = `,"at":`
	payloadPad    = `,"pad":"`
	payloadTail   = `"}`

	tsOffset     = len(payloadHead)
	phaseOffset  = tsOffset + tsDigits + len(payloadSeq)
	seqOffset    = phaseOffset + 1
	keyOffset    = seqOffset + seqDigits + len(payloadKey)
	idOffset     = keyOffset + keyDigits + len(payloadID) // the phase, then seqDigits
	amountOffset = idOffset + 1 + seqDigits + len(payloadAmount)
	atOffset     = amountOffset + amountDigits + len(payloadAt)
	padOffset    = atOffset + atDigits + len(payloadPad)
	padLen       = payloadSize - padOffset - len(payloadTail)
)

// How many groups the aggregate scenario's messages fall into, and how often the dedupe scenario's
// repeat an id.
const (
	aggKeys  = 1000
	dupEvery = 10 // one message in ten is a duplicate
)

// amountDigits is the width of amount, 1000 to 9999: JSON numbers have no leading zeros.
const amountDigits = 4

// Phases of a run, as the first character of seq.
const (
	phaseWarm    = 'w'
	phaseLatency = 'l'
	phaseFlat    = 'f'
	phaseBacklog = 'b'
	phasePublish = 'p'
)

const (
	fieldPayload = "payload"
	wmUUIDField  = "_watermill_message_uuid" // Watermill's unmarshaller requires it
)

// format is how the harness writes an entry: flowrun's and the raw hops' (a payload field) or
// Watermill's (its message UUID field too).
type format int

const (
	formatPlain format = iota
	formatWatermill
)

var payloadTemplate = func() []byte {
	var b strings.Builder
	b.WriteString(payloadHead)
	b.WriteString(strings.Repeat("0", tsDigits))
	b.WriteString(payloadSeq)
	b.WriteString("x" + strings.Repeat("0", seqDigits))
	b.WriteString(payloadKey)
	b.WriteString(strings.Repeat("0", keyDigits))
	b.WriteString(payloadID)
	b.WriteString("x" + strings.Repeat("0", seqDigits))
	b.WriteString(payloadAmount)
	b.WriteString("1000")
	b.WriteString(payloadAt)
	b.WriteString(strings.Repeat("0", atDigits))
	b.WriteString(payloadPad)
	b.WriteString(strings.Repeat("x", padLen))
	b.WriteString(payloadTail)
	return []byte(b.String())
}()

// putPayload writes the payload of message seq of a phase, published at ts, into dst (which must
// hold payloadSize bytes).
func putPayload(dst []byte, ts int64, phase byte, seq int) {
	copy(dst, payloadTemplate)
	putDigits(dst[tsOffset:tsOffset+tsDigits], uint64(ts))
	dst[phaseOffset] = phase
	putDigits(dst[seqOffset:seqOffset+seqDigits], uint64(seq))
	putDigits(dst[keyOffset:keyOffset+keyDigits], groupOf(seq))
	dst[idOffset] = phase
	putDigits(dst[idOffset+1:idOffset+1+seqDigits], uint64(idOf(seq)))
	putDigits(dst[amountOffset:amountOffset+amountDigits], uint64(1000+seq%9000))
	putDigits(dst[atOffset:atOffset+atDigits], uint64(ts/int64(time.Millisecond)))
}

// groupOf spreads the numbers over aggKeys groups as a hash would: a batch of consecutive messages
// touches about two thirds of the groups, some more than once, as traffic keyed by customer does.
func groupOf(seq int) uint64 {
	return (uint64(seq) * 0x9E3779B97F4A7C15 >> 32) % aggKeys
}

// idOf is the number in a message's dedupe id: its own, or for every dupEvery-th message that of
// the message before it.
func idOf(seq int) int {
	if seq%dupEvery == dupEvery-1 {
		return seq - 1
	}
	return seq
}

// distinct is how many messages of a phase of n a dedupe stage passes on: all but the repeats.
func distinct(n int) int { return n - n/dupEvery }

func putDigits(dst []byte, v uint64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = byte('0' + v%10)
		v /= 10
	}
}

// readPayload returns the publish time and phase of a payload, ok false if it is not one of ours.
func readPayload(p string) (ts int64, phase byte, ok bool) {
	if len(p) != payloadSize || !strings.HasPrefix(p, payloadHead) {
		return readChanged(p)
	}
	ts, err := strconv.ParseInt(p[tsOffset:tsOffset+tsDigits], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return ts, p[phaseOffset], true
}

// inputsOf is how many of a phase of n messages a dedupe stage has read when arrived of them have
// come out: all n once every distinct one has.
func inputsOf(arrived, n int) int {
	if arrived >= distinct(n) {
		return n
	}
	return arrived * dupEvery / (dupEvery - 1)
}

// readChanged reads a payload that a stage changed on its way (a lookup adds a field, and the
// fields of a payload it writes come out sorted), by decoding it: slower than readPayload's fixed
// offsets, which the harness's own payloads keep.
func readChanged(p string) (ts int64, phase byte, ok bool) {
	var v struct {
		TS  int64  `json:"ts"`
		Seq string `json:"seq"`
	}
	if json.Unmarshal([]byte(p), &v) != nil || v.TS == 0 || v.Seq == "" {
		return 0, 0, false
	}
	return v.TS, v.Seq[0], true
}
