package stages

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// The versions of a key of a versioned table (a table with history or event_time), as its stage
// keeps them in the key's state entry and lookups read them: each version is a row and the event
// time it starts to hold at, until the next one's; a delete is a version without a row. They are
// kept sorted by time, one per time (a later update at the same time replaces the version).
//
// The entry is JSON, [[ms, row], ...], with row the payload as it came (null for a delete), so that
// redis-cli users can read it, and a row is passed on without being decoded and encoded again.

// tableVersion is one version of a key.
type tableVersion struct {
	At  int64           // Unix ms
	Row json.RawMessage // nil: deleted
}

// tableVersions are a key's versions, oldest first.
type tableVersions []tableVersion

func (v tableVersion) MarshalJSON() ([]byte, error) {
	row := v.Row
	if row == nil {
		row = json.RawMessage("null")
	}
	return json.Marshal([]any{v.At, row})
}

func (v *tableVersion) UnmarshalJSON(b []byte) error {
	var pair []json.RawMessage
	if err := json.Unmarshal(b, &pair); err != nil || len(pair) != 2 {
		return fmt.Errorf("a version is [time, row], not %s", b)
	}
	if err := json.Unmarshal(pair[0], &v.At); err != nil {
		return fmt.Errorf("a version's time is Unix ms, not %s", pair[0])
	}
	v.Row = nil
	if !isNullPayload(pair[1]) {
		v.Row = pair[1]
	}
	return nil
}

// decodeVersions reads a key's state entry.
func decodeVersions(b []byte) (tableVersions, error) {
	var vs tableVersions
	if err := json.Unmarshal(b, &vs); err != nil {
		return nil, fmt.Errorf("the versions of a table's row cannot be read: %w", err)
	}
	return vs, nil
}

// put adds a version at its time, replacing one at the same time.
func (vs tableVersions) put(v tableVersion) tableVersions {
	i := sort.Search(len(vs), func(i int) bool { return vs[i].At >= v.At })
	if i < len(vs) && vs[i].At == v.At {
		vs[i] = v
		return vs
	}
	vs = append(vs, tableVersion{})
	copy(vs[i+1:], vs[i:])
	vs[i] = v
	return vs
}

// trim forgets the versions that stopped holding before the point: it keeps the latest version that
// began at or before it (which still holds there) and every later one. A key whose only version
// left is a delete is forgotten altogether (nil).
func (vs tableVersions) trim(point int64) tableVersions {
	first := 0
	for i, v := range vs {
		if v.At <= point {
			first = i
		}
	}
	vs = vs[first:]
	if len(vs) == 1 && vs[0].Row == nil {
		return nil
	}
	return vs
}

// asOf returns the version that holds at the time: the latest that began at or before it. None
// (false) when every kept version began after it, or the one that holds is a delete.
func (vs tableVersions) asOf(at int64) ([]byte, bool) {
	i := sort.Search(len(vs), func(i int) bool { return vs[i].At > at })
	if i == 0 || vs[i-1].Row == nil {
		return nil, false
	}
	return vs[i-1].Row, true
}

// latest returns the latest version's row; false when the key is deleted.
func (vs tableVersions) latest() ([]byte, bool) { return vs.asOf(maxMillis) }

// maxMillis is later than any event time.
const maxMillis = int64(1<<63 - 1)

// TableRow returns the row that a table's state entry (of a key) holds at the time (Unix ms; the
// latest row for any time at or after its latest version's), for the table readers of the
// runtime: versioned says how the table keeps its rows (flow.Table.Versioned). A table that keeps
// only the latest payload holds it whatever the time.
func TableRow(entry []byte, versioned bool, at time.Time) ([]byte, bool, error) {
	if !versioned {
		return entry, true, nil
	}
	vs, err := decodeVersions(entry)
	if err != nil {
		return nil, false, err
	}
	if at.IsZero() {
		row, ok := vs.latest()
		return row, ok, nil
	}
	row, ok := vs.asOf(at.UnixMilli())
	return row, ok, nil
}
