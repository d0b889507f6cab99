package runtime_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Every example pipeline runs end to end, on a real Redis, on a Redis Cluster and on the embedded
// default, and again on the real Redis with every stage in a hop of its own (no fusion), and its
// outputs are checked message by message.

const examples = "../examples/pipelines"

func TestExamplesRunEndToEnd(t *testing.T) {
	t.Parallel()
	runs := []struct {
		b    backend
		name string
		opts runtime.Options
	}{{server, "server", runtime.Options{}}, {cluster, "cluster", runtime.Options{}},
		{embeddedRedis, "embedded", runtime.Options{}}, {server, "server-unfused", runtime.Options{NoFusion: true}}}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			c, opts := r.b.open(t), r.opts
			t.Run("fanout", func(t *testing.T) { checkFanout(t, c, opts) })
			t.Run("etl", func(t *testing.T) { checkETL(t, c, opts) })
			t.Run("greetings", func(t *testing.T) { checkGreetings(t, c, opts) })
			t.Run("orders", func(t *testing.T) { checkOrders(t, c, opts) })
			t.Run("retries", func(t *testing.T) { checkRetries(t, c, opts) })
			t.Run("revenue", func(t *testing.T) { checkRevenue(t, c, opts) })
			t.Run("enrich", func(t *testing.T) { checkEnrich(t, c, opts) })
			t.Run("tiers", func(t *testing.T) { checkTiers(t, c, opts) })
			t.Run("fraud", func(t *testing.T) { checkFraud(t, c, opts) })
			t.Run("throttle", func(t *testing.T) { checkThrottle(t, c, opts) })
			t.Run("webhooks", func(t *testing.T) { checkWebhooks(t, c, opts) })
			t.Run("adclicks", func(t *testing.T) { checkAdClicks(t, c, opts) })
			t.Run("shop", func(t *testing.T) { checkShop(t, c, opts) })
		})
	}
}

// TestEveryExampleIsCovered fails when an example is added without an end-to-end check above.
func TestEveryExampleIsCovered(t *testing.T) {
	entries, err := os.ReadDir(examples)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{"fanout": true, "etl": true, "greetings.hcl.json": true, "orders": true, "retries": true, "revenue": true, "enrich": true, "tiers": true, "fraud": true, "throttle": true, "webhooks": true, "adclicks": true, "shop": true}
	for _, e := range entries {
		if flow.IsTestFile(e.Name()) { // the examples' own tests, which flowtest runs
			continue
		}
		if !covered[e.Name()] {
			t.Errorf("example %s has no end-to-end test in TestExamplesRunEndToEnd", e.Name())
		}
	}
}

// checkWebhooks runs the webhooks example as a service (its source never ends) and posts the shop's
// events to it: JSON lines, an array and single objects, and the first request twice with its
// idempotency key, which effectively-once delivery writes once. The paid orders arrive enriched.
func checkWebhooks(t *testing.T, c *redis.Client, opts runtime.Options) {
	out := filepath.Join(t.TempDir(), "paid.jsonl")
	addr := freeAddr(t)
	plan := build(t, filepath.Join(examples, "webhooks"), "address="+addr, "output="+out, "token=t0ken")
	svc := startService(t, c, plan, opts)
	url := "http://" + addr + "/orders"
	waitFor(t, "the source to listen", func() bool { return strings.Contains(svc.log.String(), "taking messages over HTTP") })

	const n = 60
	events := make([]string, n)
	var want []map[string]any
	currencies := []string{"EUR", "GBP", "USD"}
	vat := map[string]float64{"EUR": 0.2, "GBP": 0.2, "USD": 0}
	for i := range n {
		event := []string{"order.created", "order.paid", "order.shipped"}[i/20]
		order, currency := fmt.Sprintf("o%d", i%20), currencies[i%3]
		cents := 100*(i+1) + 25*(i%4) // quarters: exact in binary, so rounding agrees
		events[i] = fmt.Sprintf(`{"event":%q,"order_id":%q,"customer":" Cust%d ","amount":"%d.%02d","currency":%q}`,
			event, order, i%5, cents/100, cents%100, currency)
		if event == "order.paid" {
			want = append(want, map[string]any{"order_id": order, "customer": fmt.Sprintf("cust%d", i%5), "currency": currency,
				"amount_cents": float64(cents), "vat_cents": math.Floor(float64(cents)*vat[currency] + 0.5)})
		}
	}
	post := func(contentType, body, key string) {
		t.Helper()
		postAccepted(t, url, contentType, body, key, "t0ken")
	}
	lines := strings.Join(events[:30], "\n")
	post("application/x-ndjson", lines, "first-30")
	post("application/x-ndjson", lines, "first-30") // a client's retry: written once
	post("application/json", "["+strings.Join(events[30:50], ",")+"]", "array")
	for i, e := range events[50:] {
		post("application/json", e, fmt.Sprint("single-", i)) // a key each: a refused request is sent again
	}
	waitFor(t, "the paid orders", func() bool { return len(jsonLines(t, readFileIfAny(t, out))) >= len(want) })
	svc.stop()
	got := jsonLines(t, readFile(t, out))
	sameMessages(t, "paid orders", got, want)
}

