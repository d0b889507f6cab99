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
				eventTime: flow.EventTimeOf(s), ttl: s.Config.Duration(flow.TableTTLAttribute)}
			t.versioned = t.history > 0 || t.eventTime != nil
			st := StatefulStage{Processor: t, Absorbs: true}
			if t.ttl > 0 {
				// Its timers forget keys: they do not fire at a job's end, and stay for the next run.
				st.TimerHandler = t
			}
			return st, nil
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
	// ttl, when above 0, forgets a key once the watermark is ttl past its last update (a timer
	// per key, "ttl:" and the key); a versioned key's last update is its latest version's time.
	ttl time.Duration
}

// ttlTimer names the timer that forgets a key.
func ttlTimer(key string) string { return "ttl:" + key }

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
		return out, t.forget(ctx, st, key)
	}
	if err := st.Put(ctx, key, row); err != nil {
		return out, err
	}
	if t.ttl <= 0 {
		return out, nil
	}
	at, err := EventTime(nil, m)
	if err != nil {
		return out, err
	}
	return out, st.SetTimer(ctx, ttlTimer(key), at.Add(t.ttl))
}

// forget deletes a key, and its timer.
func (t *tableStage) forget(ctx context.Context, st State, key string) error {
	if err := st.Delete(ctx, key); err != nil {
		return err
	}
	if t.ttl <= 0 {
		return nil
	}
	return st.CancelTimer(ctx, ttlTimer(key))
}

// OnTimer forgets a key that has not been updated for ttl: the watermark has passed its last
// update by that much. A later update moves the timer, and a delete cancels it.
func (t *tableStage) OnTimer(ctx context.Context, st State, name string, _ time.Time, out []Output) ([]Output, error) {
	key, ok := strings.CutPrefix(name, "ttl:")
	if !ok {
		return out, nil
	}
	return out, st.Delete(ctx, key)
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
	// A key whose time is up is forgotten, whether or not its timer has fired yet: the timers of a
	// batch fire after its messages, and what the key holds must not depend on where batches end.
	if t.ttl > 0 && len(vs) > 0 && !watermark.Before(time.UnixMilli(vs[len(vs)-1].At).Add(t.ttl)) {
		vs = nil
	}
	vs = vs.put(tableVersion{At: at.UnixMilli(), Row: row})
	// Without history one version is kept: the latest in event time.
	point := maxMillis
	if t.history > 0 {
		point = watermark.Add(-t.history).UnixMilli()
	}
	if vs = vs.trim(point); vs == nil {
		return t.forget(ctx, st, key)
	}
	b, err := json.Marshal(vs)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, key, b); err != nil {
		return err
	}
	if t.ttl <= 0 {
		return nil
	}
	return st.SetTimer(ctx, ttlTimer(key), time.UnixMilli(vs[len(vs)-1].At).Add(t.ttl))
}

// sameSource reports whether two expressions' source texts are the same but for spacing.
func sameSource(a, b string) bool {
	return strings.Join(strings.Fields(a), "") == strings.Join(strings.Fields(b), "")
}

// isNullPayload reports whether a payload as it arrived is the JSON null.
func isNullPayload(raw []byte) bool {
	return raw != nil && bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}
