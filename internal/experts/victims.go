package experts

import "math/bits"

// victimSet finds the slot a new record takes without scoring every slot on
// every miss. Scoring them all cost a streamed decode of the 40-layer
// qwen3.5-35b-a3b synth at a 22% pool (2311 slots, some 250 misses and
// prefetches a token) about 10 ms a token on the forward's own thread: each
// score reads a slot and its policy state that the step's expert bytes
// have pushed out of the caches. A score is a base that depends on the
// record (evictor.base) times a scale shared by its layer (evictor.scale),
// so each layer's lowest-base slot stays the layer's candidate until one
// of its slots or the policy's view of the layer changes; a miss then
// compares the layers' candidates and rescans only the layers that
// changed.
//
// The order is the score, then the base, then the slot: the same as
// scoring every slot (lowest score, ties to the lowest slot) except where
// two different bases round to the same score, which the base then
// decides. A free slot goes first, the lowest.
type victimSet struct {
	free  []uint64  // bit i: slot i is free
	lists [][]int32 // [layer] the slots holding or reading one of the layer's records
	pos   []int32   // [slot] its index in its layer's list, -1 when free
	cand  []int32   // [layer] the layer's evictable slot of lowest (base, slot), -1 for none
	base  []float64 // [layer] cand's base
	dirty []bool    // [layer] cand is to be found again
}

func newVictimSet(slots, layers int) victimSet {
	v := victimSet{free: make([]uint64, (slots+63)/64), lists: make([][]int32, layers),
		pos: make([]int32, slots), cand: make([]int32, layers), base: make([]float64, layers), dirty: make([]bool, layers)}
	for i := range v.pos {
		v.pos[i] = -1
		v.free[i/64] |= 1 << (i % 64)
	}
	for l := range v.dirty {
		v.dirty[l] = true
	}
	return v
}

// take records that slot si now holds or reads a record of layer.
func (v *victimSet) take(si int32, layer int) {
	v.free[si/64] &^= 1 << (si % 64)
	v.pos[si] = int32(len(v.lists[layer]))
	v.lists[layer] = append(v.lists[layer], si)
	v.dirty[layer] = true
}

// drop records that slot si, which held a record of layer, is free.
func (v *victimSet) drop(si int32, layer int) {
	l := v.lists[layer]
	p := v.pos[si]
	last := l[len(l)-1]
	l[p], v.pos[last] = last, p
	v.lists[layer] = l[:len(l)-1]
	v.pos[si] = -1
	v.free[si/64] |= 1 << (si % 64)
	v.dirty[layer] = true
}

// touch says that a slot of layer changed what the policy sees of it (held,
// loading or ready, prefetched, its last use).
func (v *victimSet) touch(layer int) { v.dirty[layer] = true }

// pick returns the lowest free slot, else the evictable slot of lowest
// (score, base, slot) under ev; -1 when there is none. slot reports a
// slot's record, last use and prefetch mark, and whether it may be
// evicted.
func (v *victimSet) pick(ev *evictor, slot func(si int32) (rec int32, last int64, pre, ok bool)) int32 {
	if si := v.nextFree(-1); si >= 0 {
		return si
	}
	return v.evict(ev, slot)
}

// nextFree returns the lowest free slot above after, or -1.
func (v *victimSet) nextFree(after int32) int32 {
	i := int(after) + 1
	for w := i / 64; w < len(v.free); w++ {
		b := v.free[w]
		if w == i/64 {
			b &^= 1<<(i%64) - 1
		}
		if b != 0 {
			return int32(w*64 + bits.TrailingZeros64(b))
		}
	}
	return -1
}

// evict is pick among the slots that hold a record.
func (v *victimSet) evict(ev *evictor, slot func(si int32) (rec int32, last int64, pre, ok bool)) int32 {
	ev.prepare()
	if ev.all {
		for l := range v.dirty {
			v.dirty[l] = true
		}
		ev.all = false
	}
	for l, c := range ev.changed {
		if c {
			v.dirty[l] = true
			ev.changed[l] = false
		}
	}
	best, bestL := int32(-1), -1
	var bestScore float64
	for l := range v.lists {
		if c := v.cand[l]; !v.dirty[l] && c >= 0 {
			// A change this set was not told of would cost no more than
			// a rescan; evicting a slot the step holds would be wrong.
			rec, last, pre, ok := slot(c)
			v.dirty[l] = !ok || ev.base(rec, last, pre) != v.base[l]
		}
		if v.dirty[l] {
			v.dirty[l] = false
			v.cand[l] = -1
			for _, si := range v.lists[l] {
				rec, last, pre, ok := slot(si)
				if !ok {
					continue
				}
				b := ev.base(rec, last, pre)
				if c := v.cand[l]; c < 0 || b < v.base[l] || b == v.base[l] && si < c {
					v.cand[l], v.base[l] = si, b
				}
			}
		}
		c := v.cand[l]
		if c < 0 {
			continue
		}
		sc := float64(v.base[l] * ev.layerScale(l))
		if best < 0 || sc < bestScore || sc == bestScore && (v.base[l] < v.base[bestL] || v.base[l] == v.base[bestL] && c < best) {
			best, bestL, bestScore = c, l, sc
		}
	}
	return best
}

// Victims is the pool's victim search (see Stream) for a pool kept
// outside this package, driven by an Evictor: the GPU's. Take and Drop
// follow which layer's record each slot holds, Touch says a slot of the
// layer changed what the policy sees of it (held or released, its last
// use), and the Evictor's own changes are followed by itself.
type Victims struct{ v victimSet }

// NewVictims returns the search for slots slots, all free, of a model of
// layers expert layers.
func NewVictims(slots, layers int) *Victims { return &Victims{newVictimSet(slots, layers)} }

// Take records that slot now holds a record of layer.
func (x *Victims) Take(slot int32, layer int) { x.v.take(slot, layer) }

// Drop records that slot, which held a record of layer, is free.
func (x *Victims) Drop(slot int32, layer int) { x.v.drop(slot, layer) }

// Touch says that a slot of layer was held, released or used.
func (x *Victims) Touch(layer int) { x.v.touch(layer) }

// NextFree returns the lowest free slot above after (-1: from the first),
// or -1.
func (x *Victims) NextFree(after int32) int32 { return x.v.nextFree(after) }

// Evict returns the slot, among those holding a record that slot reports
// evictable, of the lowest score under e (Evictor.Score), ties to the
// lower base, then the lower slot; -1 when there is none.
func (x *Victims) Evict(e *Evictor, slot func(si int32) (rec int32, last int64, ok bool)) int32 {
	return x.v.evict(&e.v, func(si int32) (int32, int64, bool, bool) {
		rec, last, ok := slot(si)
		return rec, last, false, ok
	})
}
