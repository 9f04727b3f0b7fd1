package experts

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/testutil"
)

// scanHits is simulate without an oracle as the pool evicted before
// victimSet: every slot scored on every miss, the lowest free slot first,
// else the lowest score, ties to the lowest slot.
func scanHits(tr Trace, slots int, p Policy, layers, experts int) (hits int) {
	pool, where := simPool(slots, layers*experts)
	ev := newEvictor(p, layers, experts)
	var clock int64
	for _, step := range tr {
		layer := int(step[0]) / experts
		clock++
		ev.tick(clock, layer, 1)
		var miss []int32
		for _, r := range step {
			ev.use(r, 1, true)
			if si := where[r]; si >= 0 {
				hits++
				pool[si].last, pool[si].held = clock, true
				continue
			}
			miss = append(miss, r)
		}
		for _, r := range miss {
			if where[r] >= 0 {
				continue
			}
			si := -1
			var best float64
			for j := range pool {
				sl := &pool[j]
				if sl.rec < 0 {
					si = j
					break
				}
				if sl.held {
					continue
				}
				if sc := ev.score(sl.rec, sl.last, false); si < 0 || sc < best {
					si, best = j, sc
				}
			}
			if si < 0 {
				continue
			}
			if old := pool[si].rec; old >= 0 {
				where[old] = -1
			}
			pool[si] = simSlot{rec: r, last: clock, held: true}
			where[r] = int32(si)
		}
		for _, r := range step {
			if si := where[r]; si >= 0 {
				pool[si].held = false
			}
		}
	}
	return hits
}

// TestVictimSetMatchesScan requires the replay, which finds victims
// through victimSet (the pool's search), to hit exactly as scoring every
// slot on every miss does, under every policy, on the recorded decodes
// at five pool sizes and on random skewed routes with a step's experts
// repeated (a record asked for twice). Comparing the layers' candidates
// without their layers' scales fails it, and so does keeping a layer's
// candidate after the policy's estimates for the layer changed (without
// the policy's change flags and the check of the candidate's base).
func TestVictimSetMatchesScan(t *testing.T) {
	traces := routeTraces(t)
	rng := rand.New(rand.NewPCG(3, 5))
	const L, E, K = 5, 32, 4
	var tr Trace
	for range 300 * L {
		l := len(tr) % L
		step := make([]int32, K)
		for k := range step {
			e := int(float64(E) * rng.Float64() * rng.Float64()) // skewed to the low experts
			step[k] = int32(l*E + e)
		}
		tr = append(tr, step)
	}
	traces = append(traces, routeTrace{name: "random", L: L, E: E, K: K, tr: tr})
	for _, x := range traces {
		if x.L*x.E > 4096 {
			continue // the synths' 10,240 records: slow to scan, and the tiny models' routes
		}
		for _, share := range []int{3, 10, 25, 50} {
			slots := max(x.L*x.E*share/100, x.K)
			for _, p := range Policies {
				want := scanHits(x.tr, slots, p, x.L, x.E)
				got, _, err := SimulateHits(x.tr, slots, p, x.L, x.E)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("%s, %d slots, %s: %d hits through victimSet, %d scoring every slot", x.name, slots, p, got, want)
				}
			}
		}
	}
}

