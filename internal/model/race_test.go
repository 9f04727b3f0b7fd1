//go:build race

package model

// raceEnabled: the race detector is on (CI runs this package under it to
// check the work split across the pool).
const raceEnabled = true