// checkFanout runs the keyed fan-out: 200 generated events routed by type.
func checkFanout(t *testing.T, c *redis.Client, opts runtime.Options) {
	signups := filepath.Join(t.TempDir(), "signups.jsonl")
	plan := build(t, filepath.Join(examples, "fanout"), "signups_file="+signups)
	j := runJob(t, c, plan, opts)

	types := []string{"view", "view", "click", "view", "purchase", "click", "signup"}
	pages := []string{"/", "/pricing", "/docs", "/blog"}
	var wantPurchases, wantClicks, wantSignups []map[string]any
	for i := 0; i < 200; i++ {
		event := map[string]any{
			"user": fmt.Sprintf("user-%d", i%25), "seq": float64(i), "type": types[i%7],
			"page": pages[i%4], "price": float64((i%5 + 1) * 10),
		}
		switch event["type"] {
		case "purchase":
			price := event["price"].(float64)
			delete(event, "price")
			event["net"], event["gross"] = price, math.Floor(price*(1+0.19)*100+0.5)/100
			wantPurchases = append(wantPurchases, event)
		case "click":
			wantClicks = append(wantClicks, event)
		case "signup":
			wantSignups = append(wantSignups, event)
		}
	}
	var gotPurchases, gotClicks []map[string]any
	for _, m := range jsonLines(t, j.stdout) {
		if m["type"] == "purchase" {
			gotPurchases = append(gotPurchases, m)
		} else {
			gotClicks = append(gotClicks, m)
		}
	}
	sameMessages(t, "purchases", gotPurchases, wantPurchases)
	sameMessages(t, "clicks", gotClicks, wantClicks)
	sameMessages(t, "signups", jsonLines(t, readFile(t, signups)), wantSignups)
	keyOrderKept(t, "purchases", gotPurchases, "user", "seq")
	keyOrderKept(t, "clicks", gotClicks, "user", "seq")

	if n := j.node(t, "clicks"); n.In != 144 || n.Out != 57 || n.Filtered != 87 {
		t.Errorf("clicks stage: %+v", n)
	}
	if j.summary.DeadLettered() != 0 {
		t.Errorf("%d dead letters", j.summary.DeadLettered())
	}
}

// checkETL runs the file-to-file job and compares its output with the transformation done here.
func checkETL(t *testing.T, c *redis.Client, opts runtime.Options) {
	out := filepath.Join(t.TempDir(), "clean.jsonl")
	plan := build(t, filepath.Join(examples, "etl"), "output="+out)
	runJob(t, c, plan, opts)

	var want []map[string]any
	for _, order := range jsonLines(t, readFile(t, filepath.Join(examples, "etl", "data", "orders.jsonl"))) {
		items := order["items"].([]any)
		if order["status"] != "completed" || len(items) == 0 {
			continue
		}
		customer := order["customer"].(map[string]any)
		country := "unknown"
		if s, ok := customer["country"].(string); ok {
			country = s
		}
		total, skus := 0.0, []string{}
		for _, it := range items {
			item := it.(map[string]any)
			total += item["price"].(float64) * item["qty"].(float64)
			skus = append(skus, item["sku"].(string))
		}
		want = append(want, map[string]any{
			"order_id":    strconv.Itoa(int(order["id"].(float64))),
			"customer_id": customer["id"],
			"email":       strings.ToLower(strings.TrimSpace(customer["email"].(string))),
			"country":     strings.ToUpper(country),
			"items":       float64(len(items)),
			"total":       total,
			"skus":        strings.Join(skus, ","),
		})
	}
	got := jsonLines(t, readFile(t, out))
	sameMessages(t, "clean orders", got, want)
	keyOrderKept(t, "clean orders", got, "customer_id", "order_id")
}

