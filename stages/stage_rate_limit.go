package stages

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/flow/expr"
)

// The rate_limit stage's attributes.
const (
	rateLimitFieldKey   = "key"
	rateLimitFieldRate  = "rate"
	rateLimitFieldPer   = "per"
	rateLimitFieldBurst = "burst"
)

// The rate_limit stage passes each message on unchanged, no sooner than its key's limit allows: a
// message over the limit is delayed (stages.Delay), in place, never dropped. The limit of each key
// is kept in Redis (Env.RateLimiter), so it holds across every process that runs the pipeline.
func init() {
	RegisterStage(StageKind{
		Spec: &flow.Kind{
			Name: "rate_limit",
			Doc: "Passes each message on unchanged, at most rate messages per per for each key, across every process that runs " +
				"the pipeline; burst messages may go at once after a quiet spell. A message over the limit waits where it is, " +
				"and is never dropped: the messages behind it in its lane (its key, with ordering = \"key\") and its partition's " +
				"next batch wait with it, so no message of its key overtakes it and the backlog stays in the input topic. " +
				"It reads at most burst messages at a time, and passes each batch on when its last message's turn has come. " +
				"The wait is the stage's delayed time in the job summary, the metrics and the live page.",
			Attributes: rateLimitAttributes("messages"),
			Example: `stage "per_tenant" {
  kind  = "rate_limit"
  input = topic.calls
  key   = msg.tenant
  rate  = 100
  per   = "1s"
  burst = 20
}`,
			Check: checkRateLimit,
		},
		// It reads no more than burst messages at a time: it passes its batch on when the batch is
		// committed, so what leaves it then is a burst the limit allows, not a backlog at once.
		TraitsOf: func(config flow.Attrs) StageTraits {
			return StageTraits{KeepsKey: true, MaxRead: int(max(config.Int(rateLimitFieldBurst), 1))}
		},
		New: newRateLimitStage,
	})
}

// rateLimitAttributes are the attributes of a rate limit: the rate_limit stage's, and those of an
// http sink's rate_limit block; what counts words what is limited.
func rateLimitAttributes(what string) []flow.Attribute {
	return []flow.Attribute{
		{
			Name: rateLimitFieldKey, Type: flow.TypeMessageExpr, Roots: []string{"msg"}, DefaultDoc: "one limit for every message",
			Doc: "What the limit is counted by, such as key = msg.tenant: each value has a limit of its own.",
		},
		{Name: rateLimitFieldRate, Type: flow.TypeNumber, Required: true, Doc: "How many " + what + " of a key may go per per, such as 100; more than 0."},
		{Name: rateLimitFieldPer, Type: flow.TypeDuration, Default: time.Second, Doc: "The time rate is counted over."},
		{
			Name: rateLimitFieldBurst, Type: flow.TypeInteger, Default: int64(1), Min: flow.Bound(1),
			Doc: "How many " + what + " of a key may go at once after a quiet spell; the ones after them are spaced per/rate apart.",
		},
	}
}

// checkLimit checks that a limit's rate and per let messages through, reporting at the attribute
// with errorf: a rate above 0 whose interval (per / rate) is at least a microsecond, which is as
// fine as the limit's clock counts.
func checkLimit(limit flow.Attrs, errorf func(attribute, summary, format string, args ...any)) {
	if !limit.Has(rateLimitFieldRate) {
		return // reported as missing
	}
	rate, per := limit.Float(rateLimitFieldRate), limit.Duration(rateLimitFieldPer)
	switch {
	case !(rate > 0) || math.IsInf(rate, 1):
		errorf(rateLimitFieldRate, "Invalid rate", "rate must be a number greater than 0, such as 100: how many messages may go per %s.", per)
	case per <= 0: // or refused: reported where it is written, and not again (flow.KindCheck.Errorf)
		errorf(rateLimitFieldPer, "Invalid per", "per must be a positive duration, such as \"1s\".")
	case float64(per)/rate < float64(time.Microsecond):
		errorf(rateLimitFieldRate, "Invalid rate", "rate = %v per %s is more than one message a microsecond, which is as fine as a rate limit counts.", rate, per)
	}
}

// checkRateLimit checks a rate_limit stage: its limit, and an ordering that keeps keys in order.
func checkRateLimit(c *flow.KindCheck) {
	if c.Ordering == flow.OrderNone {
		c.Errorf("ordering", "Rate limit without order",
			"A rate_limit stage holds a message over its limit where it is, so that no later message of its key overtakes it: "+
				"use ordering = \"key\" (the default) or \"partition\", not \"none\", whose consumers may take over a message that waits long.")
	}
	checkLimit(*c.Config, c.Errorf)
}

// RateLimitOf is the limit of rate messages per per with bursts of burst, as a RateLimiter takes it.
func RateLimitOf(rate float64, per time.Duration, burst int64) RateLimit {
	return RateLimit{Interval: time.Duration(float64(per) / rate), Burst: max(burst, 1)}
}

// keyedLimit is a rate limit as a kind applies it: its limit, and the key it is counted by.
type keyedLimit struct {
	key     *expr.Program // nil: one limit
	limiter RateLimiter
	limit   RateLimit
}

// newKeyedLimit reads a limit's attributes (the stage's, or a rate_limit block's).
func newKeyedLimit(limit flow.Attrs, limiter RateLimiter) keyedLimit {
	return keyedLimit{
		key: limit.Expr(rateLimitFieldKey), limiter: limiter,
		limit: RateLimitOf(limit.Float(rateLimitFieldRate), limit.Duration(rateLimitFieldPer), limit.Int(rateLimitFieldBurst)),
	}
}

// take takes m's turn: nil when it may go, a Delay when it must wait, or why its key cannot be read.
func (l keyedLimit) take(ctx context.Context, m *Message) error {
	var key string
	if l.key != nil {
		if err := m.Decode(); err != nil {
			return err
		}
		k, err := l.key.EvalString(&expr.Env{Msg: m.Value})
		if err != nil {
			return evalError(err)
		}
		key = k
	}
	wait, err := l.limiter.Take(ctx, key, l.limit)
	if err != nil {
		return err
	}
	if wait > 0 {
		return Delay(wait)
	}
	return nil
}

func newRateLimitStage(s *flow.Stage, env Env) (Processor, error) {
	if env.RateLimiter == nil {
		return nil, fmt.Errorf("stage %s: a rate_limit stage needs the runtime's rate limits (Env.RateLimiter), which this runtime does not offer", s.Name)
	}
	return &rateLimitStage{out: s.Output, limit: newKeyedLimit(s.Config, env.RateLimiter)}, nil
}

// rateLimitStage is a stage of the rate_limit kind.
type rateLimitStage struct {
	out   *flow.Topic
	limit keyedLimit
}

func (s *rateLimitStage) Process(ctx context.Context, m *Message, out []Output) ([]Output, error) {
	if err := s.limit.take(ctx, m); err != nil {
		return out, err
	}
	return append(out, Output{Topic: s.out, Message: *m}), nil
}
