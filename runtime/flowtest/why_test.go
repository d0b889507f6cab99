package flowtest

import (
	"reflect"
	"testing"

	"github.com/flowrun/flowrun/flow/testfile"
)

func sent(payload string) Arrived { return Arrived{Payload: []byte(payload), Where: "topic.orders"} }

func TestExplain(t *testing.T) {
	scored := `{"amount":10,"id":3,"score":0.9}`
	tests := []struct {
		name   string
		expect *testfile.Expect
		actual []Arrived
		facts  Facts
		want   []string
	}{
		{
			name:   "dead-lettered: the dead letter is the sent message",
			expect: expect("", msg(`{"id":1,"amount":5,"score":0.1}`), msg(scored)),
			actual: []Arrived{arr("a", `{"id":1,"amount":5,"score":0.1}`)},
			facts: Facts{
				Sent: []Arrived{sent(`{"id":1,"amount":5}`), sent(`{"id":3,"amount":10}`)},
				DeadLetters: []DeadLetter{{Node: "stage.score", Payload: []byte(`{"amount":10,"id":3}`),
					Reason: "scoring service timeout", Attempts: 3}},
				Nodes: []NodeFacts{
					{Name: "stage.score", Kind: "map", In: 2, Out: 1, DeadLettered: 1, Retries: 2},
					{Name: "sink.out", In: 1},
				},
			},
			want: []string{
				scored + `: the message sent as {"amount":10,"id":3} was dead-lettered by stage.score after 3 attempts: scoring service timeout`,
				"stage.score retried 2 times",
			},
		},
		{
			name:   "a dead letter that shares too little is not named",
			expect: expect("", msg(`{"id":3,"amount":10,"currency":"EUR","note":"x"}`)),
			facts: Facts{
				Sent:        []Arrived{sent(`{"id":4,"amount":11,"currency":"EUR","note":"y"}`)},
				DeadLetters: []DeadLetter{{Node: "stage.score", Payload: []byte(`{"id":9,"currency":"EUR"}`), Reason: "boom", Attempts: 1}},
				Nodes:       []NodeFacts{{Name: "stage.score", In: 1, DeadLettered: 1}},
			},
			want: []string{"stage.score dead-lettered 1 of 1 message"},
		},
		{
			name:   "the dead letter is the expected message",
			expect: expect("", msg(`{"id":3}`)),
			facts: Facts{
				Sent:        []Arrived{sent(`{"id":3,"raw":true}`)},
				DeadLetters: []DeadLetter{{Node: "sink.out", Payload: []byte(`{"id":3}`), Reason: "HTTP 400", Attempts: 1}},
			},
			want: []string{`{"id":3}: dead-lettered by sink.out after 1 attempt: HTTP 400`},
		},
		{
			name:   "similar dead letter",
			expect: expect("", msg(`{"id":3,"amount":10,"score":0.9}`)),
			facts: Facts{
				Sent:        []Arrived{sent(`{"id":3,"amount":10,"score":0.9}`)},
				DeadLetters: []DeadLetter{{Node: "sink.out", Payload: []byte(`{"id":3,"amount":10,"score":0.5}`), Reason: "HTTP 503", Attempts: 1}},
			},
			want: []string{scored + ": a similar message was dead-lettered by sink.out after 1 attempt: HTTP 503"},
		},
		{
			name:   "arrived at another sink",
			expect: expect("", msg(`{"id":3}`)),
			facts: Facts{
				Sent:     []Arrived{sent(`{"id":3}`)},
				Arrivals: map[string][]Arrived{"sink.out": nil, "sink.other": {{Payload: []byte(`{"id":3}`), Where: "sink.other"}}},
				Nodes:    []NodeFacts{{Name: "stage.route", Kind: "route", In: 1, Out: 1}},
			},
			want: []string{
				`{"id":3}: arrived at sink.other instead`,
				"no node dropped, filtered or dead-lettered a message during the run",
			},
		},
		{
			name:   "reached a topic, and a similar one at a sink",
			expect: expect("", msg(`{"id":3,"a":1,"b":2}`), msg(`{"id":4,"a":1,"b":2}`)),
			facts: Facts{
				Arrivals: map[string][]Arrived{
					"topic.mid":  {{Payload: []byte(`{"b":2,"a":1,"id":3}`)}},
					"sink.other": {{Payload: []byte(`{"id":4,"a":1,"b":3}`)}},
				},
			},
			want: []string{
				"the run sent no messages",
				`{"a":1,"b":2,"id":3}: an equal message reached topic.mid`,
				`{"a":1,"b":2,"id":4}: a similar message arrived at sink.other (differs in: b)`,
			},
		},
		{
			name:   "filtered by a where",
			expect: expect("", msg(`{"id":3}`)),
			facts: Facts{
				Sent: []Arrived{sent(`{"id":3}`)},
				Nodes: []NodeFacts{
					{Name: "stage.only_big", Kind: "filter", In: 5, Out: 3, Filtered: 2, Condition: "pipeline.hcl:12"},
				},
			},
			want: []string{"stage.only_big filtered 2 of 5 messages (the where at pipeline.hcl:12)"},
		},
		{
			name:   "dropped by a stage",
			expect: &testfile.Expect{Sink: "out", Count: 5, HasCount: true},
			actual: []Arrived{arr("", "1")},
			facts: Facts{
				Sent:  []Arrived{sent("1")},
				Nodes: []NodeFacts{{Name: "stage.x", Kind: "dedupe", In: 5, Out: 1, Dropped: 4}},
			},
			want: []string{"stage.x dropped 4 of 5 messages (late or repeated)"},
		},
		{
			name:   "held in windows, or waiting for a retry",
			expect: &testfile.Expect{Sink: "out", Count: 5, HasCount: true},
			actual: []Arrived{arr("", "1")},
			facts: Facts{
				Sent: []Arrived{sent("1")},
				Nodes: []NodeFacts{
					{Name: "stage.w", Kind: "aggregate", In: 5, Absorbed: 5},
					{Name: "sink.out", Kind: "http", In: 2, Out: 1, InFlight: 1, Retries: 1},
				},
			},
			want: []string{"stage.w took 5 of 5 messages into its windows; its results come when they close",
				"sink.out has 1 message waiting for a retry", "sink.out retried 1 time"},
		},
		{
			name:   "nothing happened",
			expect: expect("", msg(`{"id":3}`)),
			facts:  Facts{Sent: []Arrived{sent(`{"id":1}`)}, Nodes: []NodeFacts{{Name: "stage.m", In: 1, Out: 1}}},
			want:   []string{"no node dropped, filtered or dead-lettered a message during the run"},
		},
		{
			name:   "without node facts nothing is claimed",
			expect: expect("", msg(`{"id":3}`)),
			facts:  Facts{Sent: []Arrived{sent(`{"id":1}`)}},
			want:   nil,
		},
		{
			name:   "an order failure mentions retries only",
			expect: expect("", msg("1"), msg("2")),
			actual: []Arrived{arr("a", "2"), arr("a", "1")},
			facts: Facts{Nodes: []NodeFacts{
				{Name: "stage.a", In: 2, Out: 2, Retries: 1},
				{Name: "stage.b", In: 2, Out: 1, Filtered: 1},
			}},
			want: []string{"stage.a retried 1 time"},
		},
		{
			name:   "unexpected arrivals: retries only, nothing to trace",
			expect: expect(testfile.MatchUnordered, msg("1")),
			actual: []Arrived{arr("a", "1"), arr("a", "1")},
			facts: Facts{Nodes: []NodeFacts{
				{Name: "stage.b", In: 2, Out: 1, Filtered: 1},
				{Name: "sink.out", In: 2, Retries: 1},
			}},
			want: []string{"sink.out retried 1 time"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := CompareMessages(tt.expect, tt.actual)
			if f == nil {
				t.Fatal("the expectation held")
			}
			Explain(f, tt.expect, tt.actual, tt.facts)
			if !reflect.DeepEqual(f.Why, tt.want) {
				t.Errorf("why\n got %q\nwant %q", f.Why, tt.want)
			}
		})
	}
}

func TestExplainKeepsExistingLines(t *testing.T) {
	f := &Failure{Why: []string{"already"}}
	e := expect("", msg("1"))
	Explain(f, e, nil, Facts{Nodes: []NodeFacts{{Name: "stage.m", In: 1, Out: 1}}})
	Explain(f, e, nil, Facts{Nodes: []NodeFacts{{Name: "stage.m", In: 1, Out: 1}}})
	want := []string{"already", "the run sent no messages", "no node dropped, filtered or dead-lettered a message during the run"}
	if !reflect.DeepEqual(f.Why, want) {
		t.Errorf("why %q, want %q", f.Why, want)
	}
}