// checkEnrich runs the enrich example as a job: each order once, with the last record of its
// customer in the customers file (the job loads the whole table before it looks anything up), or
// null for a customer the file does not hold.
func checkEnrich(t *testing.T, c *redis.Client, opts runtime.Options) {
	out := filepath.Join(t.TempDir(), "enriched.jsonl")
	plan := build(t, filepath.Join(examples, "enrich"), "output="+out)
	runJob(t, c, plan, opts)

	customers := map[string]any{}
	for _, cu := range jsonLines(t, readFile(t, filepath.Join(examples, "enrich", "data", "customers.jsonl"))) {
		customers[cu["customer_id"].(string)] = cu
	}
	var want []map[string]any
	for _, o := range jsonLines(t, readFile(t, filepath.Join(examples, "enrich", "data", "orders.jsonl"))) {
		o["customer"] = customers[o["customer_id"].(string)]
		want = append(want, o)
	}
	sameMessages(t, "enriched orders", jsonLines(t, readFile(t, out)), want)
}

// checkTiers runs the tiers example as a job: each order once, with the record of its customer
// that began last at or before the order's created_at (RFC 3339 UTC times with one layout, which
// compare as strings), or null when none had.
func checkTiers(t *testing.T, c *redis.Client, opts runtime.Options) {
	out := filepath.Join(t.TempDir(), "tiers.jsonl")
	plan := build(t, filepath.Join(examples, "tiers"), "output="+out)
	runJob(t, c, plan, opts)

	customers := jsonLines(t, readFile(t, filepath.Join(examples, "tiers", "data", "customers.jsonl")))
	var want []map[string]any
	for _, o := range jsonLines(t, readFile(t, filepath.Join(examples, "tiers", "data", "orders.jsonl"))) {
		var held map[string]any
		for _, cu := range customers {
			if cu["customer_id"] == o["customer_id"] && cu["updated_at"].(string) <= o["created_at"].(string) &&
				(held == nil || cu["updated_at"].(string) >= held["updated_at"].(string)) {
				held = cu
			}
		}
		o["customer"] = held
		if held == nil {
			o["customer"] = nil
		}
		want = append(want, o)
	}
	sameMessages(t, "orders with their customer's record then", jsonLines(t, readFile(t, out)), want)
}

