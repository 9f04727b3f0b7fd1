package experts

import (
	"testing"

	"github.com/sluicelm/sluice/internal/testutil"
)

// TestBeladyHand checks BeladyHits and SimulateHits on traces worked out
// by hand.
func TestBeladyHand(t *testing.T) {
	a, b, c, d := int32(0), int32(1), int32(2), int32(3)
	one := Trace{{a}, {b}, {c}, {a}, {b}, {d}, {a}, {b}}
	// MIN with 2 slots: c evicts b (a is needed sooner), b evicts c (never
	// again), d evicts b (a sooner): a hits twice. LRU always evicts the
	// record needed next: no hit.
	if h, n := BeladyHits(one, 2); h != 2 || n != 8 {
		t.Errorf("Belady: %d/%d hits, want 2/8", h, n)
	}
	if h, _, err := SimulateHits(one, 2, LRU, 1, 4); err != nil || h != 0 {
		t.Errorf("LRU: %d hits (%v), want 0", h, err)
	}
	// LRFU, one layer: a single use each until a's second, so the
	// oldest goes (c evicts a, a evicts b, b evicts c); then d evicts a
	// (one old and one newer use) rather than b (two newer ones), a
	// evicts d, and b hits.
	if h, _, err := SimulateHits(one, 2, LRFU, 1, 4); err != nil || h != 1 {
		t.Errorf("LRFU: %d hits (%v), want 1", h, err)
	}
	// Frequency: a's two uses keep it when c arrives; LRU drops it.
	freq := Trace{{a}, {a}, {b}, {c}, {a}}
	if h, _, _ := SimulateHits(freq, 2, LRFU, 1, 4); h != 2 {
		t.Errorf("LRFU, a used twice: %d hits, want 2", h)
	}
	if h, _, _ := SimulateHits(freq, 2, LRU, 1, 4); h != 1 {
		t.Errorf("LRU, a used twice: %d hits, want 1", h)
	}
	// Layer phase: 3 layers of 2 experts (record = 2·layer + expert),
	// one token using 0, 2, 4, the next 1, 3, 4. LRU evicts by step, so
	// layer 1 asking for 3 evicts 4, the oldest, which layer 2 wants next:
	// no hit. LRFU evicts 1 instead (layer 0, just used but a whole token
	// from its next turn), and 4 hits.
	phase := Trace{{0}, {2}, {4}, {1}, {3}, {4}}
	if h, _, _ := SimulateHits(phase, 2, LRU, 3, 2); h != 0 {
		t.Errorf("LRU, layer phase: %d hits, want 0", h)
	}
	if h, _, _ := SimulateHits(phase, 2, LRFU, 3, 2); h != 1 {
		t.Errorf("LRFU, layer phase: %d hits, want 1", h)
	}
	if _, _, err := SimulateHits(phase, 2, LRFU, 2, 2); err == nil {
		t.Error("record 4 of a 2-layer, 2-expert model accepted")
	}
	if _, _, err := SimulateHits(phase, 2, "mru", 3, 2); err == nil {
		t.Error("unknown policy accepted")
	}
	// A step's own records are never evicted to make room for each other.
	held := Trace{{a, b}, {c, d}, {a, b}}
	if h, _ := BeladyHits(held, 2); h != 0 {
		t.Errorf("Belady with held records: %d hits, want 0", h)
	}
	if h, _ := BeladyHits(held, 3); h != 1 {
		t.Errorf("Belady, 3 slots: %d hits, want 1", h)
	}
}

// TestAdaptiveLookahead: a layer whose predictions miss stops
// prefetching, one whose predictions hit keeps on, and the first resumes
// once its predictions improve (they are scored while paused too).
func TestAdaptiveLookahead(t *testing.T) {
	dir, man := testutil.PackedManifest(t, "tiny-qwen3-moe", 4)
	L, E := man.ExpertLayers, man.Experts
	if L < 3 {
		t.Skip("needs 3 expert layers")
	}
	s, err := Open(dir, man, Options{Slots: L * E / 4, Readers: 2, Lookahead: true, Policy: LRU, Prefetch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const K = 4
	route, wrong := lookRoutes(E, K)
	run := func(from, to int, goodOdd bool) {
		for tok := from; tok < to; tok++ {
			for l := 0; l < L; l++ {
				decodeStep(t, s, l, route(tok, l))
				if l+1 < L {
					pred := route(tok, l+1)
					if (l+1)%2 == 1 && !goodOdd {
						pred = wrong(pred)
					}
					s.Prefetch(l+1, pred)
				}
			}
		}
	}
	run(0, 30, false)
	if s.LookaheadOn(1) || !s.LookaheadOn(2) {
		t.Fatalf("after wrong predictions for layer 1: on(1) = %v, on(2) = %v; want false, true", s.LookaheadOn(1), s.LookaheadOn(2))
	}
	if s.Stats().LookSkip == 0 {
		t.Fatal("no prediction skipped")
	}
	run(30, 60, true)
	if !s.LookaheadOn(1) {
		t.Fatal("layer 1 did not resume once its predictions hit")
	}
}
