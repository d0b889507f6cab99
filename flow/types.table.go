package flow

import (
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/flowrun/flowrun/flow/expr"
)

// A table is the latest value per key of a topic, materialized as state: the compiler turns each
// table block into a stage of its own kind (TableKind), which reads the table's input and keeps each
// key's latest payload in its input partition's state hash, and a lookup stage (package stages)
// reads that state. The stage is stateful and keyed by the table's key (Kind.StateKey), so where
// the topic is keyed otherwise the compiler inserts a repartition topic before it, as it does for
// an aggregate (repartition.go).

// TableKind is the kind of the stages the compiler makes of table blocks. It is no kind a pipeline
// may name.
const TableKind = "table"

// tableSuffix names a table's stage, customers.table; the dot keeps it apart from every declared
// name, as the implicit topics' .out does.
const tableSuffix = ".table"

// TableKeyAttribute is the attribute of a table's stage (Stage.Config) that holds the table's key
// expression, unset when the table is keyed by its messages' keys.
const TableKeyAttribute = "key"

// The attributes of a table's stage (Stage.Config) besides its key: the table's history and the
// event time of its versions, as the table block sets them.
const (
	TableHistoryAttribute = "history"
	TableTTLAttribute     = "ttl"
	TableGlobalAttribute  = "global"
)

var tableSpec = &BlockSpec{
	Type:   "table",
	Labels: []string{"name"},
	Doc: "The latest value per key of a topic, kept as state in Redis and read by lookup stages with " +
		"table = table.NAME. A message whose payload is null deletes its key. The table is partitioned like " +
		"its topic (by its key), or kept whole in one partition (global), and a lookup reads whichever partition " +
		"holds the key it looks up. With history it keeps older versions, for lookups as_of an event time.",
	Attributes: []Attribute{
		{
			Name: "input", Type: TypeInputRef, Required: true,
			Doc: "The topic whose latest value per key the table holds: topic.NAME, or stage.NAME for a stage's output.",
		},
		{
			Name: TableKeyAttribute, Type: TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true,
			DefaultDoc: "the message's key",
			Doc: "The key of each row, such as msg.customer_id. Where the input topic is keyed otherwise, the table " +
				"reads a repartition topic keyed by it (<table>.table.by_key).",
		},
		{
			Name: TableGlobalAttribute, Type: TypeBool, Default: false,
			Doc: "true keeps the whole table in one partition's state (one hash in one slot, kept by one process at a time " +
				"and moving with its lease), which every lookup reads, through a repartition topic of one partition " +
				"(<table>.table.by_key) where the topic has several: for small tables, whose watermark is then one " +
				"partition's, not held back by a quiet one. false: partitioned like its topic.",
		},
		{
			Name: TableTTLAttribute, Type: TypeDuration,
			Doc: "Forgets a key (with its versions) once the table's watermark has passed its last update by this much, " +
				"such as \"30d\": in event time, the event_time of the key's latest version (or its entry's time). A later " +
				"update keeps the key; a lookup then finds it missing.",
		},
		{
			Name: TableHistoryAttribute, Type: TypeDuration,
			Doc: "How long, in event time, the table keeps the versions a key had before its latest, for lookups with as_of: " +
				"versions that ended more than history before the table's watermark are trimmed, keeping the latest one that " +
				"began at or before that point. Without it the table keeps one version per key.",
		},
		{
			Name: IdleTimeoutAttribute, Type: TypeDuration, Default: DefaultIdleTimeout,
			Doc: "How long a partition of the table goes without updates before its watermark moves on with the clock, " +
				"or, when it has never had one, before lookups as_of stop waiting for it (\"0s\": never). Only lookups " +
				"with as_of wait for the table's watermark.",
		},
		{
			Name: EventTimeAttribute, Type: TypeMessageExpr, Roots: []string{"msg"}, Deterministic: true,
			DefaultDoc: "the time the message's entry was written",
			Doc: "When a version starts to hold: an RFC 3339 string, or Unix milliseconds. With it, the latest version of a key " +
				"is the one with the latest event time, whatever the order updates arrive in; a null payload (a delete) has no " +
				"fields to read, and holds from the table's watermark when it is read.",
		},
	},
}

