package experts

// A Trace is the expert records a decode asked for, step by step: one step
// is one layer of one token, its records those the layer's router chose
// (record = layer·experts + expert).
type Trace [][]int32

// BeladyHits replays tr through an empty pool of slots records under
// Belady's optimal offline policy (MIN): on a miss with the pool full it
// evicts the resident record whose next request lies furthest ahead
// (never requested again first), never one the current step asks for, as
// the Stream holds a step's records while the step runs. No policy that
// cannot see the future hits more often, so hits/total bounds the hit rate
// of any eviction policy at this pool size (prefetching aside: it changes
// when a miss is paid, not whether). slots must be at least the largest
// step.
func BeladyHits(tr Trace, slots int) (hits, total int) {
	// next[i][k]: the step that next requests tr[i][k] after step i.
	const never = int(^uint(0) >> 1)
	next := make([][]int, len(tr))
	upcoming := map[int32]int{}
	for i := len(tr) - 1; i >= 0; i-- {
		next[i] = make([]int, len(tr[i]))
		for k, r := range tr[i] {
			n, ok := upcoming[r]
			if !ok {
				n = never
			}
			next[i][k] = n
		}
		for _, r := range tr[i] {
			upcoming[r] = i
		}
	}
	nextUse := map[int32]int{} // resident record → its next request
	held := map[int32]bool{}
	for i, step := range tr {
		clear(held)
		for _, r := range step {
			held[r] = true
		}
		for k, r := range step {
			total++
			if _, ok := nextUse[r]; ok {
				hits++
			} else if len(nextUse) >= slots {
				victim, far := int32(-1), -1
				for q, n := range nextUse {
					if !held[q] && (n > far || n == far && q < victim) {
						victim, far = q, n
					}
				}
				if victim < 0 {
					continue // every slot is held by this step: the record streams through
				}
				delete(nextUse, victim)
			}
			nextUse[r] = next[i][k]
		}
	}
	return hits, total
}

// SimulateHits replays tr through an empty pool of slots records under
// policy p as the Stream applies it to a decode (one row per step: LRU by
// step, FLRU crediting each use with a token's worth of steps, use counts
// halved every 64 tokens), for layers layers; no lookahead.
func SimulateHits(tr Trace, slots int, p Policy, layers int) (hits, total int) {
	type entry struct {
		last int64
		held bool
	}
	pool := map[int32]*entry{}
	freq := map[int32]float64{}
	credit := float64(layers)
	var clock int64
	for _, step := range tr {
		clock++
		if clock%int64(64*layers) == 0 {
			for r := range freq {
				freq[r] *= 0.5
			}
		}
		for _, e := range pool {
			e.held = false
		}
		var miss []int32
		for _, r := range step {
			total++
			freq[r]++
			if e, ok := pool[r]; ok {
				hits++
				e.last, e.held = clock, true
				continue
			}
			miss = append(miss, r)
		}
		for _, r := range miss {
			if len(pool) >= slots {
				victim, best := int32(-1), 0.0
				for q, e := range pool {
					if e.held {
						continue
					}
					score := float64(e.last)
					if p == FLRU {
						score += credit * freq[q]
					}
					if victim < 0 || score < best || score == best && q < victim {
						victim, best = q, score
					}
				}
				if victim < 0 {
					continue
				}
				delete(pool, victim)
			}
			pool[r] = &entry{last: clock, held: true}
		}
	}
	return hits, total
}
