package experts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
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
