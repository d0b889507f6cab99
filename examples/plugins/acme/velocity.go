package acme

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/flowrun/flowrun/stages"
)

// A stateful function: what it remembers of each customer is state of the input partition, in
// Redis, committed with the acknowledgements of the orders, and it moves with the partition when
// another process takes it over.
func init() {
	stages.RegisterStateful("acme.velocity", stages.StatefulFunc{Process: Velocity, OnTimer: ForgetCustomer})
}

// VelocityWindow is how far back, in event time, Velocity counts a customer's orders; VelocityAlert
// is the count that makes an order suspect.
const (
	VelocityWindow = 10 * time.Minute
	VelocityAlert  = 2
)

// Velocity passes on the orders that are at least their customer's VelocityAlert-th within
// VelocityWindow, with recent_orders, that count: customers who order in bursts are a classic sign
// of fraud. It keeps each customer's recent order times (Unix ms, a JSON list) under the message's
// key, the customer, and a timer that forgets the customer VelocityWindow after their latest order,
// so that the state holds only the customers who ordered lately.
func Velocity(ctx context.Context, m stages.Message, state stages.State) ([]stages.Message, error) {
	// The stage has no event_time, so an order's event time is when its entry was written.
	at := m.EntryTime
	var times []int64
	v, found, err := state.Get(ctx, m.Key)
	if err != nil {
		return nil, err
	}
	if found {
		if err := json.Unmarshal(v, &times); err != nil {
			return nil, stages.Permanent(fmt.Errorf("customer %s: the state holds %q: %w", m.Key, v, err))
		}
	}
	// Orders older than the window no longer count, whether or not the customer's timer has fired
	// yet: timers fire after the batch's orders, and the count must not depend on where batches end.
	recent := []int64{at.UnixMilli()}
	for _, t := range times {
		if t > at.Add(-VelocityWindow).UnixMilli() {
			recent = append(recent, t)
		}
	}
	b, err := json.Marshal(recent)
	if err != nil {
		return nil, err
	}
	if err := state.Put(ctx, m.Key, b); err != nil {
		return nil, err
	}
	if err := state.SetTimer(ctx, m.Key, time.UnixMilli(slices.Max(recent)).Add(VelocityWindow)); err != nil {
		return nil, err
	}
	if len(recent) < VelocityAlert {
		return nil, nil
	}
	m.Value["recent_orders"] = len(recent)
	return []stages.Message{m}, nil
}

// ForgetCustomer is Velocity's timer, named after the customer: their latest order is
// VelocityWindow old, so none of their orders counts any more.
func ForgetCustomer(ctx context.Context, customer string, _ time.Time, state stages.State) ([]stages.Message, error) {
	return nil, state.Delete(ctx, customer)
}
