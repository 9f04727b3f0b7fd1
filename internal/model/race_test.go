//go:build race

package model

// raceEnabled: the race detector is on. The race run checks the work split
// across the pool; tests that check numerics over many cases
// (TestQuantisedNLL, TestCrossCPULogits, ten times slower under it) run
// without it.
const raceEnabled = true
