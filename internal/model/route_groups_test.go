package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/sluicelm/sluice/internal/block"
)

// TestRouteGroups checks DeepSeek's group-limited routing against a
// direct float64 transcription of DeepseekV32TopkRouter: sigmoid scores,
// choice = score + correction, groups ranked by their two best choices,
// the top-k choices inside the kept groups, weights = scores renormalised
// and scaled.
func TestRouteGroups(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	const E, K, G, TG = 64, 6, 8, 3
	m := &block.MoE{Score: block.SigmoidGroups, NormTopK: true, Groups: G, TopGroups: TG, Scale: 2.5,
		Correction: make([]float32, E)}
	for e := range m.Correction {
		m.Correction[e] = float32(rng.NormFloat64() * 0.1)
	}
	for trial := 0; trial < 200; trial++ {
		logits := make([]float32, E)
		for e := range logits {
			logits[e] = float32(rng.NormFloat64() * 2)
		}
		// The reference.
		sc := make([]float64, E)
		ch := make([]float64, E)
		for e, x := range logits {
			sc[e] = 1 / (1 + math.Exp(-float64(x)))
			ch[e] = sc[e] + float64(m.Correction[e])
		}
		type gs struct {
			g int
			s float64
		}
		var groups []gs
		for g := 0; g < G; g++ {
			v := slices.Clone(ch[g*E/G : (g+1)*E/G])
			sort.Sort(sort.Reverse(sort.Float64Slice(v)))
			groups = append(groups, gs{g, v[0] + v[1]})
		}
		sort.SliceStable(groups, func(a, b int) bool { return groups[a].s > groups[b].s })
		var cand []int
		for _, g := range groups[:TG] {
			for e := g.g * E / G; e < (g.g+1)*E/G; e++ {
				cand = append(cand, e)
			}
		}
		sort.SliceStable(cand, func(a, b int) bool {
			if ch[cand[a]] != ch[cand[b]] {
				return ch[cand[a]] > ch[cand[b]]
			}
			return cand[a] < cand[b]
		})
		want := cand[:K]
		var sum float64
		for _, e := range want {
			sum += sc[e]
		}

		ids, w := make([]int, K), make([]float32, K)
		RouteGroups(m, logits, make([]float32, E), ids, w)
		if !slices.Equal(ids, want) {
			t.Fatalf("trial %d: experts %v, want %v", trial, ids, want)
		}
		for k, e := range want {
			if wk := sc[e] / sum * 2.5; math.Abs(float64(w[k])-wk) > 1e-5 {
				t.Fatalf("trial %d: weight %d = %v, want %v", trial, k, w[k], wk)
			}
		}
	}
}

// TestTopK checks the indexer's selection against a full sort (score
// descending, the lower position first on ties), ties included.
func TestTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 4))
	for trial := 0; trial < 100; trial++ {
		n, k := 1+rng.IntN(300), 1+rng.IntN(64)
		if k > n {
			k = n
		}
		sc := make([]float32, n)
		for i := range sc {
			sc[i] = float32(rng.IntN(20)) // many ties
		}
		ord := make([]int, n)
		for i := range ord {
			ord[i] = i
		}
		sort.SliceStable(ord, func(a, b int) bool { return sc[ord[a]] > sc[ord[b]] })
		want := slices.Clone(ord[:k])
		slices.Sort(want)
		got := make([]int, k)
		TopK(got, sc, make([]int, k))
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("n %d k %d: %v, want %v", n, k, got, want)
		}
	}
}
