// Package redistest runs real redis-server processes for tests: single servers (optionally with
// an fsync'ed AOF so that data survives Restart and Kill) and local Redis Clusters of masters.
//
// Every server listens on a free loopback port with its own temporary directory; a port taken by
// someone else between the probe and the bind is detected and another port is tried. Servers
// never touch a Redis that was already running on the machine.
//
// Per-test servers:
//
//	srv := redistest.Start(t)              // stopped by t.Cleanup
//	rdb := srv.Client(t)                   // a go-redis client, closed by t.Cleanup
//	srv.Kill(); srv.Start(t)               // crash and come back (use WithAOF to keep data)
//	cl := redistest.StartCluster(t, 3)     // 3 masters, all slots assigned, converged
//
// Servers shared by the tests of a package (cheaper: one start per test binary):
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }
//	func TestX(t *testing.T) { srv := redistest.Shared(t); ... }
//	func TestY(t *testing.T) { cl := redistest.SharedCluster(t, 3); ... }
//
// Tests on a shared instance must isolate themselves by key prefix and must not stop it,
// restart it, flush it or change its configuration.
//
// redis-server must be on PATH; when it is not, the test fails with InstallHint.
package redistest
