//go:build !race

package runtime_test

// raceEnabled tells that this test binary runs with the race detector, so that the flowrun
// binaries it starts are built with it too.
const raceEnabled = false
