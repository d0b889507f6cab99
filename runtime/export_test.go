package runtime

import redis "github.com/flowrun/flowrun/transport/redis"

// AccessChecks returns what rt's run checks at start.
func AccessChecks(rt *Runtime) []redis.AccessCheck { return rt.r.accessChecks().Checks() }

// AccessRule returns the ACL SETUSER rule that grants everything rt's run checks at start.
func AccessRule(rt *Runtime) string { return rt.r.rdb.AccessRule(AccessChecks(rt)) }
