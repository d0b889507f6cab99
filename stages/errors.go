package stages

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"syscall"
	"time"
)

// A stage or sink's failure is one of three kinds, and the runtime treats each its own way:
//
//   - permanent (Permanent, an HTTP 4xx, an expression that cannot evaluate on the message): no
//     retry can fix it, so the message goes to the dead letters at once;
//   - transient (Transient, a refused or reset connection, a timeout, a DNS failure, an HTTP 408,
//     429 or 5xx): something the message depends on is away, so the node pauses and probes until
//     it is back, by default without limit;
//   - anything else: retried by the stage's or sink's retry policy, then dead-lettered.

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that no retry can fix (a malformed order, a rule violation): the message
// goes to the dead-letter stream at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// transientError marks a failure of something outside the message.
type transientError struct {
	err   error
	after time.Duration // how long the failing service asked to be left alone; 0: not said
}

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// Transient marks err as a failure of something the message depends on rather than of the message
// (a service that is down or overloaded): the stage pauses and tries again until the service is
// back, by default without limit, instead of dead-lettering the messages it cannot pass on
// meanwhile. Errors of the network (a refused or reset connection, a timeout, a DNS failure) are
// transient without the mark. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err: err}
}

// TransientAfter is Transient for a service that said when to try again (an HTTP Retry-After):
// no attempt is made before after has passed.
func TransientAfter(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return transientError{err: err, after: max(after, 0)}
}

// IsTransient reports whether err is a transient failure: marked with Transient or TransientAfter,
// a timeout (a context deadline, a net.Error that timed out), a refused, reset or aborted connection,
// an unreachable host or network, a DNS failure, or a connection that closed before its answer. An
// error marked Permanent is not transient, whatever it wraps.
func IsTransient(err error) bool {
	if err == nil || IsPermanent(err) {
		return false
	}
	var t transientError
	if errors.As(err, &t) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, errno := range []syscall.Errno{
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
		syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN, syscall.ENETDOWN,
	} {
		if errors.Is(err, errno) {
			return true
		}
	}
	// A server that closed the connection before it answered: Go's HTTP client reports io.EOF.
	var ue *url.Error
	return errors.As(err, &ue) && (errors.Is(ue.Err, io.EOF) || errors.Is(ue.Err, io.ErrUnexpectedEOF))
}

// RetryAfter returns how long the failing service asked to be left alone, if err says.
func RetryAfter(err error) (time.Duration, bool) {
	var t transientError
	if errors.As(err, &t) && t.after > 0 {
		return t.after, true
	}
	return 0, false
}

// delayError is what Delay returns.
type delayError struct{ after time.Duration }

func (e delayError) Error() string { return "delayed " + e.after.String() }

// Delay says that the message may not go yet, which is no failure: the runtime attempts it again
// after d, where it is (the messages behind it in its lane wait with it, and its partition's input is
// held back), without counting a failed attempt or a retry. A rate limit returns it for a message
// over its limit. The wait counts as the node's delayed time (the summary, the metrics, the live
// page); a shutdown abandons the message, which is delivered again after the restart.
func Delay(d time.Duration) error { return delayError{after: max(d, time.Nanosecond)} }

// DelayOf reports whether err is a Delay, and for how long.
func DelayOf(err error) (time.Duration, bool) {
	var d delayError
	if errors.As(err, &d) {
		return d.after, true
	}
	return 0, false
}

// What Emitter.EmitAll refuses with, having queued nothing (ErrUnavailable: or after an attempt to
// write failed, see EmitAll).
var (
	// ErrTopicFull: a partition the messages go to is at its topic's max_lag.
	ErrTopicFull = errors.New("the output topic is full (its max_lag)")
	// ErrUnavailable: Redis is failing, or the source is stopping.
	ErrUnavailable = errors.New("the messages cannot be written now: Redis is failing or the source is stopping")
)

// EmitError is Emitter.EmitAll's refusal of one of its messages (too large, a key that cannot be
// computed): none of them was queued.
type EmitError struct {
	Index int // the message's index in the call
	Err   error
}

func (e *EmitError) Error() string { return e.Err.Error() }
func (e *EmitError) Unwrap() error { return e.Err }
