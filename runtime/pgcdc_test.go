package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/flowrun/flowrun/internal/pgtest"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// The postgres_cdc source's proofs run on a private PostgreSQL with wal_level = logical
// (internal/pgtest): a writer makes inserts, updates and deletes in transactions of 1 to 50 changes
// while the pipeline runs, is SIGKILLed (also in the middle of its snapshot) or loses Redis, and the
// topic holds every change once, in commit order per row, and its final state per key is the
// table's.

// cdcPipeline captures orders (REPLICA IDENTITY FULL: before-images) and customers (the default:
// deletes carry the key only) into topic "changes".
func cdcPipeline(prefix, dsn, delivery string) string {
	return fmt.Sprintf(`
pipeline "cdc" {
  key_prefix = %q
  delivery   = %q
}
topic "changes" {
  partitions = 4
}
source "shop" {
  kind            = "postgres_cdc"
  dsn             = %q
  tables          = ["public.orders", "customers"]
  slot            = "flowrun_test"
  status_interval = "200ms"
  output          = topic.changes
}
`, prefix, delivery, dsn)
}

// cdcWriter makes changes to the tables and remembers, per row, what it did: "op:v", where v is the
// row's version column, unique to each change (a delete of a customer, whose before-image is its key
// only, is "delete").
type cdcWriter struct {
	conn  *pgx.Conn
	rng   *rand.Rand
	v     int
	ids   map[string][]int // table -> ids of its rows
	maxID map[string]int
	mu    sync.Mutex
	log   map[string][]string // key -> its changes, in commit order
	n     int                 // changes committed
}

var cdcTables = []string{"public.orders", "public.customers"}

func cdcKey(table string, id int) string { return table + ":[" + strconv.Itoa(id) + "]" }

// newCDCWriter creates the tables with rows rows in orders and rows/4 in customers.
func newCDCWriter(t *testing.T, pg *pgtest.Server, rows int) *cdcWriter {
	t.Helper()
	pg.Exec(t, "postgres",
		`CREATE TABLE orders (id int PRIMARY KEY, customer int, amount numeric(12,2), note text, doc jsonb, at timestamptz, v int NOT NULL)`,
		`ALTER TABLE orders REPLICA IDENTITY FULL`,
		`CREATE TABLE customers (id int PRIMARY KEY, name text, v int NOT NULL)`,
		fmt.Sprintf(`INSERT INTO orders SELECT i, i %% 7, i * 1.25, 'note ' || i, jsonb_build_object('i', i), timestamptz '2024-01-01 00:00:00Z' + i * interval '1 second', 0
			FROM generate_series(1, %d) i`, rows),
		fmt.Sprintf(`INSERT INTO customers SELECT i, 'c' || i, 0 FROM generate_series(1, %d) i`, rows/4))
	w := &cdcWriter{conn: pg.Connect(t, "postgres"), rng: rand.New(rand.NewPCG(1, 2)), ids: map[string][]int{}, maxID: map[string]int{}, log: map[string][]string{}}
	for i := 1; i <= rows; i++ {
		w.ids["public.orders"] = append(w.ids["public.orders"], i)
		if i <= rows/4 {
			w.ids["public.customers"] = append(w.ids["public.customers"], i)
		}
	}
	w.maxID["public.orders"], w.maxID["public.customers"] = rows, rows/4
	return w
}

