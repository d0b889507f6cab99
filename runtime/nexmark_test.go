package runtime_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/nexmark"
	"github.com/flowrun/flowrun/runtime"
)

// The Nexmark queries that the tables and joins answer, as pipelines under bench/nexmark, on
// generated events, checked against references computed here: query 3 (a lookup of auctions
// against people) and query 8 (a windowed join of new people and their auctions).

// nexmarkInputs generates the events of a seed and writes the people and the auctions as JSON lines.
func nexmarkInputs(t *testing.T, seed uint64, events int) (nexmark.Events, []string) {
	t.Helper()
	ev := nexmark.Generate(nexmark.Config{Seed: seed, Events: events, Start: 1_767_225_600_000, Delay: 10})
	dir := t.TempDir()
	var vars []string
	for name, list := range map[string][]map[string]any{"persons": ev.Persons, "auctions": ev.Auctions} {
		path := filepath.Join(dir, name+".jsonl")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		enc := json.NewEncoder(f)
		for _, e := range list {
			if err := enc.Encode(e); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		vars = append(vars, name+"="+path)
	}
	return ev, vars
}

// TestNexmarkQuery3 runs query 3 on 20,000 events: each auction of category 10 whose seller lives
// in OR, ID or CA comes out once, with the seller's name, city and state.
func TestNexmarkQuery3(t *testing.T) {
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			ev, vars := nexmarkInputs(t, 3, 20_000)
			out := filepath.Join(t.TempDir(), "q3.jsonl")
			plan := build(t, "../bench/nexmark/q3.hcl", append(vars, "output="+out)...)
			runJob(t, c, plan, runtime.Options{})

			people := map[int64]map[string]any{}
			for _, p := range ev.Persons {
				people[p["id"].(int64)] = p
			}
			var want []map[string]any
			for _, a := range ev.Auctions {
				p := people[a["seller"].(int64)]
				if a["category"].(int64) != 10 || !slices.Contains([]string{"OR", "ID", "CA"}, p["state"].(string)) {
					continue
				}
				want = append(want, map[string]any{"id": float64(a["id"].(int64)), "seller": float64(a["seller"].(int64)),
					"dateTime": float64(a["dateTime"].(int64)), "name": p["name"], "city": p["city"], "state": p["state"]})
			}
			if len(want) < 20 {
				t.Fatalf("only %d auctions to suggest: the data tests too little", len(want))
			}
			sameMessages(t, "query 3", jsonLines(t, readFile(t, out)), want)
		})
	}
}

// TestNexmarkQuery8 runs query 8 on 20,000 events: each person with each auction they opened in
// the 10-second window in which they joined comes out once.
func TestNexmarkQuery8(t *testing.T) {
	t.Parallel()
	for _, b := range []backend{server, cluster} {
		t.Run(b.name, func(t *testing.T) {
			c := b.open(t)
			ev, vars := nexmarkInputs(t, 8, 20_000)
			out := filepath.Join(t.TempDir(), "q8.jsonl")
			plan := build(t, "../bench/nexmark/q8.hcl", append(vars, "output="+out)...)
			runJob(t, c, plan, runtime.Options{})

			window := func(ms int64) int64 { return int64(math.Floor(float64(ms)/10000)) * 10000 }
			joined := map[string]map[string]any{}
			for _, p := range ev.Persons {
				joined[fmt.Sprint(p["id"], "/", window(p["dateTime"].(int64)))] = p
			}
			var want []map[string]any
			for _, a := range ev.Auctions {
				w := window(a["dateTime"].(int64))
				if p, ok := joined[fmt.Sprint(a["seller"], "/", w)]; ok {
					want = append(want, map[string]any{"id": float64(p["id"].(int64)), "name": p["name"], "window": float64(w),
						"auction": float64(a["id"].(int64)), "reserve": float64(a["reserve"].(int64))})
				}
			}
			if len(want) < 20 {
				t.Fatalf("only %d new sellers: the data tests too little", len(want))
			}
			sameMessages(t, "query 8", jsonLines(t, readFile(t, out)), want)
		})
	}
}

