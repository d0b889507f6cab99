package runtime_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

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
