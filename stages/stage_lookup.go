package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The lookup stage's attributes, and the values of missing.
const (
	lookupFieldTable   = "table"
	lookupFieldKey     = "key"
	lookupFieldAs      = "as"
	lookupFieldMissing = "missing"
	lookupFieldAsOf    = "as_of"

	lookupMissingNull       = "null"
	lookupMissingDrop       = "drop"
	lookupMissingDeadLetter = "dead_letter"
)

// The lookup stage enriches each message with the row of a table (a table block) that its key
// finds. It keeps no state of its own: it reads the table's, which the table's stage keeps, from
// whichever partition holds the key (Env.Tables), so the stream and the table need not be
// partitioned alike.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name: "lookup",
			// With as_of, its state is the messages waiting for the table's watermark.
			StateShape: []string{lookupFieldTable, lookupFieldAsOf},
			Doc: "Adds to each message the row of a table that its key finds, at msg.<as>. The row is the table's as it " +
				"is when the message is processed (processing time): a lookup stage starts once its table has caught up " +
				"with what the table's topic held when the stage started, and sees each update from when the table's stage " +
				"has committed it. A lookup reads whichever partition of the table holds the key, so the stream and the " +
				"table need not be partitioned alike.",
			Attributes: []flow.Attribute{
				{Name: lookupFieldTable, Type: flow.TypeTableRef, Required: true, Doc: "The table to look keys up in, as table.NAME."},
				{Name: lookupFieldKey, Type: flow.TypeMessageExpr, Required: true, Roots: []string{"msg"}, Doc: "The key to look up, such as msg.customer_id."},
				{Name: lookupFieldAs, Type: flow.TypeString, Required: true, Doc: "The field the row lands at: as = \"customer\" sets msg.customer."},
				{
					Name: lookupFieldMissing, Type: flow.TypeString, Default: lookupMissingNull,
					Enum: []string{lookupMissingNull, lookupMissingDrop, lookupMissingDeadLetter},
					Doc: `What becomes of a message whose key the table does not hold: "null" passes it on with msg.<as> = null, ` +
						`"drop" drops it (counted as filtered), "dead_letter" sends it to the stage's dead letters with a reason that ` +
						`names the table and the key.`,
				},
				{
					Name: lookupFieldAsOf, Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true,
					Doc: "The event time to look the row up as of, such as msg.created_at (an RFC 3339 string, or Unix " +
						"milliseconds): the message gets the version of the row that held then, from a table with history. It waits " +
						"in the stage's state until the table's watermark has passed that time (no update the table has yet to read " +
						"can then change the answer), so the result depends only on event times, not on the order in which the " +
						"messages and the table's updates arrive; messages leave in the order of their as_of times.",
				},
			},
			Example: `stage "enriched" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
  missing = "null"
}`,
			// With as_of, messages wait for the table's watermark to pass their as_of time.
			Delays: func(config flow.Attrs) *expr.Program { return config.Expr(lookupFieldAsOf) },
			Check: func(c *flow.KindCheck) {
				if c.Has(lookupFieldAsOf) {
					checkAsOf(c)
				}
				if c.Has(lookupFieldAs) && strings.TrimSpace(c.Config.String(lookupFieldAs)) == "" {
					c.Errorf(lookupFieldAs, "Invalid as", `as names the field the row lands at, such as as = "customer": it cannot be empty.`)
				}
				if k := c.Config.Expr(lookupFieldKey); k != nil {
					if _, constant := k.Constant(); constant {
						c.Errorf(lookupFieldKey, "Invalid key",
							"key is computed from each message, such as key = msg.customer_id: a constant would look every message up under one key.")
					}
				}
			},
		},
		// With as_of the stage keeps the messages that wait for their table in its state.
		TraitsOf: func(config flow.Attrs) StageTraits {
			return StageTraits{KeepsKey: true, Stateful: config.Has(lookupFieldAsOf)}
		},
		New: func(s *flow.Stage, env Env) (Processor, error) { return newLookup(s, env) },
		NewStateful: func(s *flow.Stage, env Env) (StatefulStage, error) {
			l, err := newLookup(s, env)
			if err != nil {
				return StatefulStage{}, err
			}
			a := &asOfLookup{lookupStage: l, asOf: s.Config.Expr(lookupFieldAsOf)}
			return StatefulStage{Processor: a, TimerHandler: a, Absorbs: true, StatePrefetcher: a, TableTime: l.table}, nil
		},
	})
}

