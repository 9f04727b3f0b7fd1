package experts

import (
	"strings"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
	"github.com/sluicelm/sluice/internal/testutil"
)

// TestLookDepth drives a stream through decode steps whose routes change
// every token, with predictions one layer ahead (Prefetch) and two layers
// ahead (PrefetchAhead). A prefetch two layers ahead must wait through the
// step between (not be counted wasted or cancelled there) and count as
// useful at its own layer's step; its gate must stop a layer whose
// predictions miss and keep one whose predictions hit.
func TestLookDepth(t *testing.T) {
	dir, man, route, wrong := lookModel(t)
	L, E := man.ExpertLayers, man.Experts
	// run decodes tokens [from, to). Only the predictions two layers
	// ahead are made (depth 1 predicts nothing), so every useful
	// prefetch is one of theirs; those for layer 2 are wrong when
	// badLayer2 is set.
	run := func(s *Stream, from, to int, badLayer2 bool) {
		for tok := from; tok < to; tok++ {
			for l := 0; l < L; l++ {
				decodeStep(t, s, l, route(tok, l))
				if l+2 < L {
					pred := route(tok, l+2)
					if badLayer2 && l+2 == 2 {
						pred = wrong(pred)
					}
					s.PrefetchAhead(l+2, 2, pred)
					s.PrefetchAhead(l+2, 3, pred) // beyond the depth: reads nothing
				}
			}
		}
	}
	open := func(depth int) *Stream {
		s, err := Open(dir, man, Options{Slots: L * E / 2, Readers: 2, Lookahead: true, LookDepth: depth, Policy: LRU, Prefetch: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}

	s := open(2)
	run(s, 0, 20, false)
	st := s.Stats()
	if st.LookIssued == 0 || st.LookWasted != 0 || st.LookUseful != st.LookIssued {
		t.Fatalf("right predictions two layers ahead: issued %d, useful %d, wasted %d; want every one useful",
			st.LookIssued, st.LookUseful, st.LookWasted)
	}
	if st.AheadIssued != st.LookIssued || st.AheadUseful != st.LookUseful {
		t.Fatalf("predictions two layers ahead only: %d issued and %d useful counted as ahead, of %d and %d", st.AheadIssued, st.AheadUseful, st.LookIssued, st.LookUseful)
	}

	s = open(2)
	run(s, 0, 30, true)
	even := s.ahead[0][0] // depth 2's gate of the even layers
	if even.LayerOn(2) {
		t.Fatal("layer 2's wrong predictions two ahead are still read")
	}
	if L > 4 && !even.LayerOn(4) {
		t.Fatal("layer 4's right predictions two ahead were stopped")
	}
	if !s.ahead[0][1].LayerOn(3) {
		t.Fatal("layer 3's right predictions two ahead were stopped")
	}
	if st := s.Stats(); st.LookWasted == 0 || st.LookSkip == 0 || st.AheadWasted != st.LookWasted || st.AheadSkip != st.LookSkip {
		t.Fatalf("wrong predictions: wasted %d, skipped %d (as ahead: %d, %d); want both counted, all as ahead",
			st.LookWasted, st.LookSkip, st.AheadWasted, st.AheadSkip)
	}
	run(s, 30, 60, false)
	if !s.ahead[0][0].LayerOn(2) {
		t.Fatal("layer 2 did not resume once its predictions two ahead hit")
	}

	// Depth 1 takes no predictions two ahead.
	s = open(1)
	run(s, 0, 5, false)
	if st := s.Stats(); st.LookIssued != 0 || st.AheadIssued != 0 {
		t.Fatalf("depth 1: %d prefetches issued two layers ahead (%d counted as ahead)", st.LookIssued, st.AheadIssued)
	}

	// The next layer's predictions are not counted as ahead, wrong ones
	// included.
	s = open(2)
	for tok := range 20 {
		for l := 0; l < L; l++ {
			decodeStep(t, s, l, route(tok, l))
			if l+1 < L {
				pred := route(tok, l+1)
				if tok%4 != 0 { // wrong often enough that the gate skips
					pred = wrong(pred)
				}
				s.Prefetch(l+1, pred)
			}
		}
	}
	if st := s.Stats(); st.LookUseful == 0 || st.LookWasted == 0 || st.LookSkip == 0 || st.AheadIssued+st.AheadUseful+st.AheadWasted+st.AheadSkip != 0 {
		t.Fatalf("next layer's predictions: useful %d, wasted %d, skipped %d; counted as ahead: issued %d, useful %d, wasted %d, skipped %d; want none",
			st.LookUseful, st.LookWasted, st.LookSkip, st.AheadIssued, st.AheadUseful, st.AheadWasted, st.AheadSkip)
	}
	for _, d := range []int{-1, MaxLookDepth + 1} {
		if _, err := Open(dir, man, Options{Slots: L * E / 2, Lookahead: true, LookDepth: d}); err == nil || !strings.Contains(err.Error(), "lookahead depth") {
			t.Errorf("depth %d: got %v, want an error naming the lookahead depth", d, err)
		}
	}
}

// lookK is the experts a token's layer chooses in the lookahead tests.
const lookK = 4

// lookModel returns the lookahead tests' packed model (tiny-qwen3-moe at
// 4 bits; the test is skipped where it has fewer than 4 expert layers)
// and lookRoutes' routes over its experts, lookK a step.
func lookModel(t *testing.T) (dir string, man *format.Manifest, route func(tok, l int) []int, wrong func(ids []int) []int) {
	t.Helper()
	dir, man = testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	if man.ExpertLayers < 4 {
		t.Skip("needs 4 expert layers")
	}
	route, wrong = lookRoutes(man.Experts, lookK)
	return dir, man, route, wrong
}

// lookRoutes returns the lookahead tests' routes: route gives K experts of
// E for a token's layer, a different set every token, and wrong the
// experts half the layer away from each of a set, none of which route
// chose for it when E is at least 2K.
func lookRoutes(E, K int) (route func(tok, l int) []int, wrong func(ids []int) []int) {
	route = func(tok, l int) []int {
		ids := make([]int, K)
		for k := range ids {
			ids[k] = (tok*K*3 + l*7 + k) % E
		}
		return ids
	}
	wrong = func(ids []int) []int {
		w := make([]int, len(ids))
		for k, e := range ids {
			w[k] = (e + E/2) % E
		}
		return w
	}
	return route, wrong
}

// decodeStep runs one decode step of layer l through s: Begin with ids,
// then every expert taken.
func decodeStep(t *testing.T, s *Stream, l int, ids []int) {
	t.Helper()
	if err := s.Begin(l, ids, model.Hint{}); err != nil {
		t.Fatal(err)
	}
	for range ids {
		if _, _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPrefsListedOnce: a slot that a prediction two layers ahead filled,
// taken by another prediction before its layer came, is listed once
// among the prefetches still to settle (Stream.prefs), and every slot
// holding an unused prefetch is listed. A pool of two steps' experts
// makes the predictions evict each other's slots.
func TestPrefsListedOnce(t *testing.T) {
	dir, man, route, wrong := lookModel(t)
	L := man.ExpertLayers
	s, err := Open(dir, man, Options{Slots: 2 * lookK, Readers: 1, Lookahead: true, LookDepth: 2, Policy: LRU, Prefetch: 2 * lookK})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// settle lands every read in flight, so that its slot can be evicted.
	settle := func() {
		for s.inflight > 0 {
			c, _, err := s.finished(true)
			if err == nil {
				err = s.complete(c)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	retaken := 0
	for tok := range 12 {
		for l := 0; l < L; l++ {
			decodeStep(t, s, l, route(tok, l))
			settle()
			// The records the listed slots held before this step's
			// predictions.
			before := map[int32]int32{}
			for _, si := range s.prefs {
				before[si] = s.slots[si].rec
			}
			for d := 2; d >= 1; d-- {
				if l+d < L {
					// Wrong every other token, so that some stay unused.
					pred := route(tok, l+d)
					if tok%2 == 1 {
						pred = wrong(pred)
					}
					s.PrefetchAhead(l+d, d, pred)
					settle()
				}
			}
			seen := map[int32]bool{}
			for _, si := range s.prefs {
				if seen[si] {
					t.Fatalf("token %d, layer %d: slot %d listed twice among the prefetches %v", tok, l, si, s.prefs)
				}
				seen[si] = true
				if rec, ok := before[si]; ok && s.slots[si].pre && s.slots[si].rec != rec {
					retaken++
				}
			}
			for si := range s.slots {
				if sl := &s.slots[si]; sl.pre && !seen[int32(si)] {
					t.Fatalf("token %d, layer %d: slot %d holds an unused prefetch but is not listed", tok, l, si)
				}
			}
		}
	}
	if retaken == 0 {
		t.Fatal("no listed slot was taken by a later prediction: the test does not reach the case")
	}
}