// TestVictimSetDrop checks the set's bookkeeping on its own: slots taken
// and dropped in any order come back free lowest first, and a layer with
// no evictable slot offers none.
func TestVictimSetDrop(t *testing.T) {
	ev := newEvictor(LRU, 2, 4)
	v := newVictimSet(5, 2)
	last := []int64{5, 3, 9, 1, 7}
	held := make([]bool, 5)
	slot := func(si int32) (int32, int64, bool, bool) { return si, last[si], false, !held[si] }
	for si := range int32(5) {
		if got := v.pick(&ev, slot); got != si {
			t.Fatalf("free slot %d, want %d", got, si)
		}
		v.take(si, int(si)%2)
	}
	if got := v.pick(&ev, slot); got != 3 {
		t.Fatalf("victim %d, want 3 (last use 1)", got)
	}
	held[3] = true
	v.touch(1)
	if got := v.pick(&ev, slot); got != 1 {
		t.Fatalf("victim %d with 3 held, want 1 (last use 3)", got)
	}
	v.drop(2, 0)
	v.drop(0, 0)
	if got := v.pick(&ev, slot); got != 0 {
		t.Fatalf("after drops: %d, want the lowest free slot 0", got)
	}
	v.take(0, 0)
	v.take(2, 0)
	held = []bool{true, true, true, true, true}
	for l := range 2 {
		v.touch(l)
	}
	if got := v.pick(&ev, slot); got != -1 {
		t.Fatalf("every slot held: %d, want -1", got)
	}
}

// TestStreamVictims drives a pool through a recorded decode the ways a
// forward does (fewer readers than a step's experts, so that later misses
// recycle slots the step released; the next layer's experts prefetched,
// with wrong guesses among them, some left unused and cancelled) and
// checks every victim it picks against scoring every slot: a free slot
// while one is free, else one of the lowest score. Not telling the victim
// set that a read landed (the touch in complete) leaves a stale candidate
// and fails it; the other touches are also covered by the policy's change
// flags of the step's layer or concern slots too recently used to be
// chosen, so leaving one of them out changes no victim here.
func TestStreamVictims(t *testing.T) {
	const name = "tiny-qwen3-5-moe"
	r := testutil.LoadRefs(t, name)
	if len(r.Routes) == 0 {
		t.Skip("no recorded routes")
	}
	dir, man := testutil.PackedManifest(t, name, 4)
	L, E, K := man.ExpertLayers, man.Experts, man.Config.TopK
	tr := stepsFrom(r.Routes, E, len(r.Routes[0])-60)
	var checked int
	victimCheck = func(s *Stream, got int32) {
		want, wantScore := int32(-1), 0.0
		for i := range s.slots {
			sl := &s.slots[i]
			if sl.state == free {
				want = int32(i)
				break
			}
			if sl.held || sl.state != ready {
				continue
			}
			if sc := s.ev.score(sl.rec, sl.last, sl.pre); want < 0 || sc < wantScore {
				want, wantScore = int32(i), sc
			}
		}
		checked++
		switch {
		case got == want:
		case got < 0 || want < 0 || s.slots[want].state == free:
			t.Fatalf("victim %d, want %d", got, want)
		default:
			sl := &s.slots[got]
			if sl.held || sl.state != ready || s.ev.score(sl.rec, sl.last, sl.pre) != wantScore {
				t.Fatalf("victim %d (score %v), want %d (score %v)", got, s.ev.score(sl.rec, sl.last, sl.pre), want, wantScore)
			}
		}
	}
	defer func() { victimCheck = nil }()
	rng := rand.New(rand.NewPCG(9, 9))
	for _, p := range Policies {
		s, err := Open(dir, man, Options{Slots: L * E / 10, Readers: 2, Policy: p, Lookahead: true, Prefetch: 3})
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int, 0, K)
		for i, step := range tr {
			ids = ids[:0]
			for _, rec := range step {
				ids = append(ids, int(rec)%E)
			}
			layer := int(step[0]) / E
			if err := s.Begin(layer, ids, model.Hint{}); err != nil {
				t.Fatal(err)
			}
			if i+1 < len(tr) && int(tr[i+1][0])/E == layer+1 {
				var next []int
				for _, rec := range tr[i+1] {
					if rng.IntN(3) == 0 {
						next = append(next, rng.IntN(E)) // a wrong guess, most likely
					} else {
						next = append(next, int(rec)%E)
					}
				}
				s.Prefetch(layer+1, next)
			}
			for range ids {
				if _, _, err := s.Next(); err != nil {
					t.Fatal(err)
				}
			}
		}
		s.Close()
	}
	if checked == 0 {
		t.Fatal("no victim picked")
	}
}
