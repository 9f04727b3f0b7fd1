package experts

import "fmt"

// Policy chooses which pool slot a new record replaces.
type Policy string

// Eviction policies.
const (
	// LRU evicts the least recently used record.
	LRU Policy = "lru"
	// FLRU is frequency-weighted LRU: a record's recency is credited with
	// one token's worth of layer steps per recent use (use counts halve
	// every 64 tokens), so experts the router keeps coming back to outlive
	// a burst of one-off ones.
	FLRU Policy = "flru"
)

// Policies lists the valid policies.
var Policies = []Policy{LRU, FLRU}

func (p Policy) valid() error {
	for _, q := range Policies {
		if p == q {
			return nil
		}
	}
	return fmt.Errorf("eviction policy %q unknown (want %s or %s)", p, LRU, FLRU)
}

// victim returns a free slot, else the slot the policy evicts among those
// neither held by the current step nor being read; -1 when there is none.
// A linear scan: at most a few thousand slots, a few hundred misses per
// token, far below the cost of computing one expert.
func (s *Stream) victim() int32 {
	best := int32(-1)
	var bestScore float64
	flru := s.o.Policy == FLRU
	credit := float64(s.L)
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.state == free {
			return int32(i)
		}
		if sl.held || sl.state != ready {
			continue
		}
		score := float64(sl.last)
		if flru {
			score += credit * float64(s.freq[sl.rec])
		}
		if best < 0 || score < bestScore {
			best, bestScore = int32(i), score
		}
	}
	return best
}

// DefaultPolicy is the eviction policy when none is asked for.
const DefaultPolicy = FLRU
