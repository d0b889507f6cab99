package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// go-redis has a process-wide logger that prints some failures on standard error on its own, for
// example
//
//	redis: 2024/05/01 12:00:00 pool.go:762: redis: connection pool: failed to dial after 5 attempts: ...
//
// before the caller has even seen the error. This package returns every error to its caller,
// which reports it once, in its own words and with passwords redacted; go-redis's extra lines
// only repeat it (or describe a background reconnection whose failure the next call returns), and
// they would be printed in the middle of flowrun's output. So go-redis's logger is silenced.
//
// It is done in init rather than in Open: go-redis's SetLogger writes a global variable without
// synchronisation, and package initialisation happens before any goroutine can use a go-redis
// client, so there is no data race with a client that is logging. This package is flowrun's only
// user of go-redis (see the package documentation), which is why it makes this choice for the
// whole process.
func init() { goredis.SetLogger(discardLogger{}) }

// discardLogger is a go-redis logger that prints nothing.
type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}
