//go:build race

package model

// raceEnabled: the race detector slows the kernels' Go twins tenfold, and
// the race run checks synchronisation, not numerics.
const raceEnabled = true