// Table is a table block as compiled: the stage that materializes it, and what a lookup needs to
// find a key's row.
type Table struct {
	Name string
	// Input is the topic the table reads, as its block names it.
	Input *Topic
	// Key is the table's key expression; nil when the table is keyed by its messages' keys.
	Key *expr.Program
	// History is how long the table keeps older versions of a key, for lookups with as_of; 0: only
	// the latest. EventTime is when a version starts to hold; nil: its entry's time.
	History   time.Duration
	EventTime *expr.Program
	// TTL forgets a key once the table's watermark is that far past its last update; 0: never.
	TTL time.Duration
	// Global keeps the whole table in one partition: its stage reads a repartition topic of one
	// partition where its topic has several (repartition.go).
	Global bool
	// IdleTimeout is how long a partition of the table goes without updates before its watermark
	// moves with the clock (or, without one, stops holding lookups as_of back); 0: never.
	IdleTimeout time.Duration
	// Stage is the stage that keeps the table (of TableKind). Its input, Stage.Input, is where its
	// state lives: the table's topic, or the repartition topic the compiler inserted before it.
	Stage *Stage
	Range hcl.Range
}

// tableStageAttributes are the attributes of a table's stage, set from its block.
var tableStageAttributes = []Attribute{
	{Name: TableKeyAttribute, Type: TypeMessageExpr, Roots: []string{"msg"}},
	{Name: TableHistoryAttribute, Type: TypeDuration},
	{Name: TableTTLAttribute, Type: TypeDuration},
	{Name: TableGlobalAttribute, Type: TypeBool},
	{Name: EventTimeAttribute, Type: TypeMessageExpr, Roots: []string{"msg"}},
	{Name: IdleTimeoutAttribute, Type: TypeDuration},
}

// tableKind is the declaration of the table stages' kind: stateful, keyed by the table's key.
var tableKind = &Kind{
	Name:       TableKind,
	Doc:        "Keeps the latest value per key of a table's topic.",
	Attributes: tableStageAttributes,
	StateKey:   TableKeyAttribute,
	StateShape: []string{TableHistoryAttribute, TableGlobalAttribute},
	Stateful:   func(Attrs) bool { return true },
	KeepsKey:   func(Attrs) bool { return false },
	Detail:     func(Attrs) string { return "table" },
}

// compileTables compiles every table block, after the topics and before the stages that look them
// up. Their stages join the plan in addTableStages.
func (c *compiler) compileTables() {
	for _, b := range c.cfg.Tables {
		attrs := c.decodeAttributes(tableSpec.Attributes, b.Attributes)
		t := &Table{Name: b.Name, Input: attrs.Topic("input"), Key: attrs.Expr(TableKeyAttribute), Range: b.DeclRange,
			History: attrs.Duration(TableHistoryAttribute), TTL: attrs.Duration(TableTTLAttribute),
			EventTime: attrs.Expr(EventTimeAttribute), Global: attrs.Bool(TableGlobalAttribute),
			IdleTimeout: DefaultIdleTimeout}
		if attrs.Has(IdleTimeoutAttribute) {
			t.IdleTimeout = attrs.Duration(IdleTimeoutAttribute)
		}
		if a, ok := b.Attributes[IdleTimeoutAttribute]; ok && attrs.Has(IdleTimeoutAttribute) && t.IdleTimeout < 0 {
			c.errorf(a.Expr.Range(), "Invalid idle_timeout",
				`idle_timeout is how long a partition of the table goes without updates before it stops holding lookups back: a duration, such as "1m" ("0s": never).`)
		}
		if a, ok := b.Attributes[TableHistoryAttribute]; ok && attrs.Has(TableHistoryAttribute) && t.History <= 0 {
			c.errorf(a.Expr.Range(), "Invalid history",
				`history is how long older versions are kept, in event time: a positive duration, such as "1h".`)
		}
		if a, ok := b.Attributes[TableTTLAttribute]; ok && attrs.Has(TableTTLAttribute) && t.TTL <= 0 {
			c.errorf(a.Expr.Range(), "Invalid ttl",
				`ttl is how long a key is kept after its last update, in event time: a positive duration, such as "30d".`)
		}
		if a, ok := b.Attributes[EventTimeAttribute]; ok && t.EventTime != nil {
			if _, constant := t.EventTime.Constant(); constant {
				c.errorf(a.Expr.Range(), "Invalid event_time",
					"A table's event_time must read the message, such as msg.updated_at: a constant would give every version one time.")
			}
		}
		if t.Key != nil {
			if _, constant := t.Key.Constant(); constant {
				c.errorf(b.Attributes[TableKeyAttribute].Expr.Range(), "Invalid key",
					"A table's key must read the message, such as msg.customer_id: a constant would put every row under one key.")
			}
		}
		c.tables[t.Name] = t
	}
}

