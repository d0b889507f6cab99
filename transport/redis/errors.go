package redis

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
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

// unrecoverableReplies are the beginnings of Redis replies that refuse the request itself, whenever
// it is sent: the user may not run the command or touch the key (NOPERM), the credentials are wrong
// (WRONGPASS, NOAUTH), the server does not know the command, or a key the pipeline uses holds
// another type (WRONGTYPE); a script may not run a command (Redis 7.0 says so with an ERR, not
// NOPERM, and does not name the command). Waiting changes none of them; an operator must. Replies that heal by
// themselves (LOADING, BUSY, READONLY during a failover, CLUSTERDOWN, TRYAGAIN, OOM while consumers
// catch up, MISCONF once the disk has room) are not among them.
var unrecoverableReplies = []string{
	"NOPERM", "WRONGPASS", "NOAUTH", "WRONGTYPE", "ERR unknown command", "ERR unknown subcommand",
	"ERR The user executing the script can't run this command",
}

// Unrecoverable reports whether err is a failure that retrying will not heal: a Redis reply that
// refuses the request whatever the timing (see unrecoverableReplies), also when a script or a
// transaction passes it on and when this package or go-redis wrapped it, a TLS certificate that
// the client does not trust or that does not match the server, a server that refuses the
// client's certificate (or wants one), or an *AccessError. Network errors, timeouts and every
// other reply are worth retrying.
func Unrecoverable(err error) bool {
	if err == nil {
		return false
	}
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var access *AccessError
	if errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) || errors.As(err, &verify) ||
		errors.As(err, &access) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && isClientCertAlert(op.Err.Error()) {
		return true
	}
	msg := err.Error()
	for _, reply := range unrecoverableReplies {
		// A reply starts the message, or follows the ": " of a wrapping error or the space of a
		// script's error ("ERR Error running script ...: @user_script:1: NOPERM ...").
		if strings.HasPrefix(msg, reply) || strings.Contains(msg, ": "+reply) || strings.Contains(msg, " "+reply+" ") {
			return true
		}
	}
	return false
}
