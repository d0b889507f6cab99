// Package nexmark generates the events of the Nexmark benchmark (an online auction: people join,
// open auctions and bid on them) from its published event model, deterministically by seed, as
// JSON objects that flowrun's pipelines under bench/nexmark read. It does not run queries: the
// queries are pipeline files, and their references live in the tests that check them.
//
// The model, as the Nexmark papers and their reference implementations describe it: events come in
// blocks of 50, 1 person, 3 auctions and 46 bids; event n happens at Start plus n times the delay
// between events; ids count up from 1000 (people) and 1000 (auctions); an auction's seller is
// mostly one of the latest people (a hot seller), otherwise any person so far; a bid's auction is
// mostly one of the latest auctions (a hot auction) and its bidder mostly one of the latest people.
package nexmark

import (
	"fmt"
	"math/rand/v2"
)

// Config says what to generate.
type Config struct {
	Seed   uint64
	Events int   // how many events in all
	Start  int64 // the first event's time, Unix ms
	// Delay is the time between two events, in ms (the rate is 1000/Delay events a second).
	Delay int64
}

// Events are the generated events, by kind, each in the order of its time.
type Events struct {
	Persons, Auctions, Bids []map[string]any
}

// The proportions of a block of events, and how hot the hot ones are.
const (
	personProportion  = 1
	auctionProportion = 3
	bidProportion     = 46
	proportions       = personProportion + auctionProportion + bidProportion
	firstPersonID     = 1000
	firstAuctionID    = 1000
	hotSellerRatio    = 4   // 3 auctions in 4 are by one of the latest people, the rest by anyone
	hotAuctionRatio   = 2   // 1 bid in 2 is on one of the latest auctions
	hotBidderRatio    = 4   // 3 bids in 4 are by one of the latest people
	activePeople      = 100 // "latest" people: this many before the newest
	activeAuctions    = 30  // "latest" auctions
	categories        = 5   // categories are 10, 11, ... 14
	expiresAfter      = 10_000
)

var (
	usStates  = []string{"AZ", "CA", "ID", "OR", "WA", "WY"}
	usCities  = []string{"Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"}
	firstName = []string{"Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"}
	lastName  = []string{"Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"}
	channels  = []string{"Google", "Facebook", "Baidu", "Apple"}
)

// Generate makes the events of a config.
func Generate(c Config) Events {
	r := rand.New(rand.NewPCG(c.Seed, 0x6e65786d61726b))
	var ev Events
	persons, auctions := int64(0), int64(0)
	for n := range c.Events {
		at := c.Start + int64(n)*c.Delay
		switch rest := n % proportions; {
		case rest < personProportion:
			id := firstPersonID + persons
			persons++
			ev.Persons = append(ev.Persons, map[string]any{
				"id":           id,
				"name":         firstName[r.IntN(len(firstName))] + " " + lastName[r.IntN(len(lastName))],
				"emailAddress": fmt.Sprintf("p%d@example.com", id),
				"creditCard":   fmt.Sprintf("%04d %04d %04d %04d", r.IntN(10000), r.IntN(10000), r.IntN(10000), r.IntN(10000)),
				"city":         usCities[r.IntN(len(usCities))],
				"state":        usStates[r.IntN(len(usStates))],
				"dateTime":     at,
			})
		case rest < personProportion+auctionProportion:
			id := firstAuctionID + auctions
			auctions++
			initial := int64(1 + r.IntN(1000))
			ev.Auctions = append(ev.Auctions, map[string]any{
				"id":          id,
				"itemName":    fmt.Sprintf("item %d", id),
				"description": "a thing to sell",
				"initialBid":  initial,
				"reserve":     initial + int64(r.IntN(1000)),
				"dateTime":    at,
				"expires":     at + expiresAfter,
				"seller":      pick(r, firstPersonID, persons, activePeople, hotSellerRatio),
				"category":    int64(10 + r.IntN(categories)),
			})
		default:
			if auctions == 0 || persons == 0 {
				continue // nothing to bid on, nobody to bid, yet
			}
			ev.Bids = append(ev.Bids, map[string]any{
				"auction":  pick(r, firstAuctionID, auctions, activeAuctions, hotAuctionRatio),
				"bidder":   pick(r, firstPersonID, persons, activePeople, hotBidderRatio),
				"price":    int64(100 + r.IntN(10_000)),
				"channel":  channels[r.IntN(len(channels))],
				"url":      fmt.Sprintf("https://example.com/item/%d", r.IntN(1_000_000)),
				"dateTime": at,
			})
		}
	}
	return ev
}

// pick draws one of the n ids from first: one of the latest `latest` but in 1 case in ratio, when
// it draws any of them.
func pick(r *rand.Rand, first, n, latest int64, ratio int) int64 {
	if n <= 0 {
		return first
	}
	if r.IntN(ratio) > 0 {
		return first + n - 1 - r.Int64N(min(n, latest))
	}
	return first + r.Int64N(n)
}
