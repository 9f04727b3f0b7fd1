//go:build race

package model

// raceEnabled: the race run checks synchronisation; TestCrossCPULogits,
// whose Go-twin half runs ten times slower under it, checks numerics and
// runs without it.
const raceEnabled = true
