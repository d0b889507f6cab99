//go:build race

package plugins_test

// raceEnabled tells that this test binary runs with the race detector, so that the binaries it
// builds and runs have it too.
const raceEnabled = true
