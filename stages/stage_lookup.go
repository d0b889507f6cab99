package stages

import (
	"context"
	"fmt"
	"strings"

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
				{Name: lookupFieldAsOf, Type: flow.TypeMessageExpr, Roots: []string{"msg"}, Doc: "Not supported yet: the row as it was at an event time. flowrun refuses it."},
			},
			Example: `stage "enriched" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
  missing = "null"
}`,
			Check: func(c *flow.KindCheck) {
				if c.Has(lookupFieldAsOf) {
					c.Errorf(lookupFieldAsOf, "Not supported yet",
						"A lookup's as_of is not supported yet: a lookup reads the table as it is when the message is processed. Remove as_of.")
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
		Traits: StageTraits{KeepsKey: true},
		New: func(s *flow.Stage, env Env) (Processor, error) {
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
		},
	})
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
		if batched, read := rows[key]; read {
			row, found = batched, batched != nil
		} else if row, found, err = s.reader.Get(ctx, key); err != nil {
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
