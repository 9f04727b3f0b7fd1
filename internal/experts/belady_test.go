package experts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/model"
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
	if h, _ := SimulateHits(one, 2, LRU, 1); h != 0 {
		t.Errorf("LRU: %d hits, want 0", h)
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

// TestBeladyRecorded compares the optimum with LRU and FLRU on the routes
// the shared tiny Qwen3.5 model chose on a long prompt: the optimum must
// hit at least as often as either, and with room for every record only
// the first request of each misses. The table it logs (-v) shows how far
// each policy is from the optimum.
func TestBeladyRecorded(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "refs", "tiny-qwen3-5-moe.json"))
	if err != nil {
		t.Skip("no shared refs:", err)
	}
	var r struct {
		Routes [][][]int `json:"routes_long0"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Routes) == 0 {
		t.Fatalf("routes_long0: %v", err)
	}
	const E = 64
	L, P := len(r.Routes), len(r.Routes[0])
	var tr Trace
	distinct := map[int32]bool{}
	for p := 0; p < P; p++ {
		for l := 0; l < L; l++ {
			var step []int32
			for _, e := range r.Routes[l][p] {
				step = append(step, int32(l*E+e))
				distinct[int32(l*E+e)] = true
			}
			tr = append(tr, step)
		}
	}
	for _, share := range []int{10, 25, 50, 100} {
		slots := L * E * share / 100
		bh, n := BeladyHits(tr, slots)
		lh, _ := SimulateHits(tr, slots, LRU, L)
		fh, _ := SimulateHits(tr, slots, FLRU, L)
		t.Logf("pool %3d%% (%3d slots): optimum %.1f%%  lru %.1f%%  flru %.1f%% hits of %d", share, slots,
			100*float64(bh)/float64(n), 100*float64(lh)/float64(n), 100*float64(fh)/float64(n), n)
		if bh < lh || bh < fh {
			t.Errorf("pool %d%%: optimum %d hits, below lru %d or flru %d", share, bh, lh, fh)
		}
		if share == 100 && (bh != n-len(distinct) || lh != bh || fh != bh) {
			t.Errorf("pool of every record: %d, %d, %d hits, want %d (all but first uses)", bh, lh, fh, n-len(distinct))
		}
	}
}

// TestAdaptiveLookahead: a layer whose predictions miss stops
// prefetching, one whose predictions hit keeps on, and the first resumes
// once its predictions improve (they are scored while paused too).
func TestAdaptiveLookahead(t *testing.T) {
	dir := testutil.Packed(t, "tiny-qwen3-moe", 4)
	man, err := format.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
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
	route := func(tok, l int) []int { // a different set every token
		ids := make([]int, K)
		for k := range ids {
			ids[k] = (tok*K*3 + l*7 + k) % E
		}
		return ids
	}
	wrong := func(ids []int) []int {
		w := make([]int, len(ids))
		for k, e := range ids {
			w[k] = (e + E/2) % E
		}
		return w
	}
	run := func(from, to int, goodOdd bool) {
		for tok := from; tok < to; tok++ {
			for l := 0; l < L; l++ {
				if err := s.Begin(l, route(tok, l), model.Hint{}); err != nil {
					t.Fatal(err)
				}
				for range K {
					if _, _, err := s.Next(); err != nil {
						t.Fatal(err)
					}
				}
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
