package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/flowrun/flowrun/runtime/outage"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// failures is how the run ends on an error, and how its loops meet a failing Redis: the first
// error that ends the run stops it; a failed call to Redis is part of an outage, waited out by
// the caller, unless waiting does not heal it. The runner embeds it.
type failures struct {
	log    *slog.Logger
	outage *outage.Tracker
	// checkAccess checks the run's permissions again, once an outage (runner.checkAccess).
	checkAccess func() error

	mu       sync.Mutex
	fatalErr error              // the first error that stops the run
	stopRun  context.CancelFunc // stops the run
}

// err is the first error that stopped the run, if any.
func (f *failures) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fatalErr
}

// redisFailed handles a failed call to Redis in a loop that retries it. An error that waiting does
// not heal (redis.Unrecoverable: no permission, a wrong password, an unknown command) ends the run
// with what was being done; any other is part of an outage, and the caller retries. It reports
// whether to retry.
func (f *failures) redisFailed(what string, err error) bool {
	if redis.Unrecoverable(err) {
		f.fail(fmt.Errorf("%s: %w", what, err))
		return false
	}
	f.outage.Failed(what, err)
	// A transaction that Redis refused to queue (EXECABORT) hides why: a command the user may no
	// longer send (its ACL changed while the run went on) looks like running out of memory. Once an
	// outage, ask again what the start-up check asked.
	if strings.Contains(err.Error(), "EXECABORT") && f.outage.Recheck() {
		if cerr := f.checkAccess(); cerr != nil {
			f.fail(fmt.Errorf("%s: %w", what, cerr))
			return false
		}
	}
	return true
}

// fail records the first error that ends the run, and stops it.
func (f *failures) fail(err error) {
	f.mu.Lock()
	if f.fatalErr == nil {
		f.fatalErr = err
	}
	f.mu.Unlock()
	f.log.Error("stopping", "err", err)
	f.stopRun()
}

// finish ends a job run without an error.
func (f *failures) finish() { f.stopRun() }