// TestNexmarkBidQueries runs the queries over bids (0, 1, 2, 5, 7, 11 and 12) on 20,000 events as
// jobs (5,000 under the race detector, which makes them four times slower), each compared with its
// reference: every row once, with its values.
func TestNexmarkBidQueries(t *testing.T) {
	t.Parallel()
	events := 20_000
	if raceEnabled {
		events = 5_000
	}
	ev := nexmark.Generate(nexmark.Config{Seed: 12, Events: events, Start: 1_767_225_600_000, Delay: 10})
	bidsFile := filepath.Join(t.TempDir(), "bids.jsonl")
	var lines []byte
	for _, b := range ev.Bids {
		line, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(append(lines, line...), '\n')
	}
	writeFile(t, bidsFile, string(lines))
	bids := jsonLines(t, string(lines)) // as the pipeline reads them: numbers are float64
	at := func(b map[string]any) int64 { return int64(b["dateTime"].(float64)) }
	when := func(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }
	window := func(start, end int64) map[string]any { return map[string]any{"start": when(start), "end": when(end)} }
	floorTo := func(ms, size int64) int64 { return ms - ((ms%size)+size)%size }

	queries := map[string]func() []map[string]any{
		"q0": func() []map[string]any { return bids },
		"q1": func() []map[string]any {
			var out []map[string]any
			for _, b := range bids {
				c := maps.Clone(b)
				c["price"] = math.Round(b["price"].(float64)*0.908*1e6) / 1e6
				out = append(out, c)
			}
			return out
		},
		"q2": func() []map[string]any {
			var out []map[string]any
			for _, b := range bids {
				if int64(b["auction"].(float64))%123 == 0 {
					out = append(out, map[string]any{"auction": b["auction"], "price": b["price"]})
				}
			}
			return out
		},
		"q5": func() []map[string]any {
			counts := map[int64]map[string]int{} // window start -> auction -> bids
			for _, b := range bids {
				for s := floorTo(at(b), 2000); s > at(b)-10_000; s -= 2000 {
					if counts[s] == nil {
						counts[s] = map[string]int{}
					}
					counts[s][fmt.Sprint(b["auction"])]++
				}
			}
			var out []map[string]any
			for s, per := range counts {
				best, most := "", 0
				for auction, n := range per {
					if n > most || n == most && auction > best {
						best, most = auction, n
					}
				}
				out = append(out, map[string]any{"key": "all", "auction": best, "bids": float64(most), "window": window(s, s+2000)})
			}
			return out
		},
		"q7": func() []map[string]any {
			type top struct{ price, auction, bidder float64 }
			tops := map[int64]*top{}
			for _, b := range bids {
				s := floorTo(at(b), 10_000)
				p, a, who := b["price"].(float64), b["auction"].(float64), b["bidder"].(float64)
				tp := tops[s]
				if tp == nil {
					tp = &top{price: -1}
					tops[s] = tp
				}
				if p > tp.price {
					*tp = top{p, a, who}
				} else if p == tp.price {
					tp.auction, tp.bidder = max(tp.auction, a), max(tp.bidder, who)
				}
			}
			var out []map[string]any
			for s, tp := range tops {
				out = append(out, map[string]any{"key": "all", "price": tp.price, "auction": tp.auction, "bidder": tp.bidder, "window": window(s, s+10_000)})
			}
			return out
		},
		"q11": func() []map[string]any {
			times := map[string][]int64{}
			for _, b := range bids {
				who := fmt.Sprint(b["bidder"])
				times[who] = append(times[who], at(b))
			}
			var out []map[string]any
			for who, ts := range times {
				slices.Sort(ts)
				first, n := ts[0], 0
				for i, t := range ts {
					if i > 0 && t-ts[i-1] >= 10_000 {
						out = append(out, map[string]any{"key": who, "bids": float64(n), "window": window(first, ts[i-1]+10_000)})
						first, n = t, 0
					}
					n++
				}
				out = append(out, map[string]any{"key": who, "bids": float64(n), "window": window(first, ts[len(ts)-1]+10_000)})
			}
			return out
		},
		"q12": func() []map[string]any {
			counts := map[string]map[int64]int{}
			for _, b := range bids {
				who := fmt.Sprint(b["bidder"])
				if counts[who] == nil {
					counts[who] = map[int64]int{}
				}
				counts[who][floorTo(at(b), 10_000)]++
			}
			var out []map[string]any
			for who, per := range counts {
				for s, n := range per {
					out = append(out, map[string]any{"key": who, "bids": float64(n), "window": window(s, s+10_000)})
				}
			}
			return out
		},
	}
	c := server.open(t)
	for _, q := range []string{"q0", "q1", "q2", "q5", "q7", "q11", "q12"} {
		t.Run(q, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), q+".jsonl")
			plan := build(t, "../bench/nexmark/"+q+".hcl", "bids="+bidsFile, "output="+out)
			runJob(t, c, plan, runtime.Options{})
			got := jsonLines(t, readFile(t, out))
			if q == "q1" {
				for _, m := range got {
					m["price"] = math.Round(m["price"].(float64)*1e6) / 1e6
				}
			}
			want := queries[q]()
			if len(want) < 4 { // q7 has a row per 10 seconds of events: 5 under the race detector
				t.Fatalf("%d rows: the data tests too little", len(want))
			}
			sameMessages(t, "query "+q, got, want)
		})
	}
}
