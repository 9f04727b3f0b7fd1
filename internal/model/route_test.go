package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// routeRef is the definition Route implements: k times, the largest
// probability not yet taken, the lowest id among equals.
func routeRef(probs []float32, k int) ([]int, []float32) {
	var ids []int
	var w []float32
	for j := 0; j < k; j++ {
		best := -1
		for e, p := range probs {
			if !slices.Contains(ids, e) && (best < 0 || p > probs[best]) {
				best = e
			}
		}
		ids, w = append(ids, best), append(w, probs[best])
	}
	return ids, w
}

func TestRoute(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 2000; trial++ {
		E := 1 + rng.IntN(80)
		k := 1 + rng.IntN(min(E, 10))
		probs := make([]float32, E)
		for i := range probs {
			// Few distinct values, so ties are common.
			probs[i] = float32(rng.IntN(6)) / 8
		}
		wantIDs, wantW := routeRef(probs, k)
		ids, w := make([]int, k), make([]float32, k)
		Route(probs, k, false, ids, w)
		if !slices.Equal(ids, wantIDs) || !slices.Equal(w, wantW) {
			t.Fatalf("probs %v k %d: got %v %v, want %v %v", probs, k, ids, w, wantIDs, wantW)
		}
	}
}

// TestRouteNaN: NaN probabilities (a corrupt model's) still give k
// distinct ids in range, whether every value is NaN or some are, so that
// the experts a row addresses exist; the logits then come out NaN and the
// decode refuses them (the GPU's routers answer to the same test).
func TestRouteNaN(t *testing.T) {
	nan := float32(math.NaN())
	rng := rand.New(rand.NewPCG(9, 10))
	for trial := 0; trial < 500; trial++ {
		E := 2 + rng.IntN(80)
		k := 1 + rng.IntN(min(E, 10))
		probs := make([]float32, E)
		for i := range probs {
			probs[i] = rng.Float32()
			if trial%2 == 0 || rng.IntN(4) == 0 {
				probs[i] = nan
			}
		}
		ids, w := make([]int, k), make([]float32, k)
		Route(probs, k, trial%3 == 0, ids, w)
		seen := map[int]bool{}
		for _, id := range ids {
			if id < 0 || id >= E || seen[id] {
				t.Fatalf("probs %v k %d: ids %v, want %d distinct in [0,%d)", probs, k, ids, k, E)
			}
			seen[id] = true
		}
	}
}
