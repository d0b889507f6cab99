// Package acme is an example of a team's own stage functions and kinds: it registers a Go stage
// function (score.go), a stateful one (velocity.go) and a sink kind (csvsink.go) with flowrun in
// init, and a custom flowrun binary (../flowrun-acme) compiles them in.
package acme

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/flowrun/flowrun/stages"
)

func init() {
	// Score passes each order on with the key it got: the stage after it may run in the same hop.
	stages.Register("acme.score", Score, stages.KeepsKey())
}

// riskyCountries raise an order's risk score.
var riskyCountries = map[string]bool{"XX": true, "ZZ": true}

// Score adds a fraud risk score between 0 and 100 to an order, from its amount and country. An order
// without a numeric amount fails for good: no retry would give it one.
func Score(_ context.Context, m stages.Message) ([]stages.Message, error) {
	amount, err := number(m.Value["amount"])
	if err != nil {
		return nil, stages.Permanent(fmt.Errorf("order %v: amount: %w", m.Value["id"], err))
	}
	score := math.Min(100, amount/20)
	if country, _ := m.Value["country"].(string); riskyCountries[country] {
		score = math.Min(100, score+50)
	}
	m.Value["risk"] = math.Round(score)
	return []stages.Message{m}, nil
}

// number reads a JSON number, which flowrun decodes as json.Number.
func number(v any) (float64, error) {
	switch n := v.(type) {
	case json.Number:
		return n.Float64()
	case float64:
		return n, nil
	case nil:
		return 0, errors.New("missing")
	}
	return 0, fmt.Errorf("%v is not a number", v)
}
