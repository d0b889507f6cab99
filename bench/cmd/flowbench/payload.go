package main

import (
	"strconv"
	"strings"
)

// Every message is a 200-byte JSON object whose fixed-width fields can be read back without a JSON
// parser:
//
//	{"ts":1764478823321000000,"seq":"f000001234","pad":"xxxx...."}
//
// ts is the Unix time in nanoseconds when the message was published (for end-to-end latency), seq
// starts with the phase that sent it (w warm-up, l latency, f flat out, b backlog, p publish)
// followed by the message's number in that phase.
const (
	payloadSize = 200
	tsDigits    = 19
	seqDigits   = 9

	payloadHead = `{"ts":`
	payloadMid  = `,"seq":"`
	payloadPad  = `","pad":"`
	payloadTail = `"}`

	tsOffset    = len(payloadHead)
	phaseOffset = tsOffset + tsDigits + len(payloadMid)
	seqOffset   = phaseOffset + 1
	padOffset   = seqOffset + seqDigits + len(payloadPad)
	padLen      = payloadSize - padOffset - len(payloadTail)
)

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
	b.WriteString(payloadMid)
	b.WriteString("x")
	b.WriteString(strings.Repeat("0", seqDigits))
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
}

func putDigits(dst []byte, v uint64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = byte('0' + v%10)
		v /= 10
	}
}

// readPayload returns the publish time and phase of a payload, ok false if it is not one of ours.
func readPayload(p string) (ts int64, phase byte, ok bool) {
	if len(p) != payloadSize || !strings.HasPrefix(p, payloadHead) {
		return 0, 0, false
	}
	ts, err := strconv.ParseInt(p[tsOffset:tsOffset+tsDigits], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return ts, p[phaseOffset], true
}