// checkAsOf checks as_of against the table it reads: only a table with history keeps the versions
// it needs.
func checkAsOf(c *flow.KindCheck) {
	if t := c.Config.Table(lookupFieldTable); t != nil && t.History <= 0 {
		c.Errorf(lookupFieldAsOf, "as_of needs the table's history",
			"as_of looks a row up as it was at an event time, from the older versions a table keeps: give table %q a history, "+
				"such as history = \"1h\" (how far back a lookup may look), or remove as_of to read the latest row.", t.Name)
	}
}

func newLookup(s *flow.Stage, env Env) (*lookupStage, error) {
	t := s.Config.Table(lookupFieldTable)
	if t == nil {
		return nil, fmt.Errorf("stage %s: no table", s.Name)
	}
	reader, ok := env.Tables[t.Name]
	if !ok {
		return nil, fmt.Errorf("stage %s: the runtime gives no reader of table %s", s.Name, t.Name)
	}
	return &lookupStage{out: s.Output, table: t.Name, reader: reader, key: s.Config.Expr(lookupFieldKey),
		as: s.Config.String(lookupFieldAs), missing: s.Config.String(lookupFieldMissing)}, nil
}

// lookupStage sets msg.<as> to the row its key finds.
type lookupStage struct {
	out     *flow.Topic
	table   string
	reader  TableReader
	key     *expr.Program
	as      string
	missing string
}

// lookupRows are the rows of a batch's keys, read at once (ReadBatch): nil for a key the table
// does not hold; a key that is not there was not read.
type lookupRows map[string][]byte

// ReadBatch reads the rows of every key of a batch in one round trip (a pipeline of one HMGET per
// partition of the table), for Process to find (stages.BatchReader). A message whose key cannot be
// computed is left to Process, which says why.
func (s *lookupStage) ReadBatch(ctx context.Context, msgs []*Message) (any, error) {
	rows := make(lookupRows, len(msgs))
	keys := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if m.Decode() != nil {
			continue
		}
		key, err := s.key.EvalString(&expr.Env{Msg: m.Value})
		if err != nil || !rowKey(key) {
			continue
		}
		if _, seen := rows[key]; !seen {
			rows[key] = nil
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return rows, nil
	}
	found, err := s.reader.GetMany(ctx, keys)
	if err != nil {
		return nil, err
	}
	for i, key := range keys {
		rows[key] = found[i]
	}
	return rows, nil
}

// rowKey reports whether a key may have a row: no row has an empty key, nor one that begins with a
// NUL byte (the state's own fields).
func rowKey(key string) bool { return key != "" && !strings.HasPrefix(key, "\x00") }

func (s *lookupStage) Process(ctx context.Context, m *Message, out []Output) ([]Output, error) {
	return s.enrich(ctx, m, time.Time{}, out)
}

// enrich adds the row of m's key to m, as of a time (zero: the latest).
func (s *lookupStage) enrich(ctx context.Context, m *Message, at time.Time, out []Output) ([]Output, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	key, err := s.key.EvalString(&expr.Env{Msg: m.Value})
	if err != nil {
		return out, evalError(err)
	}
	var row []byte
	found := false
	if rowKey(key) {
		rows, _ := Batched(ctx).(lookupRows)
		if batched, read := rows[key]; read && at.IsZero() {
			row, found = batched, batched != nil
		} else if row, found, err = s.reader.GetAsOf(ctx, key, at); err != nil {
			return out, err
		}
	}
	var value any
	if found {
		v, err := DecodePayload(row)
		if err != nil {
			return out, Permanent(fmt.Errorf("the row of key %q in table %s cannot be read: %w", key, s.table, err))
		}
		value = v
	} else {
		switch s.missing {
		case lookupMissingDrop:
			return out, nil
		case lookupMissingDeadLetter:
			return append(out, Output{Topic: s.out, Message: *m,
				DeadLetter: fmt.Sprintf("table %s has no row of key %q", s.table, key)}), nil
		}
	}
	m.Value[s.as] = value
	m.Changed()
	return append(out, Output{Topic: s.out, Message: *m}), nil
}