// checkAdClicks runs the adclicks example as a job and compares its rows with a reference join of
// its data: a click or view is late when it is more than 30 seconds (grace) behind the latest one
// written before it to its partition (the topics are keyed by their ids); of the others, each view
// with each click on its ad from the view's time to 10 minutes after is a row, with the view's
// campaign, and each view with none is a row with the click null.
func checkAdClicks(t *testing.T, c *redis.Client, opts runtime.Options) {
	dir := t.TempDir()
	out, late := filepath.Join(dir, "clicked.jsonl"), filepath.Join(dir, "late.jsonl")
	plan := build(t, filepath.Join(examples, "adclicks"), "output="+out, "late_output="+late)
	runJob(t, c, plan, opts)

	data := func(name string) []map[string]any {
		return jsonLines(t, readFile(t, filepath.Join(examples, "adclicks", "data", name)))
	}
	campaigns := map[string]any{}
	for _, cp := range data("campaigns.jsonl") {
		campaigns[cp["campaign_id"].(string)] = cp["name"]
	}
	var wantLate []map[string]any
	onTime := func(events []map[string]any, id string, partitions int) []map[string]any {
		latest := make([]time.Time, partitions)
		var kept []map[string]any
		for _, e := range events {
			at, err := time.Parse(time.RFC3339, e["ts"].(string))
			if err != nil {
				t.Fatal(err)
			}
			p := redis.Partition(e[id].(string), partitions)
			if at.After(latest[p]) {
				latest[p] = at
			}
			if at.Add(30 * time.Second).Before(latest[p]) {
				wantLate = append(wantLate, e)
				continue
			}
			e["at"] = at
			kept = append(kept, e)
		}
		return kept
	}
	views, clicks := onTime(data("views.jsonl"), "view_id", 2), onTime(data("clicks.jsonl"), "click_id", 2)
	var want []map[string]any
	for _, v := range views {
		row := func(click any, clicked any) map[string]any {
			return map[string]any{"view_id": v["view_id"], "ad_id": v["ad_id"], "campaign": campaigns[v["campaign_id"].(string)],
				"viewed": v["ts"], "click_id": click, "clicked": clicked}
		}
		matched := false
		for _, k := range clicks {
			d := k["at"].(time.Time).Sub(v["at"].(time.Time))
			if k["ad_id"] == v["ad_id"] && d >= 0 && d <= 10*time.Minute {
				want = append(want, row(k["click_id"], k["ts"]))
				matched = true
			}
		}
		if !matched {
			want = append(want, row(nil, nil))
		}
	}
	for _, e := range wantLate {
		delete(e, "at")
	}
	sameMessages(t, "clicked views", jsonLines(t, readFile(t, out)), want)
	sameMessages(t, "late events", jsonLines(t, readFileIfAny(t, late)), wantLate)
	if len(wantLate) == 0 {
		t.Fatal("no late event in the sample: the check checks nothing of them")
	}
}