// addTableStages adds the stage of each table to the plan.
func (c *compiler) addTableStages() {
	for _, name := range sortedKeys(c.tables) {
		t := c.tables[name]
		if t.Input == nil {
			continue // reported
		}
		config := Attrs{declared: map[string]Type{}}
		for _, a := range tableStageAttributes {
			config.declared[a.Name] = a.Type
		}
		if t.Key != nil {
			config.set(TableKeyAttribute, t.Key)
		}
		if t.History > 0 {
			config.set(TableHistoryAttribute, t.History)
		}
		if t.TTL > 0 {
			config.set(TableTTLAttribute, t.TTL)
		}
		if t.Global {
			config.set(TableGlobalAttribute, true)
		}
		if t.EventTime != nil {
			config.set(EventTimeAttribute, t.EventTime)
		}
		config.set(IdleTimeoutAttribute, t.IdleTimeout)
		t.Stage = &Stage{
			Name: t.Name + tableSuffix, Kind: TableKind, Spec: tableKind, Input: t.Input,
			Retry: DefaultRetry, RetryInPlace: true, Ordering: OrderByPartition, Concurrency: 1,
			Timeout: 30 * time.Second, Delivery: c.plan.Delivery, Config: config, Range: t.Range,
		}
		c.plan.Stages = append(c.plan.Stages, t.Stage)
		c.plan.Tables = append(c.plan.Tables, t)
	}
}

// Versioned reports whether the table keeps its rows as versions in event time (it has a history or
// an event_time), rather than each key's last payload as it came.
func (t *Table) Versioned() bool { return t.History > 0 || t.EventTime != nil }

// resolveTable resolves a table attribute (TypeTableRef) to its table.
func (c *compiler) resolveTable(e hcl.Expression, attr string) *Table {
	ref, ok := c.parseReference(e, attr, "table")
	if !ok {
		return nil
	}
	t, ok := c.tables[ref.Name]
	if !ok {
		c.unresolved = true
		c.errorf(ref.Range, "Reference to undeclared table",
			fmt.Sprintf("There is no table named %q.%s", ref.Name, DidYouMean(ref.Name, sortedKeys(c.tables))))
		return nil
	}
	c.tableUsed[t.Name] = true
	return t
}

// Table returns the table with the given name, or nil.
func (p *Plan) Table(name string) *Table {
	i := sort.Search(len(p.Tables), func(i int) bool { return p.Tables[i].Name >= name })
	if i < len(p.Tables) && p.Tables[i].Name == name {
		return p.Tables[i]
	}
	return nil
}

// TableOf returns the table whose stage s is, or nil when s keeps no table.
func (p *Plan) TableOf(s *Stage) *Table {
	for _, t := range p.Tables {
		if t.Stage == s {
			return t
		}
	}
	return nil
}
