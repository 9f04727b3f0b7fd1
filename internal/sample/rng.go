package sample

import "math/bits"

// rng is xoshiro256** seeded through splitmix64. It is implemented here
// rather than taken from math/rand/v2 because the sampler promises that a
// given Seed yields the same tokens on every platform and every future Go
// release; owning the ~20 lines of generator code makes that promise ours to
// keep instead of the standard library's.
type rng struct {
	s [4]uint64
}

// splitmix64 advances *state and returns the next output. It is the seeding
// routine recommended by the xoshiro authors: it turns any 64-bit seed,
// including 0, into a well-mixed, never all-zero xoshiro state.
func splitmix64(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (r *rng) seed(seed uint64) {
	st := seed
	for i := range r.s {
		r.s[i] = splitmix64(&st)
	}
}

func (r *rng) next() uint64 {
	s := &r.s
	result := bits.RotateLeft64(s[1]*5, 7) * 9
	t := s[1] << 17
	s[2] ^= s[0]
	s[3] ^= s[1]
	s[1] ^= s[2]
	s[0] ^= s[3]
	s[2] ^= t
	s[3] = bits.RotateLeft64(s[3], 45)
	return result
}

// float64 returns a uniform value in [0, 1) built from the top 53 bits, so
// every representable result is equally likely and 1 is never returned
// (which AcceptDraft relies on to always accept when p[x] == q[x]).
func (r *rng) float64() float64 {
	return float64(r.next()>>11) * 0x1p-53
}
