package runtime_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/internal/sqltest"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// checkShop runs the shop example (webhooks in, orders enriched, results to Postgres) as a service
// on a PostgreSQL database of its own, with the example's schema.sql. Once the table holds the
// customers file, the shop posts each order's events (created, paid, and every third one shipped)
// in requests of JSON lines, one of them twice with its Idempotency-Key. The orders table then holds
// exactly a row per order, with its last event's status and time and its customer's latest record
// (none for the customer that the file does not hold), and nothing is dead-lettered.
func checkShop(t *testing.T, c *redis.Client, opts runtime.Options) {
	db := sqltest.New(t, "postgres")
	db.Exec(t, readFile(t, filepath.Join(examples, "shop", "schema.sql")))
	addr := freeAddr(t)
	plan := build(t, filepath.Join(examples, "shop"), "dsn="+db.DSN(), "address="+addr, "token=t0ken")
	svc := startService(t, c, plan, opts)
	// The lookup sees a customer once the table has taken its record in: the orders wait for all
	// five lines of the file.
	waitFor(t, "the customers in the table", func() bool {
		return acked(t, c, plan.KeyPrefix, "customers", 2, "customers.table") == 5
	})

	customers := map[string][2]string{} // id -> name, tier: the file's last record of each
	for _, cu := range jsonLines(t, readFile(t, filepath.Join(examples, "shop", "data", "customers.jsonl"))) {
		customers[cu["customer_id"].(string)] = [2]string{cu["name"].(string), cu["tier"].(string)}
	}
	const orders = 30
	want := map[string]string{} // order_id -> its row, as rowsOf prints it
	var requests [][]string
	for _, event := range []string{"created", "paid", "shipped"} {
		var lines []string
		for i := range orders {
			if event == "shipped" && i%3 != 0 {
				continue
			}
			id, customer := fmt.Sprintf("o%02d", i), fmt.Sprintf("c%d", 1+i%5) // c5 is not in the file
			cents := 1000 + 125*i
			at := fmt.Sprintf("2024-05-01T%02d:%02d:00Z", 10+len(requests), i)
			lines = append(lines, fmt.Sprintf(`{"event":"order.%s","order_id":%q,"customer_id":%q,"amount":%d.%02d,"at":%q}`,
				event, id, customer, cents/100, cents%100, at))
			name, tier := "NULL", "NULL"
			if cu, ok := customers[customer]; ok {
				name, tier = cu[0], cu[1]
			}
			want[id] = fmt.Sprintf("%s|%s|%s|%s|%d.%02d|%s", event, customer, name, tier, cents/100, cents%100, at)
		}
		requests = append(requests, lines)
	}
	post := func(body, key string) {
		t.Helper()
		postAccepted(t, "http://"+addr+"/orders", "application/x-ndjson", body, key, "t0ken")
	}
	for i, lines := range requests {
		key := fmt.Sprintf("request-%d", i)
		post(strings.Join(lines, "\n"), key)
		if i == 1 {
			post(strings.Join(lines, "\n"), key) // a client's retry: written once
		}
	}

	rowsOf := func() map[string]string {
		rows, err := db.SQL.Query(`SELECT order_id, status, customer_id, coalesce(customer_name, 'NULL'), coalesce(tier, 'NULL'),
			amount::text, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') FROM orders`)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rows.Close() }()
		got := map[string]string{}
		for rows.Next() {
			var id string
			var v [6]string
			if err := rows.Scan(&id, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]); err != nil {
				t.Fatal(err)
			}
			got[id] = strings.Join(v[:], "|")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	events := 0
	for _, lines := range requests {
		events += len(lines)
	}
	waitFor(t, "the sink to write and acknowledge every event", func() bool {
		return acked(t, c, plan.KeyPrefix, "row.out", 4, "orders_db") == int64(events)
	})
	svc.stop()
	got := rowsOf()
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if got[id] != want[id] {
			t.Errorf("order %s: row %q, want %q", id, got[id], want[id])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d rows, want %d", len(got), len(want))
	}
	if list := sinkDeadLetters(t, c, plan, "orders_db"); len(list) > 0 {
		t.Errorf("%d dead letters, such as %q", len(list), list[0].Envelope.Error)
	}
}
