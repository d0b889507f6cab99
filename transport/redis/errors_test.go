package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
)

func TestUnrecoverable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("NOPERM User app has no permissions to run the 'xadd' command"), true},
		{fmt.Errorf("redis: XADD flow:{in:0}: %w", errors.New("NOPERM No permissions to access a key")), true},
		{errors.New("WRONGPASS invalid username-password pair or user is disabled."), true},
		{errors.New("NOAUTH Authentication required."), true},
		{errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{fmt.Errorf("redis: reclaiming k: %w", errors.New("ERR unknown command 'XAUTOCLAIM', with args beginning with: ")), true},
		{errors.New("ERR Error running script (call to f_1): @user_script:1: NOPERM this user has no permissions to run the 'zadd' command"), true},
		{fmt.Errorf("redis: acking group g on s: %w", errors.New("ERR The user executing the script can't run this command or subcommand script: 39a1f8, on @user_script:29.")), true},
		{errors.New("LOADING Redis is loading the dataset in memory"), false},
		{errors.New("OOM command not allowed when used memory > 'maxmemory'."), false},
		{errors.New("READONLY You can't write against a read only replica."), false},
		{errors.New("CLUSTERDOWN The cluster is down"), false},
		{errors.New("ERR no such key"), false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{io.EOF, false},
		{context.DeadlineExceeded, false},
		{&AccessError{User: "app", Check: AccessCheck{Args: []string{"xadd"}, Words: 1}}, true},
		{fmt.Errorf("reading: %w", &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}), true},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}, true},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: internal error")}, false},
	} {
		if got := Unrecoverable(c.err); got != c.want {
			t.Errorf("Unrecoverable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
