package redis

import (
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// ErrNoGroup is returned (wrapped) when a stream or its consumer group does not exist (Redis
// NOGROUP), for example after the stream was deleted. EnsureGroup creates both.
var ErrNoGroup = errors.New("no such stream or consumer group")

// isNil reports whether err is go-redis's nil reply.
func isNil(err error) bool { return errors.Is(err, goredis.Nil) }

// classify wraps Redis error replies that callers act on in this package's sentinel errors.
func classify(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "NOGROUP"):
		return fmt.Errorf("%w: %w", ErrNoGroup, err)
	case isLeaseLost(err):
		return fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return err
}

// errUnexpected describes a reply of an unexpected shape.
func errUnexpected(v any) error { return fmt.Errorf("unexpected reply %v", v) }
