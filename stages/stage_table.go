package stages

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The table stage is the one the compiler makes of a table block (flow.TableKind): it keeps the
// latest payload of each key of the table's topic in its input partition's state, and deletes the
// key on a message whose payload is null. Lookup stages read that state (TableReader). Its state
// is committed with the acks of its input, like any stateful stage's, so the table moves with the
// partition's lease and survives crashes with nothing to restore.
//
// No pipeline names this kind: it is registered with the runtime only, not with the language.
func init() {
	kinds.Lock()
	defer kinds.Unlock()
	kinds.stages[flow.TableKind] = StageKind{
		Spec:   &flow.Kind{Name: flow.TableKind, Doc: "Keeps the latest value per key of a table's topic."},
		Traits: StageTraits{Stateful: true},
		NewStateful: func(s *flow.Stage, _ Env) (StatefulStage, error) {
			// Its input is keyed by the table's key, the table's topic or the repartition topic the
			// compiler inserted: without one, a message's key is its row's key, a delete's too.
			key := s.Config.Expr(flow.TableKeyAttribute)
			keyed := key == nil || s.Input.Key != nil && sameSource(s.Input.Key.String(), key.String())
			t := &tableStage{key: key, keyedByKey: keyed, history: s.Config.Duration(flow.TableHistoryAttribute),
				eventTime: flow.EventTimeOf(s)}
			t.versioned = t.history > 0 || t.eventTime != nil
			return StatefulStage{Processor: t, Absorbs: true}, nil
		},
	}
}

// tableStage stores each message's payload under its key.
type tableStage struct {
	key *expr.Program // nil: the message's key
	// keyedByKey: the stage's input is keyed by the table's key itself, so that a message's key
	// is its row's, and a delete (a null payload, which has no fields to read) finds its row.
	keyedByKey bool
	// versioned: the table keeps versions in event time (table_versions.go), history long, each
	// starting at its eventTime (nil: its entry's time); otherwise each key's last payload.
	versioned bool
	history   time.Duration
	eventTime *expr.Program
}

// errNoRowKey fails a table's message without a key: no lookup could find its row.
var errNoRowKey = errors.New("the message has no key, so no lookup could find it: give the table's topic a key, or the table a key expression")

func (t *tableStage) Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error) {
	deleted := m.IsNull()
	if !deleted {
		if err := m.Decode(); err != nil {
			return out, err
		}
	}
	key := m.Key
	switch {
	case deleted && !t.keyedByKey:
		return out, Permanent(errors.New("a null payload deletes the row of its message key, but this table is keyed by another " +
			"expression than its topic: key the table's topic by the table's key"))
	case t.key != nil && !deleted:
		var err error
		if key, err = t.key.EvalString(&expr.Env{Msg: m.Value}); err != nil {
			return out, evalError(err)
		}
	}
	if key == "" {
		return out, Permanent(errNoRowKey)
	}
	if err := checkStateKey(key); err != nil {
		return out, err
	}
	var row []byte
	if !deleted {
		var err error
		if row, err = m.Payload(); err != nil {
			return out, err
		}
	}
	if t.versioned {
		return out, t.putVersion(ctx, st, key, m, row)
	}
	if deleted {
		return out, st.Delete(ctx, key)
	}
	return out, st.Put(ctx, key, row)
}

// putVersion adds a version of key (row nil: a delete) at the message's event time, and trims the
// key's versions to the table's history before the partition's watermark. A version that comes
// after the watermark has passed its time is late: lookups with as_of may have been answered
// without it (they answer once the watermark passes their time), so it counts as late; it is kept
// all the same, for the lookups still to come.
func (t *tableStage) putVersion(ctx context.Context, st State, key string, m *Message, row []byte) error {
	watermark, err := st.Watermark(ctx)
	if err != nil {
		return err
	}
	at := watermark // a delete, when the table reads event times from fields it does not have
	if row != nil || t.eventTime == nil {
		if at, err = EventTime(t.eventTime, m); err != nil {
			return err
		}
	}
	if at.Before(watermark) {
		st.Record(Late)
	}
	var vs tableVersions
	entry, found, err := st.Get(ctx, key)
	if err != nil {
		return err
	}
	if found {
		if vs, err = decodeVersions(entry); err != nil {
			return Permanent(err)
		}
	}
	vs = vs.put(tableVersion{At: at.UnixMilli(), Row: row})
	// Without history one version is kept: the latest in event time.
	point := maxMillis
	if t.history > 0 {
		point = watermark.Add(-t.history).UnixMilli()
	}
	if vs = vs.trim(point); vs == nil {
		return st.Delete(ctx, key)
	}
	b, err := json.Marshal(vs)
	if err != nil {
		return err
	}
	return st.Put(ctx, key, b)
}

// sameSource reports whether two expressions' source texts are the same but for spacing.
func sameSource(a, b string) bool {
	return strings.Join(strings.Fields(a), "") == strings.Join(strings.Fields(b), "")
}

// isNullPayload reports whether a payload as it arrived is the JSON null.
func isNullPayload(raw []byte) bool {
	return raw != nil && bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}