// checkFraud runs the fraud example as a job and compares its alerts with a reference computation
// from its data: a payment is late when it is more than 30 seconds (grace) behind the latest
// payment time written before it; the others, per card in time order, match from each probe (under
// 2) the first later probe and then the first later payment over 500, within 10 minutes.
func checkFraud(t *testing.T, c *redis.Client, opts runtime.Options) {
	dir := t.TempDir()
	out, late := filepath.Join(dir, "alerts.jsonl"), filepath.Join(dir, "late.jsonl")
	plan := build(t, filepath.Join(examples, "fraud"), "output="+out, "late_output="+late)
	runJob(t, c, plan, opts)

	type payment struct {
		m  map[string]any
		at time.Time
	}
	perCard := map[string][]payment{}
	var watermark time.Time
	var wantLate []map[string]any
	for _, p := range jsonLines(t, readFile(t, filepath.Join(examples, "fraud", "data", "payments.jsonl"))) {
		at, err := time.Parse(time.RFC3339, p["at"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if at.After(watermark) {
			watermark = at
		}
		if at.Add(30 * time.Second).Before(watermark) {
			wantLate = append(wantLate, p)
			continue
		}
		card := p["card"].(string)
		perCard[card] = append(perCard[card], payment{p, at})
	}
	amount := func(p payment) float64 { return p.m["amount"].(float64) }
	steps := []func(payment) bool{
		func(p payment) bool { return amount(p) < 2 },
		func(p payment) bool { return amount(p) < 2 },
		func(p payment) bool { return amount(p) > 500 },
	}
	var want []map[string]any
	for _, payments := range perCard {
		sort.SliceStable(payments, func(i, j int) bool { return payments[i].at.Before(payments[j].at) })
		for i, first := range payments {
			if !steps[0](first) {
				continue
			}
			taken := []payment{first}
			for _, p := range payments[i+1:] {
				if p.at.Sub(first.at) > 10*time.Minute || len(taken) == len(steps) {
					break
				}
				if steps[len(taken)](p) {
					taken = append(taken, p)
				}
			}
			if len(taken) < len(steps) {
				continue
			}
			big := taken[2].m
			want = append(want, map[string]any{
				"card": big["card"], "amount": big["amount"], "merchant": big["merchant"], "first_probe": first.m["at"],
				"payments": []any{first.m["payment_id"], taken[1].m["payment_id"], big["payment_id"]},
			})
		}
	}
	if len(want) == 0 || len(wantLate) == 0 {
		t.Fatal("the sample data should make alerts and late payments")
	}
	sameMessages(t, "alerts", jsonLines(t, readFile(t, out)), want)
	sameMessages(t, "late payments", jsonLines(t, readFile(t, late)), wantLate)
}

// checkRevenue runs the revenue example as a job and compares its output with a reference
// computation from its data: orders deduplicated by id, each late one (its minute closed, 10 seconds
// of grace past, at the latest event time so far) left out, the others summed per customer and minute.
func checkRevenue(t *testing.T, c *redis.Client, opts runtime.Options) {
	out := filepath.Join(t.TempDir(), "revenue.jsonl")
	plan := build(t, filepath.Join(examples, "revenue"), "output="+out)
	runJob(t, c, plan, opts)

	type minute struct{ customer, start string }
	type sums struct {
		orders        int
		revenue, high float64
		buyers        map[string]bool
		first         string
		firstAt       time.Time
	}
	windows := map[minute]*sums{}
	var order []minute
	seen := map[string]bool{}
	var watermark time.Time
	for _, o := range jsonLines(t, readFile(t, filepath.Join(examples, "revenue", "data", "orders.jsonl"))) {
		id := o["order_id"].(string)
		at, err := time.Parse(time.RFC3339, o["created_at"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if at.After(watermark) {
			watermark = at
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		start := at.Truncate(time.Minute)
		if !start.Add(time.Minute + 10*time.Second).After(watermark) {
			continue // late
		}
		m := minute{o["customer_id"].(string), start.UTC().Format(time.RFC3339)}
		w := windows[m]
		if w == nil {
			w = &sums{buyers: map[string]bool{}}
			windows[m] = w
			order = append(order, m)
		}
		amount := o["amount"].(float64)
		w.orders++
		w.revenue += amount
		w.high = math.Max(w.high, amount)
		w.buyers[o["user_id"].(string)] = true
		if w.first == "" || at.Before(w.firstAt) {
			w.first, w.firstAt = id, at
		}
	}
	var want []map[string]any
	for _, m := range order {
		w := windows[m]
		start, _ := time.Parse(time.RFC3339, m.start)
		want = append(want, map[string]any{
			"key": m.customer, "orders": float64(w.orders), "revenue": w.revenue, "buyers": float64(len(w.buyers)),
			"biggest": w.high, "first": w.first,
			"window": map[string]any{"start": m.start, "end": start.Add(time.Minute).UTC().Format(time.RFC3339)},
		})
	}
	sameMessages(t, "revenue per customer and minute", jsonLines(t, readFile(t, out)), want)
}

// checkGreetings runs the JSON-syntax example.
func checkGreetings(t *testing.T, c *redis.Client, opts runtime.Options) {
	plan := build(t, filepath.Join(examples, "greetings.hcl.json"))
	j := runJob(t, c, plan, opts)
	want := []map[string]any{
		{"name": "ada", "n": 0.0, "text": "Hello, ADA!"},
		{"name": "barbara", "n": 3.0, "text": "Hello, BARBARA!"},
		{"name": "edsger", "n": 6.0, "text": "Hello, EDSGER!"},
		{"name": "grace", "n": 9.0, "text": "Hello, GRACE!"},
	}
	sameMessages(t, "greetings", jsonLines(t, j.stdout), want)
}

// checkThrottle runs the rate-limited calls: 30 calls of 3 tenants at 10 a second each, bursts of
// 2. Every call arrives once, each tenant's in order, and some waited for their turn (a tenant's 10
// calls are more than its burst). The pace itself is tested on a virtual clock
// (TestRateLimitDelaysToTheRate, and the example's flowtest file).
func checkThrottle(t *testing.T, c *redis.Client, opts runtime.Options) {
	plan := build(t, filepath.Join(examples, "throttle"))
	j := runJob(t, c, plan, opts)
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range jsonLines(t, j.stdout) {
		id, tenant := m["id"].(string), m["tenant"].(string)
		n, err := strconv.Atoi(strings.TrimPrefix(id, "call-"))
		if err != nil || seen[id] || tenant != fmt.Sprintf("tenant-%d", n%3) {
			t.Fatalf("call %v: unexpected, or arrived twice", m)
		}
		if prev, ok := last[tenant]; ok && n < prev {
			t.Errorf("%s's call %d arrived after its call %d", tenant, n, prev)
		}
		seen[id], last[tenant] = true, n
	}
	if len(seen) != 30 {
		t.Errorf("%d calls arrived, want 30", len(seen))
	}
	if n := j.node(t, "throttle"); n.In != 30 || n.Out != 30 || n.Delayed <= 0 || n.FailedAttempts != 0 {
		t.Errorf("throttle: %+v, want 30 in and out, some delay, no failure", n)
	}
}

// orderEvents are order events as a shop would XADD them, with flat fields (no payload field).
var orderEvents = [][]string{
	{"type", "order.placed", "order_id", "1001", "customer", "alice", "amount", "42.50"},
	{"type", "order.placed", "order_id", "1002", "customer", "bob", "amount", "19.99"},
	{"type", "order.paid", "order_id", "1001", "customer", "alice", "amount", "42.50"},
	{"type", "order.placed", "order_id", "1003", "customer", "carol", "amount", "5"},
	{"type", "order.shipped", "order_id", "1001", "customer", "alice", "amount", "42.50"},
	{"type", "order.cancelled", "order_id", "1002", "customer", "bob", "amount", "19.99"},
	{"type", "order.paid", "order_id", "1003", "customer", "carol", "amount", "5"},
	{"type", "order.shipped", "order_id", "1003", "customer", "carol", "amount", "5"},
}

// checkOrders runs the Redis streaming guide's order flow on events written like redis-cli would.
func checkOrders(t *testing.T, c *redis.Client, opts runtime.Options) {
	ctx := context.Background()
	// Streams of this run's own, also with -count: the shared server keeps the last run's.
	run := itoa(prefixes.Add(1))
	stream := "demo:events:orders:" + t.Name() + ":" + run
	analytics := "demo:analytics:orders:" + t.Name() + ":" + run
	for _, e := range orderEvents {
		values := make([]any, len(e))
		for i, v := range e {
			values[i] = v
		}
		if err := c.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	plan := build(t, filepath.Join(examples, "orders"), "stream="+stream, "analytics_stream="+analytics)
	j := runJob(t, c, plan, opts)

	wording := map[string]string{"order.paid": "paid", "order.shipped": "on its way", "order.cancelled": "cancelled"}
	var wantNotes, wantRecords []map[string]any
	for _, e := range orderEvents {
		f := map[string]string{}
		for i := 0; i < len(e); i += 2 {
			f[e[i]] = e[i+1]
		}
		amount, _ := strconv.ParseFloat(f["amount"], 64)
		wantRecords = append(wantRecords, map[string]any{
			"order_id": f["order_id"], "customer": f["customer"], "event": f["type"],
			"amount_cents": float64(int(amount*100 + 0.5)), "cancelled": f["type"] == "order.cancelled",
		})
		if f["type"] == "order.placed" {
			continue
		}
		channel := "email"
		if f["type"] == "order.shipped" {
			channel = "sms"
		}
		wantNotes = append(wantNotes, map[string]any{
			"type": f["type"], "order_id": f["order_id"], "customer": f["customer"], "channel": channel,
			"to": f["customer"], "text": fmt.Sprintf("Your order %s is %s.", f["order_id"], wording[f["type"]]),
		})
	}
	notes := jsonLines(t, j.stdout)
	sameMessages(t, "notifications", notes, wantNotes)
	keyOrderMatches(t, "notifications", notes, wantNotes, "order_id")

	entries, err := c.Universal().XRange(ctx, analytics, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var records []map[string]any
	for _, e := range entries {
		records = append(records, jsonObject(t, e.Values["payload"].(string)))
	}
	sameMessages(t, "analytics records", records, wantRecords)
	keyOrderMatches(t, "analytics records", records, wantRecords, "order_id")
}

// checkRetries runs the retry and dead-letter showcase against a ledger that accepts every payment:
// the payments whose amount is not a number are dead-lettered by the validate stage, once.
func checkRetries(t *testing.T, c *redis.Client, opts runtime.Options) {
	var mu sync.Mutex
	var received []map[string]any
	ledger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer dev-token-not-secret" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		received = append(received, jsonObject(t, string(body)))
		mu.Unlock()
	}))
	defer ledger.Close()
	plan := build(t, filepath.Join(examples, "retries"), "ledger_url="+ledger.URL)
	j := runJob(t, c, plan, opts)

	var wantPaid []map[string]any
	var wantFailed []string
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("pay-%d", i)
		if i%7 == 3 {
			wantFailed = append(wantFailed, id)
			continue
		}
		wantPaid = append(wantPaid, map[string]any{"id": id, "account": fmt.Sprintf("acct-%d", i%5), "amount_cents": float64((i*10 + 5) * 100)})
	}
	sameMessages(t, "ledger requests", received, wantPaid)

	var failed []string
	for _, env := range jsonLines(t, j.stdout) {
		if env["node"] != "validate" || env["attempts"] != 1.0 || !strings.Contains(env["error"].(string), "n/a") {
			t.Errorf("dead letter %v", env)
		}
		failed = append(failed, env["payload"].(map[string]any)["id"].(string))
	}
	sort.Strings(failed)
	sort.Strings(wantFailed)
	if !reflect.DeepEqual(failed, wantFailed) {
		t.Errorf("dead letters for %v, want %v", failed, wantFailed)
	}
	if n := j.node(t, "validate"); n.DeadLettered != 3 || n.FailedAttempts != 3 || n.Retries != 0 {
		t.Errorf("validate stage: %+v", n)
	}
	if j.summary.DeadLettered() != 3 {
		t.Errorf("%d dead letters in all, want 3", j.summary.DeadLettered())
	}
}

// sameMessages compares two lists of messages as multisets.
func sameMessages(t *testing.T, what string, got, want []map[string]any) {
	t.Helper()
	canon := func(list []map[string]any) []string {
		out := make([]string, len(list))
		for i, m := range list {
			b, _ := json.Marshal(m)
			out[i] = string(b)
		}
		sort.Strings(out)
		return out
	}
	g, w := canon(got), canon(want)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s: got %d messages, want %d\ngot:  %s\nwant: %s", what, len(g), len(w),
			strings.Join(g, "\n      "), strings.Join(w, "\n      "))
	}
}

// keyOrderKept checks that the messages of each key appear in increasing order of the number in
// their field seq (a JSON number, or a string holding one). A message without it fails the check:
// an order cannot be checked on a field that is not there.
func keyOrderKept(t *testing.T, what string, msgs []map[string]any, key, seq string) {
	t.Helper()
	if seq == "" {
		t.Fatalf("%s: keyOrderKept needs a sequence field", what)
	}
	last := map[any]float64{}
	for _, m := range msgs {
		var n float64
		switch v := m[seq].(type) {
		case float64:
			n = v
		case string:
			var err error
			if n, err = strconv.ParseFloat(v, 64); err != nil {
				t.Errorf("%s: %s %q is not a number: %v", what, seq, v, m)
				continue
			}
		default:
			t.Errorf("%s: a message without a number in %s: %v", what, seq, m)
			continue
		}
		k, ok := m[key]
		if !ok {
			t.Errorf("%s: a message without its key %s: %v", what, key, m)
			continue
		}
		if prev, ok := last[k]; ok && n <= prev {
			t.Errorf("%s: key %v has %s %v after %v", what, k, seq, n, prev)
		}
		last[k] = n
	}
}

// keyOrderMatches checks, for messages without a sequence field, that the messages of each key
// come in the order of the expected list (which sameMessages checks as a multiset).
func keyOrderMatches(t *testing.T, what string, got, want []map[string]any, key string) {
	t.Helper()
	byKey := func(list []map[string]any) map[string][]string {
		out := map[string][]string{}
		for _, m := range list {
			b, _ := json.Marshal(m)
			k := fmt.Sprint(m[key])
			out[k] = append(out[k], string(b))
		}
		return out
	}
	g, w := byKey(got), byKey(want)
	for k, wantSeq := range w {
		if !reflect.DeepEqual(g[k], wantSeq) {
			t.Errorf("%s: the messages of key %s came in another order:\ngot:  %s\nwant: %s", what, k,
				strings.Join(g[k], "\n      "), strings.Join(wantSeq, "\n      "))
		}
	}
}

func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			out = append(out, jsonObject(t, sc.Text()))
		}
	}
	return out
}

func jsonObject(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("not a JSON object: %q: %v", s, err)
	}
	return m
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
