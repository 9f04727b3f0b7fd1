package model

import (
	"slices"
	"testing"

	"github.com/sluicelm/sluice/internal/sample"
)

// lookSpy is a provider that reads ahead as deep as depth, recording each
// prediction and scoring it against the step of its layer.
type lookSpy struct {
	Provider
	depth       int
	pred        map[[2]int][]int // [layer, depth]: the last prediction
	hits, total [4]int           // [depth] predicted experts the layer chose, and all predicted
	calls       [5]int           // [depth] predictions passed
}

func (s *lookSpy) Lookahead() bool               { return true }
func (s *lookSpy) LookDepth() int                { return s.depth }
func (s *lookSpy) Prefetch(layer int, ids []int) { s.PrefetchAhead(layer, 1, ids) }
func (s *lookSpy) PrefetchAhead(l, d int, ids []int) {
	s.calls[min(d, len(s.calls)-1)]++
	s.pred[[2]int{l, d}] = slices.Clone(ids)
}

func (s *lookSpy) Begin(layer int, ids []int, hint Hint) error {
	for d := 1; d < len(s.total); d++ {
		k := [2]int{layer, d}
		for _, e := range s.pred[k] {
			s.total[d]++
			if slices.Contains(ids, e) {
				s.hits[d]++
			}
		}
		delete(s.pred, k)
	}
	return s.Provider.Begin(layer, ids, hint)
}

// TestLookaheadDepth: the forward predicts as many layers ahead as a
// DeepPrefetcher asks, each by the layer's own router, and what it
// predicts never changes the tokens. A prediction made by the wrong
// layer's router or norm would hold the chosen experts about as often as
// chance (top-k of E); the right ones hold most of them, less the further
// ahead they look.
func TestLookaheadDepth(t *testing.T) {
	for _, name := range []string{"tiny-qwen3-moe", "tiny-deepseek-v32"} {
		var want []int
		for _, depth := range []int{0, 1, 2, 3} {
			m := load(t, name, 4)
			var spy *lookSpy
			if depth > 0 {
				spy = &lookSpy{Provider: m.Experts, depth: depth, pred: map[[2]int][]int{}}
				m.Experts = spy
			}
			r := NewRunner(m, 2, 16)
			st, err := m.NewState(64)
			if err != nil {
				t.Fatal(err)
			}
			logits := make([]float32, m.Config.Vocab)
			toks := []int{1, 2, 3}
			var got []int
			for len(got) < 24 {
				if err := r.Forward(st, toks, logits, false); err != nil {
					t.Fatal(err)
				}
				toks = []int{sample.Argmax(logits)}
				got = append(got, toks[0])
			}
			r.Close()
			if depth == 0 {
				want = got
				continue
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s, depth %d: tokens %v, without lookahead %v", name, depth, got, want)
			}
			c := &m.Config
			chance := float64(c.TopK) / float64(c.Experts)
			for d := 1; d <= 3; d++ {
				if d > depth {
					if spy.calls[d] != 0 {
						t.Errorf("%s, depth %d: %d predictions %d layers ahead", name, depth, spy.calls[d], d)
					}
					continue
				}
				prec := float64(spy.hits[d]) / float64(max(spy.total[d], 1))
				t.Logf("%s: %d layers ahead, %d predictions, %.2f of the predicted experts chosen (chance %.2f)", name, d, spy.calls[d], prec, chance)
				if spy.calls[d] == 0 || prec < 5*chance {
					t.Errorf("%s, depth %d: %d predictions %d layers ahead, %.2f chosen (chance %.2f)", name, depth, spy.calls[d], d, prec, chance)
				}
			}
		}
	}
}
