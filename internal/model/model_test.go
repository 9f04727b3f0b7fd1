package model

import (
	"math"
	"os"
	"testing"

	"github.com/sluicelm/sluice/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.Cleanup()
	os.Exit(code)
}

func load(t testing.TB, name string, bits int) *Model {
	t.Helper()
	m, err := Load(testutil.Packed(t, name, bits))
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewResidentProvider(m)
	if err != nil {
		t.Fatal(err)
	}
	m.Experts = p
	t.Cleanup(func() { m.Close() })
	return m
}

func argmax(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}

// logSoftmax in float64.
func logSoftmax(x []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - mx - math.Log(s)
	}
	return out
}

// TestConformance checks the exact (bf16) mode against transformers: argmax
// per position (a mismatch only where the reference's top two are within
// 1e-3), last-position logits within 1e-3.
func TestConformance(t *testing.T) {
	for _, name := range testutil.Models {
		t.Run(name, func(t *testing.T) {
			m := load(t, name, 16)
			refs := testutil.LoadRefs(t, name)
			r := NewRunner(m, 2, 64)
			defer r.Close()
			V := m.Config.Vocab
			for ci, c := range refs.Cases {
				st, err := m.NewState(len(c.Prompt))
				if err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(c.Prompt)*V)
				if err := r.Forward(st, c.Prompt, out, true); err != nil {
					t.Fatal(err)
				}
				for p := range c.Prompt {
					got := argmax(out[p*V : (p+1)*V])
					if got != c.Argmax[p] {
						lp := c.Top5Logprobs[p]
						if math.Abs(lp[0]-lp[1]) > 1e-3 {
							t.Errorf("case %d pos %d: argmax %d, want %d (ref top2 %v)", ci, p, got, c.Argmax[p], lp[:2])
						}
					}
				}
				last := out[(len(c.Prompt)-1)*V:]
				var worst float64
				for i, want := range c.LastLogits {
					worst = math.Max(worst, math.Abs(float64(last[i])-want))
				}
				if ci == 0 {
					t.Logf("case 0: last logits max abs diff %.2e", worst)
				}
				if worst > 1e-3 {
					t.Errorf("case %d: last logits differ by up to %g", ci, worst)
				}
			}
		})
	}
}