// tx commits a transaction of 1 to 50 random changes.
func (w *cdcWriter) tx(ctx context.Context) error {
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	type change struct{ key, token string }
	var done []change
	for range 1 + w.rng.IntN(50) {
		table := cdcTables[w.rng.IntN(2)]
		ids := w.ids[table]
		w.v++
		v := w.v
		op := w.rng.IntN(10)
		switch {
		case op < 4 || len(ids) < 10: // insert
			w.maxID[table]++
			id := w.maxID[table]
			if table == "public.orders" {
				_, err = tx.Exec(ctx, `INSERT INTO orders VALUES ($1::int, $1::int % 7, $2::int * 1.25, 'n', jsonb_build_object('v', $2::int), now(), $2::int)`, id, v)
			} else {
				_, err = tx.Exec(ctx, `INSERT INTO customers VALUES ($1, 'c', $2)`, id, v)
			}
			w.ids[table] = append(ids, id)
			done = append(done, change{cdcKey(table, id), "insert:" + strconv.Itoa(v)})
		case op < 8: // update
			id := ids[w.rng.IntN(len(ids))]
			if table == "public.orders" {
				_, err = tx.Exec(ctx, `UPDATE orders SET v = $2::int, amount = $2::int * 1.25, doc = jsonb_build_object('v', $2::int) WHERE id = $1::int`, id, v)
			} else {
				_, err = tx.Exec(ctx, `UPDATE customers SET v = $2 WHERE id = $1`, id, v)
			}
			done = append(done, change{cdcKey(table, id), "update:" + strconv.Itoa(v)})
		default: // delete
			i := w.rng.IntN(len(ids))
			id := ids[i]
			var old int
			err = tx.QueryRow(ctx, `DELETE FROM `+table+` WHERE id = $1 RETURNING v`, id).Scan(&old)
			w.ids[table] = slices.Delete(ids, i, i+1)
			token := "delete"
			if table == "public.orders" {
				token += ":" + strconv.Itoa(old)
			}
			done = append(done, change{cdcKey(table, id), token})
		}
		if err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range done {
		w.log[c.key] = append(w.log[c.key], c.token)
	}
	w.n += len(done)
	return nil
}

// sentinel commits the writer's last change, a customer of id -1, which tells that everything
// before it arrived.
func (w *cdcWriter) sentinel(t *testing.T) {
	t.Helper()
	w.v++
	if _, err := w.conn.Exec(context.Background(), `INSERT INTO customers VALUES (-1, 'end', $1)`, w.v); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log[cdcKey("public.customers", -1)] = []string{"insert:" + strconv.Itoa(w.v)}
	w.n++
}

// cdcMessage is a message of the topic, as the test reads it.
type cdcMessage struct {
	Op          string         `json:"op"`
	Table       string         `json:"table"`
	Key         map[string]any `json:"key"`
	Before      map[string]any `json:"before"`
	After       map[string]any `json:"after"`
	LSN         string         `json:"lsn"`
	CommittedAt *string        `json:"committed_at"`
}

// token is what the writer remembers of the change.
func (m cdcMessage) token() string {
	row := m.After
	if m.Op == "delete" {
		row = m.Before
	}
	if v, ok := row["v"]; ok {
		return m.Op + ":" + string(v.(json.Number))
	}
	return m.Op
}

// cdcTopic reads the topic's messages by key, in their order.
func cdcTopic(t *testing.T, c *redis.Client, prefix string) map[string][]cdcMessage {
	t.Helper()
	out := map[string][]cdcMessage{}
	for _, stream := range (redis.Keys{Prefix: prefix}).Streams("changes", 4) {
		after := "0"
		for {
			recs, err := c.Read(context.Background(), stream, after, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				break
			}
			for _, r := range recs {
				after = r.ID
				var m cdcMessage
				d := json.NewDecoder(strings.NewReader(string(r.Payload)))
				d.UseNumber()
				if err := d.Decode(&m); err != nil {
					t.Fatalf("entry %s: %v: %s", r.ID, err, r.Payload)
				}
				if id := m.Key["id"]; id == nil || m.Table == "" || r.Key != m.Table+":["+string(id.(json.Number))+"]" {
					t.Fatalf("entry %s has key %q: %s", r.ID, r.Key, r.Payload)
				}
				out[r.Key] = append(out[r.Key], m)
			}
		}
	}
	return out
}

// sentinelArrived reports whether the writer's sentinel is in the topic: the last entry of its
// partition, as nothing is written after it.
func sentinelArrived(t *testing.T, c *redis.Client, prefix string) bool {
	t.Helper()
	key := cdcKey("public.customers", -1)
	stream := (redis.Keys{Prefix: prefix}).Stream("changes", redis.Partition(key, 4))
	last, err := c.Universal().XRevRangeN(context.Background(), stream, "+", "-", 1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(last) != 1 || last[0].Values[redis.FieldKey] != key {
		return false
	}
	payload, _ := last[0].Values[redis.FieldPayload].(string)
	return strings.Contains(payload, `"op":"insert"`) // not its row in a snapshot
}

// checkCDCTopic checks the topic against the writer and the tables: for each row, at most one
// snapshot message (exactly one, first, with exactSnapshot, for the rows that were there), then its
// changes, each once, in commit order; and the state the messages build equals the tables'.
func checkCDCTopic(t *testing.T, c *redis.Client, prefix string, w *cdcWriter, initial int, exactSnapshot bool) (snapshots, changes int) {
	t.Helper()
	topic := cdcTopic(t, c, prefix)
	state := map[string]string{} // key -> v, from the messages
	bad := 0
	for key, msgs := range topic {
		var got []string
		for i, m := range msgs {
			if m.Op == "snapshot" {
				snapshots++
				if i > 0 {
					t.Errorf("%s: a snapshot message after its changes: %v", key, msgs)
				}
			} else {
				got = append(got, m.token())
				changes++
			}
			if m.Op == "delete" {
				delete(state, key)
			} else {
				state[key] = string(m.After["v"].(json.Number))
			}
		}
		if want := w.log[key]; !slices.Equal(got, want) && bad < 10 {
			bad++
			t.Errorf("%s: changes %v, want %v", key, got, want)
		}
	}
	for key, want := range w.log {
		if _, ok := topic[key]; !ok && bad < 10 {
			bad++
			t.Errorf("%s: no message, want %v", key, want)
		}
	}
	if changes != w.n {
		t.Errorf("%d change messages, want the writer's %d", changes, w.n)
	}
	if exactSnapshot && snapshots != initial+initial/4 {
		t.Errorf("%d snapshot messages, want %d", snapshots, initial+initial/4)
	}
	want := w.rows(t) // the tables, as the messages should have built them
	for key, v := range want {
		if state[key] != v && bad < 20 {
			bad++
			t.Errorf("%s: the topic says v=%q, the table v=%s", key, state[key], v)
		}
	}
	for key := range state {
		if _, ok := want[key]; !ok && bad < 20 {
			bad++
			t.Errorf("%s: in the topic's final state, not in the table", key)
		}
	}
	if len(state) != len(want) {
		t.Errorf("the topic's final state has %d rows, the tables %d", len(state), len(want))
	}
	return snapshots, changes
}

// TestPostgresCDCSnapshotThenChanges runs the source in this process: it reads the tables'
// rows, then a writer makes 300 transactions of 1 to 50 changes; the topic holds each row's
// snapshot and then each change once, in commit order per row, with its values decoded.
func TestPostgresCDCSnapshotThenChanges(t *testing.T) {
	t.Parallel()
	const initial, txs = 200, 300
	pg := pgtest.Start(t)
	w := newCDCWriter(t, pg, initial)
	c := server.open(t)
	plan := buildSource(t, cdcPipeline("ignored", pg.DSN("postgres"), "at_least_once"))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
		ended <- err
	}()
	waitFor(t, "the snapshot", func() bool { return strings.Contains(log.String(), "snapshot read") })
	for range txs {
		if err := w.tx(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w.sentinel(t)
	waitFor(t, "every change in the topic", func() bool {
		select {
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		default:
		}
		return sentinelArrived(t, c, plan.KeyPrefix)
	})
	snapshots, changes := checkCDCTopic(t, c, plan.KeyPrefix, w, initial, true)

	// The values, decoded by their types: order 7 as the snapshot read it.
	m := cdcTopic(t, c, plan.KeyPrefix)[cdcKey("public.orders", 7)][0]
	if got, _ := json.Marshal(m.After); m.Op != "snapshot" || m.CommittedAt != nil || string(got) !=
		`{"amount":8.75,"at":"2024-01-01T00:00:07Z","customer":0,"doc":{"i":7},"id":7,"note":"note 7","v":0}` {
		t.Errorf("order 7's snapshot: %s %s", m.Op, got)
	}
	// A change carries its transaction's commit LSN and time.
	for _, msgs := range cdcTopic(t, c, plan.KeyPrefix) {
		for _, m := range msgs {
			if m.Op != "snapshot" {
				if _, err := time.Parse(time.RFC3339Nano, *m.CommittedAt); err != nil || !strings.Contains(m.LSN, "/") {
					t.Fatalf("a change with lsn %q, committed_at %q", m.LSN, *m.CommittedAt)
				}
			}
		}
	}
	// The slot's confirmed position moved on with what Redis has.
	var confirmed string
	waitFor(t, "the slot to confirm the last transaction", func() bool {
		raw, _, err := c.ReadCheckpoint(ctx, (redis.Keys{Prefix: plan.KeyPrefix}).SourcePosition("shop"))
		if err != nil {
			t.Fatal(err)
		}
		var pos struct{ LSN string }
		_ = json.Unmarshal([]byte(raw), &pos)
		if err := w.conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'flowrun_test'").Scan(&confirmed); err != nil {
			t.Fatal(err)
		}
		recorded, err1 := pglogrepl.ParseLSN(pos.LSN)
		slot, err2 := pglogrepl.ParseLSN(confirmed)
		return err1 == nil && err2 == nil && slot >= recorded
	})
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Logf("%d snapshot messages, %d changes in %d transactions; the slot confirmed %s", snapshots, changes, txs+1, confirmed)
}

// TestPostgresCDCWaitsOutRedis stops Redis while a writer makes changes: the slot confirms nothing
// more while Redis is away, though the database goes on, and once Redis is back every change
// arrives, once, in commit order per row.
func TestPostgresCDCWaitsOutRedis(t *testing.T) {
	t.Parallel()
	const initial, txs = 100, 200
	pg := pgtest.Start(t)
	w := newCDCWriter(t, pg, initial)
	srv := redistest.Start(t, redistest.WithAOF())
	c := openURLs(t, srv.URL())
	plan := buildSource(t, cdcPipeline("ignored", pg.DSN("postgres"), "effectively_once"))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log syncBuffer
	ended := make(chan error, 1)
	go func() {
		_, err := runtime.Run(ctx, plan, runtime.Options{Redis: c, Logger: newLogger(&log)})
		ended <- err
	}()
	waitFor(t, "the snapshot", func() bool { return strings.Contains(log.String(), "snapshot read") })
	for range txs / 2 {
		if err := w.tx(ctx); err != nil {
			t.Fatal(err)
		}
	}
	confirmed := func() string {
		var lsn string
		if err := w.conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'flowrun_test'").Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	srv.Stop()
	time.Sleep(time.Second) // five status intervals: what Redis had is confirmed by now
	atStop := confirmed()
	for range txs / 2 {
		if err := w.tx(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	if during := confirmed(); during != atStop {
		t.Errorf("the slot confirmed %s while Redis was away, %s when it went", during, atStop)
	}
	srv.Start(t)
	w.sentinel(t)
	waitFor(t, "every change in the topic", func() bool {
		select {
		case err := <-ended:
			t.Fatalf("the run ended: %v\n%s", err, log.String())
		default:
		}
		return sentinelArrived(t, c, plan.KeyPrefix)
	})
	checkCDCTopic(t, c, plan.KeyPrefix, w, initial, true)
	stop()
	if err := <-ended; err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "Redis is failing") {
		t.Errorf("the runtime did not notice the outage:\n%s", log.String())
	}
	t.Logf("%d changes; the slot stayed at %s while Redis was away", w.n, atStop)
}
