// Package flowtest runs pipeline tests: the run blocks of *.flowtest.hcl files (decoded and checked
// by package flow/testfile) against a pipeline that runs in this process on an embedded Redis and a
// virtual clock, with nothing to start.
//
// A test file's runs share one Redis, one clock and one running pipeline, in order, unless a run
// resets them. The pipeline runs as in production (its runtime, its kinds, its retries, leases and
// dead letters), with three differences: producing sources (generate, file, stdin) produce nothing
// but what the test sends them; sinks capture what they receive instead of delivering it (an http
// sink with an override_sink gets canned answers); and Go stage functions can be mocks.
//
// Time moves only when the harness moves it: once every goroutine of the pipeline is idle, it moves
// the clock (and the embedded Redis's TIME, TTLs and entry IDs) to the next timer that is due, so
// that minutes of backoff take the milliseconds that processing takes, in the order they would
// have happened. Idle means: no batch is being processed (runtime.Activity), no Redis command
// awaits its reply, no timer that fired is still unread, and the Redis server's command count and
// the clock's timers have stood still for a moment. That last part is an observation over real
// time, so a goroutine that computes for long without a command or a timer could let time move
// early; the runtime's own accounting covers the long computations (batches), which is why it is
// there.
//
// What it deliberately does not do: run against a real Redis or a cluster (the runtime's own tests
// do that), run sources' own code, or crash a pipeline in the middle of a batch: a crash step kills
// it at a moment when it is idle, which is where every committed state is visible.
package flowtest
