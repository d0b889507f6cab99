package runtime

import (
	"context"
	"errors"
	"time"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// failedForGood is the error of a message that gets no further attempt: a permanent failure, retries
// given up, a poison message. withDeadLetters turns it into the message's dead letter.
type failedForGood struct {
	err          error
	attempts     int
	firstFailure time.Time
}

func (f *failedForGood) Error() string { return f.err.Error() }
func (f *failedForGood) Unwrap() error { return f.err }

// withDeadLetters sends a message that failed for good to the node's dead letters (deadletter.go):
// its result is the dead letter, written and acknowledged with the batch.
func (r *processing) withDeadLetters(n *node, next messageFunc) messageFunc {
	return func(ctx context.Context, m *message, buf []redis.Output, p pass) (result, []redis.Output, error) {
		res, buf, err := next(ctx, m, buf, p)
		if err == nil {
			return res, buf, nil
		}
		var f *failedForGood
		if errors.As(err, &f) {
			out := r.deadLetterMessage(n, m, f.err, f.attempts, f.firstFailure)
			return result{deadLetters: []redis.Output{out}}, buf, f.err
		}
		return res, buf, err
	}
}