// asOfLookup is a lookup with as_of: each message waits in the state of its input partition, under
// a timer at its as_of time, until the table's watermark has passed that time
// (StatefulStage.TableTime), and is then enriched with the version of its row that held at it.
// Once the watermark has passed, every update of the table up to that time that is not late has
// been committed, so the answer no longer depends on what arrives when.
type asOfLookup struct {
	*lookupStage
	asOf *expr.Program
}

// lookupSeqKey is the state entry that numbers the waiting messages of a partition: a message's
// name, "o:" and its number, is its state entry and its timer, and names its output for
// effectively-once delivery, so two equal messages stay two.
const lookupSeqKey = "seq"

// waitingMessage is a message as it waits in the state.
type waitingMessage struct {
	Key     string            `json:"k"`
	Headers map[string]string `json:"h,omitempty"`
	Payload json.RawMessage   `json:"p"`
}

func (s *asOfLookup) Process(ctx context.Context, st State, m *Message, out []Output) ([]Output, error) {
	at, err := EventTime(s.asOf, m)
	if err != nil {
		return out, err
	}
	payload, err := m.Payload()
	if err != nil {
		return out, err
	}
	seq := int64(0)
	if b, found, err := st.Get(ctx, lookupSeqKey); err != nil {
		return out, err
	} else if found {
		if seq, err = strconv.ParseInt(string(b), 10, 64); err != nil {
			return out, Permanent(fmt.Errorf("the state entry %q is %q, not a number", lookupSeqKey, b))
		}
	}
	seq++
	name := "o:" + strconv.FormatInt(seq, 10)
	entry, err := json.Marshal(waitingMessage{Key: m.Key, Headers: m.Headers, Payload: payload})
	if err != nil {
		return out, err
	}
	if err := st.Put(ctx, lookupSeqKey, []byte(strconv.FormatInt(seq, 10))); err != nil {
		return out, err
	}
	if err := st.Put(ctx, name, entry); err != nil {
		return out, err
	}
	// Due once the table's watermark is past the time: an update at the time itself may still come.
	return out, st.SetTimer(ctx, name, time.UnixMilli(at.UnixMilli()+1))
}

// StateKeys names what Process reads, so that a batch reads it once (StatePrefetcher).
func (s *asOfLookup) StateKeys(_ *Message, keys []string) []string { return append(keys, lookupSeqKey) }

// TimerStateKeys names what OnTimer reads for a timer (TimerStatePrefetcher): the waiting message,
// whose state entry has the timer's name.
func (s *asOfLookup) TimerStateKeys(timer string, keys []string) []string { return append(keys, timer) }

// OnTimer answers a waiting message: the table's watermark has passed its as_of time.
func (s *asOfLookup) OnTimer(ctx context.Context, st State, name string, due time.Time, out []Output) ([]Output, error) {
	entry, found, err := st.Get(ctx, name)
	if err != nil || !found {
		return out, err
	}
	if err := st.Delete(ctx, name); err != nil {
		return out, err
	}
	var w waitingMessage
	if err := json.Unmarshal(entry, &w); err != nil {
		return out, Permanent(fmt.Errorf("the waiting message %s cannot be read: %w", name, err))
	}
	m := NewMessage(w.Key, w.Payload, w.Headers)
	enriched, err := s.enrich(ctx, &m, time.UnixMilli(due.UnixMilli()-1), out)
	if err != nil && IsPermanent(err) {
		// Its input entry was acknowledged when it came: its dead letter goes with the timer.
		return append(out, Output{Message: NewMessage(w.Key, w.Payload, w.Headers), DeadLetter: err.Error()}), nil
	}
	return enriched, err
}
