package runtime_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/pgtest"
	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestPostgresCDCThroughKills runs the source in flowrun processes with effectively-once delivery,
// and SIGKILLs them again and again while a writer makes transactions of 1 to 50 changes: the first
// in the middle of the snapshot of 25,000 rows, the others once they stream, after random progress;
// in one cycle (every fourth with -soak) Redis is restarted under the running process. Then a last
// process runs until the writer's last change arrives: every change is in the topic once, in commit
// order per row (the snapshot, read again after the first kill, has at most one message per row),
// and the topic's final state per row is the table's. A table block fed by the topic, killed with
// the source, ends with each row's latest message: for the database's rows, their current values.
// With -soak, as issue 24 asks: the writer goes on until it has made 50,000 changes, and the
// process is killed every few hundred to 1,700 entries meanwhile.
func TestPostgresCDCThroughKills(t *testing.T) {
	t.Parallel()
	const initial = 20000
	cycles, changes, restartEvery := 5, 0, 3
	if *soakFlag {
		cycles, changes, restartEvery = 0, 50000, 4 // cycles until the writer has made its changes
	}
	pg := pgtest.Start(t)
	w := newCDCWriter(t, pg, initial)
	srv := redistest.Start(t, redistest.WithAOF()) // restarted with its data
	c := openURLs(t, srv.URL())
	prefix := fmt.Sprintf("cdckill-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "cdc.hcl")
	writeFile(t, path, cdcPipeline(prefix, pg.DSN("postgres"), "effectively_once")+`
table "mirror" {
  input = topic.changes
}
`)
	if _, _, diags := flow.Build(path, flow.Options{}); diags.HasErrors() {
		t.Fatal(diags)
	}
	keys := redis.Keys{Prefix: prefix}
	entries := func() int64 {
		var n int64
		for _, s := range keys.Streams("changes", 4) {
			l, err := c.Universal().XLen(context.Background(), s).Result()
			if err != nil {
				t.Fatal(err)
			}
			n += l
		}
		return n
	}
	position := func() string {
		raw, _, err := c.ReadCheckpoint(context.Background(), keys.SourcePosition("shop"))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	bin := flowrunBinary(t)
	args := []string{"run", path, "--redis", srv.URL(), "--lease-ttl", "300ms"}

	// The first process is killed in the middle of the snapshot; the writer starts once the slot
	// exists, so that every change it makes comes after the snapshot's consistent point.
	p := startBinary(t, bin, args...)
	waitFor(t, "the snapshot to begin", func() bool { return entries() >= 1000 })
	p.kill(t)
	midSnapshot := strings.Contains(position(), `"snapshot":"`)
	if !midSnapshot {
		t.Errorf("the first kill struck after the snapshot (position %s): make the snapshot larger", position())
	}
	logs := []string{p.log.String()}
	// The writer goes on until the cycles are done, or until it has made its changes.
	writerDone := make(chan error, 1)
	var writerStop, written atomic.Bool
	defer writerStop.Store(true)
	go func() {
		defer written.Store(true)
		for !writerStop.Load() && (changes == 0 || w.changes() < changes) {
			if err := w.tx(context.Background()); err != nil {
				writerDone <- err
				return
			}
			time.Sleep(5 * time.Millisecond) // a pace, so that the cycles see the writer at work
		}
		writerDone <- nil
	}()
	killed, restarts := 1, 0
	for cycle := 0; cycles == 0 && !written.Load() || cycle < cycles; cycle++ {
		before := entries()
		p := startBinary(t, bin, args...)
		progress := int64(200 + rand.IntN(1500))
		streaming := func() bool { return !strings.Contains(position(), `"snapshot":"`) }
		// The first of these reads the rest of the snapshot; each is killed once it streams.
		waitFor(t, fmt.Sprintf("cycle %d: %d entries more, streaming", cycle, progress), func() bool {
			// No entry in flight has been delivered more than twice: kills that come faster than
			// the table commits would make its entries poison messages (mostDelivered).
			return (entries()-before >= progress || written.Load()) && streaming() &&
				mostDelivered(t, c, "mirror.table", keys.Streams("changes", 4)...) <= 2
		})
		if cycle%restartEvery == restartEvery-1 {
			// Redis goes away under the running process and comes back with its data; the
			// process waits it out, and the kill strikes after it has written again.
			srv.Restart(t)
			restarts++
			before = entries()
			waitFor(t, fmt.Sprintf("cycle %d: entries after the restart", cycle), func() bool {
				return entries() > before || written.Load()
			})
		}
		p.kill(t)
		killed++
		logs = append(logs, p.log.String())
	}
	writerStop.Store(true)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	w.sentinel(t)
	last := startBinary(t, bin, args...)
	waitFor(t, "the writer's last change in the topic", func() bool { return sentinelArrived(t, c, prefix) })
	// Caught up: the table's group has been delivered each partition's last entry, and acknowledged
	// everything. (XINFO's lag is no measure here: Redis does not keep its count of entries read
	// exactly through a restart from the AOF.)
	waitFor(t, "the table to take in the whole topic", func() bool {
		for _, s := range keys.Streams("changes", 4) {
			last, err := c.Universal().XRevRangeN(context.Background(), s, "+", "-", 1).Result()
			if err != nil {
				t.Fatal(err)
			}
			groups, err := c.Universal().XInfoGroups(context.Background(), s).Result()
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(groups, func(g goredis.XInfoGroup) bool { return g.Name == "mirror.table" })
			if len(last) == 0 || i < 0 || groups[i].LastDeliveredID != last[0].ID || groups[i].Pending != 0 {
				return false
			}
		}
		return true
	})
	last.kill(t)
	logs = append(logs, last.log.String())
	snapshots, changed := checkCDCTopic(t, c, prefix, w, initial, false)
	rows := checkMirror(t, c, keys, w)
	if t.Failed() {
		for i, l := range logs {
			for _, line := range strings.Split(l, "\n") {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "postgres_cdc") {
					t.Logf("process %d: %s", i, line)
				}
			}
		}
	}
	if restarts == 0 {
		t.Error("no cycle restarted Redis")
	}
	t.Logf("%d SIGKILLs (the first mid-snapshot: %v), %d Redis restarts; %d snapshot messages for %d rows, %d changes, each once; "+
		"the table fed by the topic holds the %d rows of the database; %d leases lost",
		killed, midSnapshot, restarts, snapshots, initial+initial/4, changed, rows, leaseLosses(logs...))
}

// checkMirror compares table "mirror", fed by the changes, with the database's tables: each row
// of theirs has its latest message there, whose after-image has the row's version, and every other
// key's latest message is its delete (a delete is a message like the others, not a tombstone).
// It returns the number of rows.
func checkMirror(t *testing.T, c *redis.Client, keys redis.Keys, w *cdcWriter) int {
	t.Helper()
	mirror := map[string]cdcMessage{}
	for p := range 4 {
		fields, err := c.Universal().HGetAll(context.Background(), keys.State("changes", p, "mirror.table")).Result()
		if err != nil {
			t.Fatal(err)
		}
		for key, payload := range fields {
			if strings.HasPrefix(key, "\x00") { // the runtime's own fields, such as the watermark
				continue
			}
			var m cdcMessage
			d := json.NewDecoder(strings.NewReader(payload))
			d.UseNumber()
			if err := d.Decode(&m); err != nil {
				t.Fatalf("row %s: %v: %s", key, err, payload)
			}
			mirror[key] = m
		}
	}
	want := w.rows(t)
	bad := 0
	for key, v := range want {
		m, ok := mirror[key]
		if got := fmt.Sprint(m.After["v"]); (!ok || m.Op == "delete" || got != v) && bad < 20 {
			bad++
			t.Errorf("%s: the table has %s v=%s, the database v=%s", key, m.Op, got, v)
		}
	}
	for key, m := range mirror {
		if _, ok := want[key]; !ok && m.Op != "delete" && bad < 20 {
			bad++
			t.Errorf("%s: the table has %s v=%v, the database has no such row", key, m.Op, m.After["v"])
		}
	}
	return len(want)
}

// changes is how many changes the writer has committed.
func (w *cdcWriter) changes() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// rows reads the tables' rows: key -> version.
func (w *cdcWriter) rows(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, table := range cdcTables {
		rows, err := w.conn.Query(context.Background(), "SELECT id, v FROM "+table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, v int
			if err := rows.Scan(&id, &v); err != nil {
				t.Fatal(err)
			}
			out[cdcKey(table, id)] = strconv.Itoa(v)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
