package redis

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// streamID is a parsed stream entry ID "<ms>-<seq>".
type streamID struct {
	ms, seq uint64
}

// zeroID is "0-0", the smallest ID.
var zeroID = streamID{}

// parseID parses "<ms>-<seq>" or "<ms>" (sequence 0).
func parseID(s string) (streamID, error) {
	msPart, seqPart, hasSeq := strings.Cut(s, "-")
	ms, err := strconv.ParseUint(msPart, 10, 64)
	if err != nil {
		return streamID{}, fmt.Errorf("redis: invalid stream ID %q", s)
	}
	var seq uint64
	if hasSeq {
		seq, err = strconv.ParseUint(seqPart, 10, 64)
		if err != nil {
			return streamID{}, fmt.Errorf("redis: invalid stream ID %q", s)
		}
	}
	return streamID{ms: ms, seq: seq}, nil
}

func (id streamID) String() string {
	return strconv.FormatUint(id.ms, 10) + "-" + strconv.FormatUint(id.seq, 10)
}

// compare returns -1, 0 or +1.
func (id streamID) compare(o streamID) int {
	switch {
	case id.ms < o.ms:
		return -1
	case id.ms > o.ms:
		return 1
	case id.seq < o.seq:
		return -1
	case id.seq > o.seq:
		return 1
	}
	return 0
}

func (id streamID) less(o streamID) bool { return id.compare(o) < 0 }

// next returns the smallest ID greater than id.
func (id streamID) next() streamID {
	if id.seq == math.MaxUint64 {
		return streamID{ms: id.ms + 1}
	}
	return streamID{ms: id.ms, seq: id.seq + 1}
}

// idAt returns the smallest ID whose timestamp is t (entries with smaller IDs are older).
func idAt(t time.Time) streamID {
	ms := t.UnixMilli()
	if ms < 0 {
		return zeroID
	}
	return streamID{ms: uint64(ms)}
}

func minID(a, b streamID) streamID {
	if a.less(b) {
		return a
	}
	return b
}

func maxID(a, b streamID) streamID {
	if b.less(a) {
		return a
	}
	return b
}

// IDMillis returns the time part of a stream ID ("<ms>-<seq>" or "<ms>"): when the entry was
// written, in Unix milliseconds. It returns an error if id is not a stream ID, or its time does not
// fit an int64. Every reading of an ID's time goes through it.
func IDMillis(id string) (int64, error) {
	x, err := parseID(id)
	if err != nil {
		return 0, err
	}
	if x.ms > math.MaxInt64 {
		return 0, fmt.Errorf("redis: stream ID %q is out of range", id)
	}
	return int64(x.ms), nil
}

// MaxID returns the greatest of stream IDs, each parsed once; "" when there are none. What is not
// an ID is passed over, unless nothing else is there.
func MaxID(ids []string) string {
	best, bestID := "", streamID{}
	for _, id := range ids {
		x, err := parseID(id)
		switch {
		case best == "":
			best, bestID = id, x
		case err == nil && x.compare(bestID) > 0:
			best, bestID = id, x
		}
	}
	return best
}

// CompareIDs compares two stream IDs numerically ("<ms>-<seq>" or "<ms>"), returning -1, 0 or
// +1. It returns an error if either is not an ID.
func CompareIDs(a, b string) (int, error) {
	x, err := parseID(a)
	if err != nil {
		return 0, err
	}
	y, err := parseID(b)
	if err != nil {
		return 0, err
	}
	return x.compare(y), nil
}
