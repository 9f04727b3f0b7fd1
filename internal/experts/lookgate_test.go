package experts

import (
	"math"
	"slices"
	"testing"
)

// TestLookGate: a rank's fetches stop once fewer than half of its would-be
// fetches have been used over the last several predictions, while the
// ranks that pay go on; a stopped rank is still scored and resumes once it
// would pay; another layer's step, or a step with no prediction, scores
// nothing; ranks past k share the last; resident experts and negative ids
// are no would-be fetch.
func TestLookGate(t *testing.T) {
	g := NewLookGate(3, 2, LookMinPrecision)
	all := func(int) bool { return true }
	// Rank 0 (expert 4) is used, rank 1 (expert 7) is not.
	step := func(layer int, used ...int) []int {
		on := slices.Clone(g.Predict(layer, []int{4, 7}, all))
		g.Score(layer, func(e int) bool { return slices.Contains(used, e) })
		return on
	}
	n := 0
	for g.On(1, 1) {
		if on := step(1, 4, 9); !slices.Contains(on, 4) {
			t.Fatalf("rank 0 of layer 1 stopped though it was used: fetched %v", on)
		}
		n++
		if n > 20 {
			t.Fatal("a useless rank never stopped")
		}
	}
	// 1·(7/8)^n first falls below one half at n = 6.
	if n != 6 || !g.On(1, 0) || !g.On(0, 1) || !g.On(2, 1) || !g.LayerOn(1) {
		t.Fatalf("stopped after %d useless predictions (want 6); on: rank 0 %v, layers 0 and 2 %v %v",
			n, g.On(1, 0), g.On(0, 1), g.On(2, 1))
	}
	if on := g.Predict(1, []int{4, 7}, all); !slices.Equal(on, []int{4}) || g.WouldFetch() != 2 {
		t.Fatalf("a stopped rank was fetched: %v of %d", on, g.WouldFetch())
	}
	g.Score(2, func(int) bool { return true }) // layer 2's step: not layer 1's prediction
	g.Score(1, func(int) bool { return true }) // the prediction was spent by the step above
	if g.On(1, 1) {
		t.Fatal("a step of another layer scored layer 1's prediction")
	}
	step(1, 4, 7)
	if !g.On(1, 1) {
		t.Fatalf("one useful prediction did not resume rank 1 (share %v)", g.Share(1, 1))
	}
	// A resident expert or a negative id is no would-be fetch and keeps
	// its rank's place; ranks past k share the last.
	w := NewLookGate(1, 4, LookMinPrecision)
	for range 200 {
		w.Predict(0, []int{1, -1, 2, 3, 5}, func(e int) bool { return e != 2 })
		w.Score(0, func(e int) bool { return e == 1 || e == 5 })
	}
	// Rank 0 (1) used, ranks 1 (-1) and 2 (resident 2) unscored, rank 3
	// holds 3 (unused) and 5 (used): half.
	half3 := math.Abs(float64(w.Share(0, 3))-0.5) < 1e-3
	if w.Share(0, 0) != 1 || w.Share(0, 1) != 1 || w.Share(0, 2) != 1 || !half3 || w.Share(0, 7) != w.Share(0, 3) {
		t.Errorf("shares by rank %v %v %v %v, past k %v; want 1 1 1 0.5, 0.5",
			w.Share(0, 0), w.Share(0, 1), w.Share(0, 2), w.Share(0, 3), w.Share(0, 7))
	}
	half := NewLookGate(1, 1, LookMinPrecision)
	for range 40 {
		half.Predict(0, []int{4, 7}, all)
		half.Score(0, func(e int) bool { return e == 4 }) // one of two used: the threshold
	}
	if !half.On(0, 0) {
		t.Errorf("a rank using half its predictions stopped (share %v)", half.Share(0, 0))
	}
	if g.LayerOn(3) || g.LayerOn(-1) || len(g.Predict(7, []int{1}, all)) != 0 {
		t.Error("a layer out of range is on, or recorded a prediction")
	}
}
