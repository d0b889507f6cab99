package flow

import (
	"fmt"
	"time"
)

// DefaultRetry is the policy of a stage or sink without a retry attribute; a retry block's absent
// attributes take the same values.
var DefaultRetry = RetryPolicy{
	MaxAttempts: 3,
	Backoff:     BackoffExponential,
	Initial:     100 * time.Millisecond,
	Max:         30 * time.Second,
	Jitter:      0.2,
}

// DefaultTransientRetry is how a stage or sink without a retry attribute retries transient
// failures (a service that is down or overloaded, a timeout): without limit, since the message is
// not at fault, probing at most every 5 seconds, so that the node goes on within 5 seconds of the
// service's return while putting next to no load on it meanwhile.
var DefaultTransientRetry = RetryPolicy{
	MaxAttempts: 0,
	Backoff:     BackoffExponential,
	Initial:     100 * time.Millisecond,
	Max:         5 * time.Second,
	Jitter:      0.2,
}

var retrySpec = &BlockSpec{
	Type:   "retry",
	Labels: []string{"name"},
	Doc: "A retry policy, used by stages and sinks with retry = retry.NAME. A message that still fails " +
		"after max_attempts (or max_elapsed) goes to the dead-letter stream; a permanent failure (an " +
		"HTTP 4xx, an expression that cannot evaluate, a stages.Permanent error) goes there at once. A " +
		"stage or sink without a retry attribute retries transient failures (connection refused or " +
		"reset, timeouts, DNS failures, HTTP 408, 429 and 5xx, stages.Transient errors) without limit, " +
		"every 5 seconds at most, and other failures by this block's defaults.",
	Attributes: []Attribute{
		{
			Name: "max_attempts", Type: TypeInteger, Default: int64(DefaultRetry.MaxAttempts), Min: Bound(0),
			Doc: "Attempts in all, the first one included; 1 means no retry, 0 no limit (up to max_elapsed, if set).",
		},
		{
			Name: "max_elapsed", Type: TypeDuration,
			Doc: "The longest a message is retried, from its first failure; without it, only max_attempts limits the retries.",
		},
		{
			Name: "backoff", Type: TypeString, Default: string(DefaultRetry.Backoff),
			Enum: []string{string(BackoffConstant), string(BackoffLinear), string(BackoffExponential)},
			Doc: "How the delay grows: constant waits initial every time, linear waits initial times " +
				"the retry number, exponential doubles the delay at each retry.",
		},
		{Name: "initial", Type: TypeDuration, Default: DefaultRetry.Initial, Doc: "The delay before the first retry."},
		{Name: "max", Type: TypeDuration, Default: DefaultRetry.Max, Doc: "No delay is longer than this."},
		{
			Name: "jitter", Type: TypeNumber, Default: DefaultRetry.Jitter, Min: Bound(0), Max: Bound(1),
			Doc: "The fraction of each delay that is randomised, so that retries of many messages spread out.",
		},
	},
}

// compileRetries compiles every retry policy; stages and sinks refer to them by name.
func (c *compiler) compileRetries() {
	for _, b := range c.cfg.Retries {
		attrs := c.decodeAttributes(retrySpec.Attributes, b.Attributes)
		p := RetryPolicy{
			Name:        b.Name,
			MaxAttempts: int(attrs.Int("max_attempts")),
			MaxElapsed:  attrs.Duration("max_elapsed"),
			Backoff:     Backoff(attrs.String("backoff")),
			Initial:     attrs.Duration("initial"),
			Max:         attrs.Duration("max"),
			Jitter:      attrs.Float("jitter"),
		}
		if p.Max < p.Initial {
			rng := b.DeclRange
			if a, ok := b.Attributes["max"]; ok {
				rng = a.Expr.Range()
			}
			c.errorf(rng, "Invalid retry delays",
				fmt.Sprintf("max (%s) is shorter than initial (%s): no delay could be as long as the first one.",
					FormatDuration(p.Max), FormatDuration(p.Initial)))
		}
		if attrs.Has("initial") && p.Initial == 0 && p.MaxAttempts != 1 {
			c.warnf(b.Attributes["initial"].Expr.Range(), "Retries without delay",
				"An initial delay of 0 retries at once, which rarely outlasts a transient failure.")
		}
		c.retries[b.Name] = p
	}
}
