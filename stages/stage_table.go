package stages

import (
	"bytes"
	"context"
	"errors"
	"strings"

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
			t := &tableStage{key: key, keyedByKey: keyed}
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
	if deleted {
		return out, st.Delete(ctx, key)
	}
	row, err := m.Payload()
	if err != nil {
		return out, err
	}
	return out, st.Put(ctx, key, row)
}

// sameSource reports whether two expressions' source texts are the same but for spacing.
func sameSource(a, b string) bool {
	return strings.Join(strings.Fields(a), "") == strings.Join(strings.Fields(b), "")
}

// isNullPayload reports whether a payload as it arrived is the JSON null.
func isNullPayload(raw []byte) bool {
	return raw != nil && bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}
