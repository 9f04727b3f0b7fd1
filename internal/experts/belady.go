package experts

import "fmt"

// A Trace is the expert records a decode asked for, step by step: one step
// is one layer of one token, its records those the layer's router chose
// (record = layer·experts + expert).
type Trace [][]int32

// BeladyHits replays tr through an empty pool of slots records under
// Belady's optimal offline policy (MIN): on a miss with the pool full it
// evicts the resident record whose next request lies furthest ahead
// (never requested again first; ties to the lower record), never one the
// current step asks for, as the Stream holds a step's records while the
// step runs. No policy that cannot see the future hits more often, so
// hits/total bounds the hit rate of any eviction policy at this pool size
// (prefetching aside: it changes when a miss is paid, not whether). slots
// must be at least the largest step.
func BeladyHits(tr Trace, slots int) (hits, total int) {
	lo, hi := int32(0), int32(-1)
	for i, step := range tr {
		for _, r := range step {
			if i == 0 && hi < lo || r < lo {
				lo = r
			}
			hi = max(hi, r)
		}
	}
	n := int(hi-lo) + 1
	if n <= 0 {
		return 0, 0
	}
	// next[i][k]: the step that next requests tr[i][k] after step i.
	const never = int(^uint(0) >> 1)
	next := make([][]int, len(tr))
	upcoming := make([]int, n)
	for i := range upcoming {
		upcoming[i] = never
	}
	for i := len(tr) - 1; i >= 0; i-- {
		next[i] = make([]int, len(tr[i]))
		for k, r := range tr[i] {
			next[i][k] = upcoming[r-lo]
		}
		for _, r := range tr[i] {
			upcoming[r-lo] = i
		}
	}
	nextUse := upcoming // reused: [record] its next request while resident
	resident := make([]bool, n)
	held := make([]bool, n)
	var pool []int32 // resident records
	for i, step := range tr {
		for _, r := range step {
			held[r-lo] = true
		}
		for k, r := range step {
			total++
			if resident[r-lo] {
				hits++
				nextUse[r-lo] = next[i][k]
				continue
			}
			if len(pool) >= slots {
				at, far := -1, -1
				for j, q := range pool {
					if n := nextUse[q-lo]; !held[q-lo] && (n > far || n == far && q < pool[at]) {
						at, far = j, n
					}
				}
				if at < 0 {
					continue // every slot is held by this step: the record streams through
				}
				resident[pool[at]-lo] = false
				pool[at] = pool[len(pool)-1]
				pool = pool[:len(pool)-1]
			}
			pool = append(pool, r)
			resident[r-lo] = true
			nextUse[r-lo] = next[i][k]
		}
		for _, r := range step {
			held[r-lo] = false
		}
	}
	return hits, total
}

// SimulateHits replays tr through an empty pool of slots records under
// policy p exactly as the Stream applies it to a decode without lookahead
// (one row per step; the same scores, ties to the lowest slot, a free
// slot before any eviction), for a model of layers expert layers of
// experts experts (record = layer·experts + expert). It agrees with the
// Stream hit for hit when a step's misses fit in its readers (top-k at
// most Options.Readers), as they all are then issued when the step
// begins; with fewer readers, later misses may recycle slots the step has
// finished with, in an order that depends on when reads land.
func SimulateHits(tr Trace, slots int, p Policy, layers, experts int) (hits, total int, err error) {
	return simulate(tr, slots, p, layers, experts, nil)
}

// simSlot is a slot of simulate's pool.
type simSlot struct {
	rec  int32 // -1 when free
	last int64
	held bool
}

// simPool returns an empty pool of slots and, for each of records
// records, the slot holding it (-1: none).
func simPool(slots, records int) ([]simSlot, []int32) {
	pool := make([]simSlot, slots)
	for i := range pool {
		pool[i].rec = -1
	}
	where := make([]int32, records)
	for i := range where {
		where[i] = -1
	}
	return pool, where
}

// simulate is SimulateHits with, when oracle is not nil, oracle(step, rec)
// added to the policy's score of each resident record at that step: the
// tests rank policies that could see some of the future against the rest.
func simulate(tr Trace, slots int, p Policy, layers, experts int, oracle func(step int, rec int32) float64) (hits, total int, err error) {
	if err := p.valid(); err != nil {
		return 0, 0, err
	}
	if slots < 1 || layers < 1 || experts < 1 {
		return 0, 0, fmt.Errorf("simulate: %d slots, %d layers, %d experts", slots, layers, experts)
	}
	pool, where := simPool(slots, layers*experts)
	ev := newEvictor(p, layers, experts)
	vs := newVictimSet(slots, layers)
	slot := func(si int32) (int32, int64, bool, bool) {
		sl := &pool[si]
		return sl.rec, sl.last, false, !sl.held
	}
	var clock int64
	var miss []int32
	for i, step := range tr {
		if len(step) == 0 {
			continue
		}
		layer := int(step[0]) / experts
		for _, r := range step {
			if r < 0 || int(r) >= len(where) || int(r)/experts != layer {
				return 0, 0, fmt.Errorf("simulate: step %d asks for record %d, not one of layer %d of %d×%d", i, r, layer, layers, experts)
			}
		}
		clock++
		ev.tick(clock, layer, 1)
		miss = miss[:0]
		for _, r := range step {
			total++
			ev.use(r, 1, true)
			if si := where[r]; si >= 0 {
				hits++
				pool[si].last, pool[si].held = clock, true
				vs.touch(layer)
				continue
			}
			miss = append(miss, r)
		}
		for _, r := range miss {
			if where[r] >= 0 {
				continue // asked for twice in one step
			}
			si := int32(-1)
			if oracle == nil {
				si = vs.pick(&ev, slot)
			} else {
				// Every slot scored, the oracle's bonus added: a test's
				// ceiling, not the pool's order.
				var best float64
				for j := range pool {
					sl := &pool[j]
					if sl.rec < 0 {
						si = int32(j)
						break
					}
					if sl.held {
						continue
					}
					sc := ev.score(sl.rec, sl.last, false) + oracle(i, sl.rec)
					if si < 0 || sc < best {
						si, best = int32(j), sc
					}
				}
			}
			if si < 0 {
				continue // every slot is held by this step: the record streams through
			}
			if old := pool[si].rec; old >= 0 {
				where[old] = -1
				vs.drop(si, int(old)/experts)
			}
			pool[si] = simSlot{rec: r, last: clock, held: true}
			where[r] = si
			vs.take(si, layer)
		}
		for _, r := range step {
			if si := where[r]; si >= 0 {
				pool[si].held = false
			}
		}
		vs.touch(layer)
	}
	return hits, total, nil
}
